from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants"

    def ready(self) -> None:
        # Here, once the app registry is ready: the OpenAPI auth extension registers
        # itself, and nodes reads the allowlist (its probe image is one of its images)
        # through a hook, since nodes never imports tenants.
        from nodes.allowlist import register_allowlist  # noqa: PLC0415

        from . import schema  # noqa: F401, PLC0415
        from .selectors import image_allowlist  # noqa: PLC0415

        register_allowlist(image_allowlist)

from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants"

    def ready(self) -> None:
        # Registers the OpenAPI auth extension; here, once the app registry is ready.
        from . import schema  # noqa: F401, PLC0415

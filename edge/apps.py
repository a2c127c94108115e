from django.apps import AppConfig


class EdgeConfig(AppConfig):
    name = "edge"
    verbose_name = "Web terminal and port addresses"
    default_auto_field = "django.db.models.BigAutoField"

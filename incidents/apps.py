from django.apps import AppConfig


class IncidentsConfig(AppConfig):
    name = "incidents"
    verbose_name = "Incidents"

    def ready(self) -> None:
        from nodes.hooks import register_sample_hook

        from .services import watch_batch

        # The watchdog reads every stored batch in the telemetry worker, right after it
        # commits: detection within one sampling interval.
        register_sample_hook(watch_batch)

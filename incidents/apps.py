from django.apps import AppConfig


class IncidentsConfig(AppConfig):
    name = "incidents"
    verbose_name = "Incidents"

    def ready(self) -> None:
        # Here, not at the top: AppConfig modules load before the models they would import.
        from nodes.hooks import register_agent_hook, register_sample_hook  # noqa: PLC0415
        from nodes.warning_line import set_warning_line_reader  # noqa: PLC0415

        from .hooks import agent_report_hook, watchdog_sample_hook  # noqa: PLC0415
        from .selectors import vram_warning_pct  # noqa: PLC0415

        # The watchdog reads every stored batch in the telemetry worker, right after it
        # commits: detection within one sampling interval.
        register_sample_hook(watchdog_sample_hook)
        # What node agents report (a container stopped, a neighbour harmed) is filed as
        # soon as the platform pulls it, every few seconds.
        register_agent_hook(agent_report_hook)
        # The fleet page marks cards against the line the watchdog warns at.
        set_warning_line_reader(vram_warning_pct)

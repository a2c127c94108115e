from django.urls import URLPattern, path

from . import views

app_name = "incidents"


def _action(name: str) -> URLPattern:
    slug = name.replace("_", "-")
    return path(
        f"ops/incidents/<int:pk>/{slug}/",
        views.ops_incident_action,
        {"action": name},
        name=f"ops_incident_{name}",
    )


urlpatterns = [
    path("ops/incidents/", views.ops_incidents, name="ops_incidents"),
    path("ops/incidents/export.csv", views.ops_incidents_export, name="ops_incidents_export"),
    path(
        "ops/incidents/acknowledge/",
        views.ops_incidents_acknowledge,
        name="ops_incidents_acknowledge",
    ),
    path("ops/incidents/kpis/", views.ops_kpis, name="ops_kpis"),
    path("ops/incidents/<int:pk>/", views.ops_incident, name="ops_incident"),
    *(_action(name) for name in views.ACTIONS),
    path("ops/watchdog/", views.ops_watchdog, name="ops_watchdog"),
    # tenant members: incidents about their own slices
    path("incidents/", views.incident_list, name="incident_list"),
    path("incidents/<int:pk>/", views.incident_detail, name="incident_detail"),
]

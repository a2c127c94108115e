from django.urls import path

from . import views

app_name = "nodes"

urlpatterns = [
    path("ops/fleet/", views.fleet, name="fleet"),
    path("ops/fleet/policy/", views.policy, name="policy"),
    path("ops/fleet/policy/<int:pk>/ratio/", views.policy_ratio, name="policy_ratio"),
    path("ops/fleet/policy/<int:pk>/accepting/", views.policy_accepting, name="policy_accepting"),
    path("ops/nodes/new/", views.node_create, name="node_create"),
    path("ops/nodes/<int:pk>/", views.node_detail, name="node_detail"),
    path("ops/nodes/<int:pk>/drain/", views.node_action, {"action": "drain"}, name="node_drain"),
    path(
        "ops/nodes/<int:pk>/undrain/", views.node_action, {"action": "undrain"}, name="node_undrain"
    ),
    path(
        "ops/nodes/<int:pk>/approve-host-key/",
        views.node_action,
        {"action": "approve"},
        name="node_approve",
    ),
    path("ops/nodes/<int:pk>/rescan/", views.node_action, {"action": "rescan"}, name="node_rescan"),
    path(
        "ops/nodes/<int:pk>/preflight/",
        views.node_action,
        {"action": "preflight"},
        name="node_preflight",
    ),
    path(
        "ops/nodes/<int:pk>/watchdog-only/",
        views.node_action,
        {"action": "watchdog"},
        name="node_watchdog",
    ),
    path("ops/fleet/node-policy/", views.node_policy, name="node_policy"),
]

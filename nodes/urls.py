from django.urls import path

from . import views

app_name = "nodes"

urlpatterns = [
    path("ops/fleet/", views.fleet, name="fleet"),
    path("ops/nodes/new/", views.node_create, name="node_create"),
    path("ops/nodes/<int:pk>/", views.node_detail, name="node_detail"),
    path("ops/nodes/<int:pk>/drain/", views.node_drain, name="node_drain"),
    path("ops/nodes/<int:pk>/undrain/", views.node_undrain, name="node_undrain"),
    path("ops/nodes/<int:pk>/approve-host-key/", views.node_approve, name="node_approve"),
    path("ops/nodes/<int:pk>/rescan/", views.node_rescan, name="node_rescan"),
]

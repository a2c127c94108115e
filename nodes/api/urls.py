from django.urls import path
from rest_framework.routers import SimpleRouter

from . import views

router = SimpleRouter()
router.register("nodes", views.NodeViewSet, basename="node")
router.register("gpus", views.GpuViewSet, basename="gpu")
router.register("node-policy/changes", views.NodePolicyChangeViewSet, basename="node-policy-change")
router.register("reserved-environment", views.ReservedVariableViewSet, basename="reserved-env")

urlpatterns = [
    path("node-policy/", views.NodePolicyView.as_view(), name="node-policy"),
    *router.urls,
]

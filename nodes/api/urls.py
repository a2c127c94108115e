from rest_framework.routers import SimpleRouter

from . import views

router = SimpleRouter()
router.register("nodes", views.NodeViewSet, basename="node")
router.register("gpus", views.GpuViewSet, basename="gpu")

urlpatterns = router.urls

from django.urls import path
from rest_framework.routers import SimpleRouter

from . import views

router = SimpleRouter()
router.register("incidents", views.IncidentViewSet, basename="incident")
router.register("webhooks", views.WebhookEndpointViewSet, basename="webhook")

urlpatterns = [
    path("watchdog/thresholds/", views.ThresholdsView.as_view(), name="watchdog-thresholds"),
    *router.urls,
]

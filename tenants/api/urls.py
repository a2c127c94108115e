from django.urls import path
from rest_framework.routers import SimpleRouter

from . import estimates, views

router = SimpleRouter()
router.register("tiers", views.TierViewSet, basename="tier")
router.register("tokens", views.ApiTokenViewSet, basename="token")
router.register("members", views.MemberViewSet, basename="member")
router.register("ops/tenants", views.OpsTenantViewSet, basename="ops-tenant")

urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path("estimates/", estimates.EstimateView.as_view(), name="estimate"),
    path("estimates/models/", estimates.CatalogView.as_view(), name="estimate-models"),
    *router.urls,
]

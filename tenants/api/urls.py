from django.urls import path
from rest_framework.routers import SimpleRouter

from . import credit, estimates, lifecycle, views

router = SimpleRouter()
router.register("tiers", views.TierViewSet, basename="tier")
router.register("tokens", views.ApiTokenViewSet, basename="token")
router.register("members", views.MemberViewSet, basename="member")
router.register("purchases", lifecycle.PurchaseViewSet, basename="purchase")
router.register("slices", lifecycle.SliceViewSet, basename="slice")
router.register("ledger", lifecycle.LedgerViewSet, basename="ledger")
router.register("usage", lifecycle.UsageViewSet, basename="usage")
router.register("images", lifecycle.ImageViewSet, basename="image")
router.register("ops/tenants", views.OpsTenantViewSet, basename="ops-tenant")
router.register("ops/images", lifecycle.OpsImageViewSet, basename="ops-image")
router.register("ops/credit-grants", lifecycle.OpsCreditGrantViewSet, basename="ops-credit-grant")
router.register("credit-requests", credit.CreditRequestViewSet, basename="credit-request")
router.register(
    "ops/credit-requests", credit.OpsCreditRequestViewSet, basename="ops-credit-request"
)
router.register("ops/credit-rates", credit.OpsCreditRateViewSet, basename="ops-credit-rate")
router.register("ops/slices", lifecycle.OpsSliceViewSet, basename="ops-slice")
router.register("ops/purchases", lifecycle.OpsPurchaseViewSet, basename="ops-purchase")

urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path("credit-rate/", credit.CreditRateView.as_view(), name="credit-rate"),
    path("estimates/", estimates.EstimateView.as_view(), name="estimate"),
    path("estimates/models/", estimates.CatalogView.as_view(), name="estimate-models"),
    *router.urls,
]

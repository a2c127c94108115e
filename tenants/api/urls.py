from django.urls import path
from rest_framework.routers import SimpleRouter

from .views import (
    accounts,
    billing,
    estimates,
    exports,
    registries,
    slices,
    spend,
    templates,
    volumes,
)

router = SimpleRouter()
router.register("tiers", billing.TierViewSet, basename="tier")
router.register("tokens", accounts.ApiTokenViewSet, basename="token")
router.register("ssh-keys", accounts.SshKeyViewSet, basename="ssh-key")
router.register(
    "registry-credentials", registries.RegistryCredentialViewSet, basename="registry-credential"
)
router.register("members", accounts.MemberViewSet, basename="member")
router.register("purchases", billing.PurchaseViewSet, basename="purchase")
router.register("slices", slices.SliceViewSet, basename="slice")
router.register("volumes", volumes.VolumeViewSet, basename="volume")
router.register("ledger", billing.LedgerViewSet, basename="ledger")
router.register("usage", billing.UsageViewSet, basename="usage")
router.register("images", slices.ImageViewSet, basename="image")
router.register("templates", templates.TemplateViewSet, basename="template")
router.register("ops/tenants", accounts.OpsTenantViewSet, basename="ops-tenant")
router.register("ops/images", slices.OpsImageViewSet, basename="ops-image")
router.register(
    "ops/registry-rules", registries.OpsRegistryRuleViewSet, basename="ops-registry-rule"
)
router.register("ops/templates", templates.OpsTemplateViewSet, basename="ops-template")
router.register("ops/credit-grants", billing.OpsCreditGrantViewSet, basename="ops-credit-grant")
router.register("credit-requests", billing.CreditRequestViewSet, basename="credit-request")
router.register(
    "ops/credit-requests", billing.OpsCreditRequestViewSet, basename="ops-credit-request"
)
router.register("ops/credit-rates", billing.OpsCreditRateViewSet, basename="ops-credit-rate")
router.register("ops/slices", slices.OpsSliceViewSet, basename="ops-slice")
router.register("ops/purchases", billing.OpsPurchaseViewSet, basename="ops-purchase")

urlpatterns = [
    path("me/", accounts.MeView.as_view(), name="me"),
    path("credit-rate/", billing.CreditRateView.as_view(), name="credit-rate"),
    path("spend-limit/", spend.SpendLimitView.as_view(), name="spend-limit"),
    path("estimates/", estimates.EstimateView.as_view(), name="estimate"),
    path("estimates/models/", estimates.CatalogView.as_view(), name="estimate-models"),
    # before the router: "usage/<pk>/" would otherwise take "export"
    path("usage/export/", exports.UsageExportView.as_view(), name="usage-export"),
    *router.urls,
]

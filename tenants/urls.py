from django.urls import path

from .views import (
    accounts,
    billing,
    estimate,
    registries,
    slices,
    spend,
    terminal,
    two_factor,
    volumes,
)

app_name = "tenants"

urlpatterns = [
    # accounts
    path("account/", accounts.account, name="account"),
    path("account/tokens/", accounts.token_create, name="token_create"),
    path("account/two-factor/", two_factor.two_factor_page, name="two_factor"),
    path("account/two-factor/enable/", two_factor.two_factor_enable, name="two_factor_enable"),
    path("account/two-factor/verify/", two_factor.two_factor_verify, name="two_factor_verify"),
    path(
        "account/two-factor/recovery-codes/",
        two_factor.recovery_codes_regenerate,
        name="recovery_codes_regenerate",
    ),
    path("account/two-factor/disable/", two_factor.two_factor_disable, name="two_factor_disable"),
    path("account/tokens/<int:pk>/revoke/", accounts.token_revoke, name="token_revoke"),
    path("account/ssh-keys/", accounts.ssh_key_add, name="ssh_key_add"),
    path("account/ssh-keys/<int:pk>/remove/", accounts.ssh_key_remove, name="ssh_key_remove"),
    path("account/invitations/", accounts.invitation_create, name="invitation_create"),
    path(
        "account/invitations/<int:pk>/revoke/",
        accounts.invitation_revoke,
        name="invitation_revoke",
    ),
    path(
        "account/invitations/<int:pk>/resend/",
        accounts.invitation_resend,
        name="invitation_resend",
    ),
    path("account/members/<int:pk>/role/", accounts.member_role, name="member_role"),
    path("account/members/<int:pk>/remove/", accounts.member_remove, name="member_remove"),
    path("ops/tenants/", accounts.ops_tenants, name="ops_tenants"),
    path("ops/tenants/<int:pk>/status/", accounts.ops_tenant_status, name="ops_tenant_status"),
    # billing
    path("tiers/", billing.catalog, name="catalog"),
    path("buy/", billing.buy, name="buy"),
    path("usage/", billing.usage, name="usage"),
    path("spend-limits/", spend.spend_limits, name="spend_limits"),
    path("usage/export.csv", billing.usage_csv, name="usage_csv"),
    path("ops/credit/", billing.ops_credit, name="ops_credit"),
    path("credit/requests/", billing.credit_request_create, name="credit_request_create"),
    path(
        "credit/requests/<int:pk>/withdraw/",
        billing.credit_request_withdraw,
        name="credit_request_withdraw",
    ),
    path(
        "ops/credit/requests/<int:pk>/grant/",
        billing.ops_credit_request_decide,
        {"decision": "grant"},
        name="ops_credit_request_grant",
    ),
    path(
        "ops/credit/requests/<int:pk>/decline/",
        billing.ops_credit_request_decide,
        {"decision": "decline"},
        name="ops_credit_request_decline",
    ),
    path("ops/credit/rate/", billing.ops_credit_rate, name="ops_credit_rate"),
    path("ops/credit/refund/<int:pk>/", billing.ops_refund, name="ops_refund"),
    # slices and the estimate
    path("fit/", estimate.fit, name="fit"),
    path("dashboard/", slices.dashboard, name="dashboard"),
    path("launch/", slices.launch, name="launch"),
    path("slices/<int:pk>/", slices.slice_detail, name="slice_detail"),
    path("slices/<int:pk>/stop/", slices.slice_stop, name="slice_stop"),
    path("slices/<int:pk>/logs/", slices.slice_logs, name="slice_logs"),
    path("slices/<int:pk>/terminal/", terminal.terminal_ticket, name="slice_terminal"),
    path("slices/<int:pk>/resume/", volumes.slice_resume, name="slice_resume"),
    path("slices/<int:pk>/terminate/", volumes.slice_terminate, name="slice_terminate"),
    path("volumes/", volumes.volumes, name="volumes"),
    path("volumes/<int:pk>/delete/", volumes.volume_delete, name="volume_delete"),
    path("ops/slices/", slices.ops_slices, name="ops_slices"),
    path("ops/slices/<int:pk>/stop/", slices.ops_slice_stop, name="ops_slice_stop"),
    path("ops/images/", slices.ops_images, name="ops_images"),
    path("ops/images/<int:pk>/", slices.ops_image_edit, name="ops_image_edit"),
    path("ops/images/<int:pk>/active/", slices.ops_image_active, name="ops_image_active"),
    # images renters bring: the registry policy, tenants' registry logins
    path("ops/registries/", registries.ops_registries, name="ops_registries"),
    path(
        "ops/registries/<int:pk>/remove/",
        registries.ops_registry_remove,
        name="ops_registry_remove",
    ),
    path("registries/", registries.registries, name="registries"),
    path(
        "registries/<int:pk>/remove/",
        registries.registry_login_remove,
        name="registry_login_remove",
    ),
    path("ops/calibration/", slices.ops_calibration, name="ops_calibration"),
]

from django.urls import path

from . import credit_views as credit
from . import lifecycle_views as lifecycle
from . import views

app_name = "tenants"

urlpatterns = [
    path("tiers/", views.catalog, name="catalog"),
    path("fit/", views.fit, name="fit"),
    path("account/", views.account, name="account"),
    path("account/tokens/", views.token_create, name="token_create"),
    path("account/tokens/<int:pk>/revoke/", views.token_revoke, name="token_revoke"),
    path("account/invitations/", views.invitation_create, name="invitation_create"),
    path("account/invitations/<int:pk>/revoke/", views.invitation_revoke, name="invitation_revoke"),
    path("account/invitations/<int:pk>/resend/", views.invitation_resend, name="invitation_resend"),
    path("account/members/<int:pk>/role/", views.member_role, name="member_role"),
    path("account/members/<int:pk>/remove/", views.member_remove, name="member_remove"),
    path("ops/tenants/", views.ops_tenants, name="ops_tenants"),
    path("ops/tenants/<int:pk>/status/", views.ops_tenant_status, name="ops_tenant_status"),
    # the slice lifecycle
    path("dashboard/", lifecycle.dashboard, name="dashboard"),
    path("buy/", lifecycle.buy, name="buy"),
    path("launch/", lifecycle.launch, name="launch"),
    path("slices/<int:pk>/", lifecycle.slice_detail, name="slice_detail"),
    path("slices/<int:pk>/stop/", lifecycle.slice_stop, name="slice_stop"),
    path("ops/slices/", lifecycle.ops_slices, name="ops_slices"),
    path("ops/slices/<int:pk>/stop/", lifecycle.ops_slice_stop, name="ops_slice_stop"),
    path("ops/credit/", lifecycle.ops_credit, name="ops_credit"),
    path("credit/requests/", credit.credit_request_create, name="credit_request_create"),
    path(
        "credit/requests/<int:pk>/withdraw/",
        credit.credit_request_withdraw,
        name="credit_request_withdraw",
    ),
    path(
        "ops/credit/requests/<int:pk>/grant/",
        credit.ops_credit_request_decide,
        {"decision": "grant"},
        name="ops_credit_request_grant",
    ),
    path(
        "ops/credit/requests/<int:pk>/decline/",
        credit.ops_credit_request_decide,
        {"decision": "decline"},
        name="ops_credit_request_decline",
    ),
    path("ops/credit/rate/", credit.ops_credit_rate, name="ops_credit_rate"),
    path("ops/credit/refund/<int:pk>/", lifecycle.ops_refund, name="ops_refund"),
    path("ops/images/", lifecycle.ops_images, name="ops_images"),
    path("ops/images/<int:pk>/", lifecycle.ops_image_edit, name="ops_image_edit"),
    path("ops/images/<int:pk>/active/", lifecycle.ops_image_active, name="ops_image_active"),
    path("ops/calibration/", lifecycle.ops_calibration, name="ops_calibration"),
]

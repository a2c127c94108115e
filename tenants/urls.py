from django.urls import path

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
]

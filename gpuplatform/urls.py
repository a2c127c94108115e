"""Top-level URLs: pages, accounts, the API and admin."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.shortcuts import redirect
from django.templatetags.static import static
from django.urls import include, path

from nodes import views as node_views
from tenants.form_limits import limit_posts
from tenants.login import ThrottledLoginView, login_two_factor
from tenants.views import accounts as tenant_views

urlpatterns = [
    path("", tenant_views.home, name="home"),
    path("healthz/", tenant_views.healthz, name="healthz"),
    # browsers ask for /favicon.ico on pages without the <link rel="icon"> (the API, files)
    path("favicon.ico", lambda request: redirect(static("favicon.svg")), name="favicon"),
    path("signup/", tenant_views.signup, name="signup"),
    path("signup/sent/", tenant_views.signup_sent, name="signup_sent"),
    path("signup/confirm/", tenant_views.signup_confirm, name="signup_confirm"),
    path("signup/confirm/<str:token>/", tenant_views.signup_link, name="signup_link"),
    path("invitations/accept/", tenant_views.invitation_accept, name="invitation_accept"),
    path("invitations/<str:token>/", tenant_views.invitation_link, name="invitation_link"),
    path("accounts/login/", ThrottledLoginView.as_view(), name="login"),
    path("accounts/login/two-factor/", login_two_factor, name="login_two_factor"),
    # Django's own reset form, its POSTs held to the address's rate (tenants/form_limits.py)
    path(
        "accounts/password_reset/",
        limit_posts("password_reset")(auth_views.PasswordResetView.as_view()),
        name="password_reset",
    ),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include(("gpuplatform.api.urls", "api"), namespace="api")),
    path("admin/", admin.site.urls),
    path("metrics", node_views.metrics, name="metrics"),
    path("", include("tenants.urls")),
    path("", include("nodes.urls")),
    path("", include("incidents.urls")),
    path("", include("edge.urls")),
]

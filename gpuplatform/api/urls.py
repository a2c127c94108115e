"""/api/v1/: each app's routes, the OpenAPI schema and the browsable docs."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

urlpatterns = [
    path("", include("tenants.api.urls")),
    path("", include("nodes.api.urls")),
    path("", include("incidents.api.urls")),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # the split view serves Swagger UI's start-up script from ?script, not inline (the CSP)
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api:schema"), name="docs"),
]

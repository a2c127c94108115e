"""OpenAPI description of the API-token authentication (loaded by TenantsConfig.ready)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension

from gpuplatform.api.scopes import SCOPE_HELP


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token from your account page or POST /api/v1/tokens/. "
            "Each operation names the scope a token needs in `x-required-scope`; without it "
            "the answer is 403 `insufficient_scope`. Scopes: "
            + "; ".join(f"`{scope}`: {what}" for scope, what in SCOPE_HELP.items())
            + ". A browser session is not limited by scopes.",
            "x-scopes": dict(SCOPE_HELP),
        }

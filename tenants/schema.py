"""OpenAPI description of the API-token authentication (loaded by TenantsConfig.ready)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drf_spectacular.authentication import SessionScheme
from drf_spectacular.extensions import OpenApiAuthenticationExtension

from gpuplatform.api.scopes import SCOPE_HELP

if TYPE_CHECKING:  # for the annotation only: ready() imports this module, kept light
    from drf_spectacular.openapi import AutoSchema


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, Any]:
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


class StaffVerifiedSessionScheme(SessionScheme):
    """The browser session, as drf-spectacular describes Django's; staff sessions must
    have passed the code step (403 `two_factor_required` otherwise)."""

    target_class = "tenants.authentication.StaffVerifiedSessionAuthentication"

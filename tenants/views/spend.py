"""The spend-limit page: every member reads the tenant's monthly limit and what counts
against it (and each member's and token's limit); owners set or lift them here, as the
API's PUT spend-limit/ does, through the same service and audit trail."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from gpuplatform.http import MemberRequest
from gpuplatform.pages import submit

from .. import selectors, services
from ..forms.spend import TENANT, SpendLimitForm
from ..models import Tenant
from ..permissions import member_required


def _rows(form: SpendLimitForm, tenant: Tenant) -> dict[str, list[dict[str, Any]]]:
    """Each member and live token with its limit and this month's spend."""
    return {
        "member_rows": [
            {"membership": m, "spent": selectors.spent(tenant=tenant, user=m.user)}
            for m in form.members.values()
        ],
        "token_rows": [
            {"token": t, "spent": selectors.spent(tenant=tenant, token=t)}
            for t in form.tokens.values()
        ],
    }


@member_required
@require_http_methods(["GET", "POST"])
def spend_limits(request: MemberRequest) -> HttpResponse:
    membership = request.membership
    tenant = membership.tenant
    owner = membership.can_manage
    if request.method == "POST" and not owner:
        messages.error(request, "Only owners set spend limits.")
    form = SpendLimitForm(
        request.POST if owner and request.method == "POST" else None,
        tenant=tenant,
        initial={"whose": TENANT, "limit": tenant.spend_limit},
    )
    saved = submit(
        request,
        form,
        lambda data: services.spend_limit_set(
            actor=request.user, tenant=tenant, limit=data["limit"], **form.target()
        ),
    )
    if saved.done:
        value = saved.result
        messages.success(
            request,
            f"Monthly spend limit of {form.whose_label()}: "
            + (f"{value} credits." if value is not None else "none."),
        )
        return redirect("tenants:spend_limits")
    tenant.refresh_from_db()
    context = {
        "form": form,
        "owner": owner,
        "summary": selectors.spend_summary(tenant=tenant),
        **_rows(form, tenant),
    }
    status = 403 if request.method == "POST" and not owner else saved.status
    return render(request, "tenants/spend_limits.html", context, status=status)

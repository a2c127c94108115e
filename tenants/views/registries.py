"""Registry pages: ops' registry policy (which images renters may bring, from where, and
its history), and a tenant's registry logins (saved and removed; never shown again)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from gpuplatform.errors import ServiceError
from gpuplatform.http import MemberRequest, UserRequest
from gpuplatform.pages import PAGE_SIZE, submit

from .. import selectors, services
from ..forms.registries import RegistryLoginForm, RegistryRuleForm, RegistryRuleRemoveForm
from ..models import RegistryRule
from ..permissions import member_required


@staff_member_required
@require_http_methods(["GET", "POST"])
def ops_registries(request: UserRequest) -> HttpResponse:
    """The registry policy: each rule, a form to add or change one, and every change."""
    form = RegistryRuleForm(request.POST or None)
    saved = submit(
        request, form, lambda data: services.registry_rule_set(actor=request.user, **data)
    )
    if saved.done:
        rule = saved.result
        messages.success(request, f"{rule.pattern}: {rule.get_mode_display()}.")
        return redirect("tenants:ops_registries")
    agent_nodes, taking_nodes = selectors.registry_agent_nodes()
    history = Paginator(selectors.registry_rule_changes(), PAGE_SIZE)
    return render(
        request,
        "tenants/ops_registries.html",
        {
            "form": form,
            "rules": selectors.registry_rules(),
            "history": history.get_page(request.GET.get("page")),
            "agent_nodes": agent_nodes,
            "taking_nodes": taking_nodes,
        },
        status=saved.status,
    )


@staff_member_required
@require_POST
def ops_registry_remove(request: UserRequest, pk: int) -> HttpResponse:
    rule = get_object_or_404(RegistryRule, pk=pk)
    form = RegistryRuleRemoveForm(request.POST)
    removed = submit(
        request,
        form,
        lambda data: services.registry_rule_remove(actor=request.user, rule=rule, **data),
        refusal="messages",
    )
    if removed.done:
        messages.success(request, f"The rule for {rule.pattern} is removed.")
    elif not removed.refused:
        messages.error(request, "Say why the rule goes (it is kept in the history).")
    return redirect("tenants:ops_registries")


@member_required
@require_http_methods(["GET", "POST"])
def registries(request: MemberRequest) -> HttpResponse:
    """The tenant's registry logins: which registries, set by whom and when; never what."""
    membership = request.membership
    form = RegistryLoginForm(request.POST or None)
    saved = submit(
        request,
        form,
        lambda data: services.registry_credential_set(membership=membership, **data),
    )
    if saved.done:
        messages.success(
            request,
            f"Login for {saved.result.registry} saved. It is sealed and will not be shown again.",
        )
        return redirect("tenants:registries")
    return render(
        request,
        "tenants/registries.html",
        {
            "form": form,
            "logins": selectors.registry_credentials_of(tenant=membership.tenant),
            "rules": selectors.registry_rules().exclude(mode=RegistryRule.Mode.ALLOWLIST),
            "can_manage": membership.can_manage,
        },
        status=saved.status,
    )


@member_required
@require_POST
def registry_login_remove(request: MemberRequest, pk: int) -> HttpResponse:
    membership = request.membership
    login = get_object_or_404(selectors.registry_credentials_of(tenant=membership.tenant), pk=pk)
    try:
        services.registry_credential_remove(membership=membership, credential_id=login.pk)
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"The login for {login.registry} is removed.")
    return redirect("tenants:registries")

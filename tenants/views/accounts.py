"""Account pages: sign-up, invitations, the account page (members, invitations, API
tokens, SSH keys), and the ops list of tenants.

htmx requests get the section they changed; plain form posts get the whole page, so
every page also works without JavaScript.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gpuplatform.errors import ServiceError
from gpuplatform.http import AccountRequest, MemberRequest, PageRequest, UserRequest
from gpuplatform.pages import PAGE_SIZE, form_error, is_partial, submit

from .. import form_limits, selectors, services
from ..forms.accounts import (
    AcceptInvitationForm,
    ApiTokenForm,
    InvitationForm,
    RoleForm,
    SignUpConfirmForm,
    SignUpForm,
    SshKeyForm,
    SshKeyRemoveForm,
    TenantCreateForm,
    TenantSearchForm,
    TenantStatusForm,
)
from ..models import (
    ApiToken,
    Invitation,
    Membership,
    Role,
    Tenant,
)
from ..permissions import member_required
from ..services.keys import MAX_SSH_KEYS_PER_USER
from ..sign_up_links import unseal


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return redirect("tenants:catalog")


SIGN_UP_SESSION_KEY = "sign_up_token"


@form_limits.limit_posts("signup")
def signup(request: PageRequest) -> HttpResponse:
    """Answers every accepted form alike, whether or not the address has an account:
    on to "check your email" (the mail says which it was)."""
    if request.user.is_authenticated:
        return redirect("tenants:dashboard")
    form = SignUpForm(request.POST or None)
    requested = submit(
        request,
        form,
        lambda data: services.tenant_sign_up_request(
            email=data["email"], password=data["password"], tenant_name=data["tenant_name"]
        ),
    )
    if requested.done:
        return redirect("signup_sent")
    return render(request, "registration/signup.html", {"form": form}, status=requested.status)


@require_GET
def signup_sent(request: HttpRequest) -> HttpResponse:
    return render(request, "registration/signup_sent.html")


@require_GET
def signup_link(request: HttpRequest, token: str) -> HttpResponse:
    """The mailed link. As with invitations, the token moves into the session and the
    browser goes on to a URL without it; nothing is made until the page's button is
    pressed (a mail scanner that opens links makes no account)."""
    if unseal(token) is None:
        return render(request, "registration/signup_invalid.html", status=404)
    request.session[SIGN_UP_SESSION_KEY] = token
    return redirect("signup_confirm")


@form_limits.limit_posts("signup_confirm")
@require_http_methods(["GET", "POST"])
def signup_confirm(request: PageRequest) -> HttpResponse:
    token = request.session.get(SIGN_UP_SESSION_KEY, "")
    claim = unseal(token) if token else None
    if claim is None:
        return render(request, "registration/signup_invalid.html", status=404)
    if request.user.is_authenticated:
        reason = f"Sign out first: the link makes a new account for {claim.email}."
        return render(request, "registration/signup_invalid.html", {"reason": reason}, status=409)
    form = SignUpConfirmForm(request.POST if request.method == "POST" else None)
    confirmed = submit(request, form, lambda _: services.tenant_sign_up_confirm(token=token))
    if confirmed.done:
        membership = confirmed.result
        request.session.pop(SIGN_UP_SESSION_KEY, None)
        login(request, membership.user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, f"Welcome! {membership.tenant.name} is ready.")
        return redirect("tenants:dashboard")
    return render(
        request,
        "registration/signup_confirm.html",
        {"claim": claim, "form": form},
        status=confirmed.status,
    )


INVITATION_SESSION_KEY = "invitation_token"


def invitation_link(request: HttpRequest, token: str) -> HttpResponse:
    """The emailed link. The token moves into the session and the browser goes on to a
    URL without it, so it does not linger in history, Referer headers or later logs
    (Django's password reset does the same)."""
    if selectors.invitation_by_token(token) is None:
        return render(request, "tenants/invitation_invalid.html", status=404)
    request.session[INVITATION_SESSION_KEY] = token
    return redirect("invitation_accept")


def invitation_accept(request: HttpRequest) -> HttpResponse:
    token = request.session.get(INVITATION_SESSION_KEY, "")
    invitation = selectors.invitation_by_token(token) if token else None
    if invitation is None:
        return render(request, "tenants/invitation_invalid.html", status=404)
    if request.user.is_authenticated:
        return render(
            request,
            "tenants/invitation_invalid.html",
            {
                "reason": "Sign out first: the invitation creates a new account for "
                f"{invitation.email}."
            },
            status=409,
        )
    form = AcceptInvitationForm(request.POST or None)
    accepted = submit(
        request,
        form,
        lambda data: services.invitation_accept(token=token, password=data["password"]),
    )
    if accepted.done:
        membership = accepted.result
        request.session.pop(INVITATION_SESSION_KEY, None)
        login(request, membership.user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, f"You joined {membership.tenant.name}.")
        return redirect("tenants:account")
    return render(
        request, "tenants/invitation_accept.html", {"invitation": invitation, "form": form}
    )


def _account_context(request: AccountRequest | MemberRequest, **extra: Any) -> dict[str, Any]:
    membership = request.membership
    tenant = membership.tenant if membership else None
    members = list(selectors.member_list(tenant=tenant))
    owners = [m.pk for m in members if m.role == Role.OWNER]
    return {
        "membership": membership,
        "members": members,
        # The service refuses to leave a tenant ownerless; the page says so up front.
        "sole_owner_id": owners[0] if len(owners) == 1 else None,
        "invitations": selectors.invitation_pending_list(tenant=tenant),
        "tokens": selectors.api_token_list(user=request.user)[:50],
        "events": selectors.audit_event_list(tenant=tenant),
        "token_form": extra.pop("token_form", None) or ApiTokenForm(),
        "ssh_keys": selectors.ssh_keys_of(request.user)[:MAX_SSH_KEYS_PER_USER],
        "ssh_key_form": extra.pop("ssh_key_form", None) or SshKeyForm(),
        # called by the template, so only pages that show it read the key file
        "gateway_fingerprint": selectors.gateway_host_key_fingerprint,
        "invite_form": extra.pop("invite_form", None) or InvitationForm(),
        "role_choices": Membership._meta.get_field("role").choices,
        **extra,
    }


@login_required
def account(request: AccountRequest) -> HttpResponse:
    request.membership = selectors.membership_for_user(request.user)
    if request.membership is None and not request.user.is_staff:
        form = TenantCreateForm(request.POST or None)
        created = submit(
            request,
            form,
            lambda data: services.tenant_create(owner=request.user, name=data["tenant_name"]),
        )
        if created.done:
            return redirect("tenants:account")
        return render(request, "tenants/no_tenant.html", {"form": form}, status=created.status)
    return render(request, "tenants/account.html", _account_context(request))


def _tokens_response(request: AccountRequest, status: int = 200, **extra: Any) -> HttpResponse:
    request.membership = selectors.membership_for_user(request.user)
    context = _account_context(request, **extra)
    template = "tenants/_tokens.html" if is_partial(request) else "tenants/account.html"
    context["oob_activity"] = True
    return render(request, template, context, status=status)


@login_required
@require_POST
def token_create(request: AccountRequest) -> HttpResponse:
    form = ApiTokenForm(request.POST)
    if not form.is_valid():
        return _tokens_response(request, status=400, token_form=form)
    try:
        token, value = services.api_token_create(
            user=request.user,
            name=form.cleaned_data["name"],
            expires_in_days=form.cleaned_data["expires_in_days"],
            scopes=form.cleaned_data["scopes"],
            allowed_networks=form.cleaned_data["networks"],
        )
    except ServiceError as exc:
        form_error(form, exc)
        return _tokens_response(request, status=exc.status_code, token_form=form)
    return _tokens_response(request, new_token=token, new_token_value=value)


@login_required
@require_POST
def token_revoke(request: AccountRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(ApiToken.objects.filter(user=request.user), pk=pk)
    services.api_token_revoke(user=request.user, token=token)
    if not is_partial(request):
        messages.success(request, f"Token {token.name!r} revoked.")
        return redirect("tenants:account")
    return _tokens_response(request)


def _ssh_keys_response(request: AccountRequest, status: int = 200, **extra: Any) -> HttpResponse:
    request.membership = selectors.membership_for_user(request.user)
    # A fragment brings the activity list along (out of band); the whole page has its own.
    context = _account_context(request, oob_activity=is_partial(request), **extra)
    template = "tenants/_ssh_keys.html" if is_partial(request) else "tenants/account.html"
    return render(request, template, context, status=status)


@login_required
@require_POST
def ssh_key_add(request: AccountRequest) -> HttpResponse:
    form = SshKeyForm(request.POST)
    wait_s = form_limits.attempt(request, "ssh_key_add")
    if wait_s and not is_partial(request):
        return form_limits.refused_page(request, wait_s)
    if wait_s:  # the fragment says why (htmx swaps a 429 too); nothing is added
        form.add_error(None, form_limits.wait_message(wait_s))
        response = _ssh_keys_response(request, status=429, ssh_key_form=form)
        response["Retry-After"] = str(wait_s)
        return response
    added = submit(
        request,
        form,
        lambda data: services.ssh_key_add(
            user=request.user, name=data["name"], public_key=data["public_key"]
        ),
    )
    if not added.done:  # the page or fragment with its errors, as every form page answers
        return _ssh_keys_response(request, status=added.status, ssh_key_form=form)
    key = added.result
    notice = f"SSH key {key.name!r} added ({key.fingerprint})."
    if not is_partial(request):
        messages.success(request, notice)
        return redirect(f"{reverse('tenants:account')}#ssh-keys")
    return _ssh_keys_response(request, ssh_key_notice=notice)


@login_required
@require_http_methods(["GET", "POST"])
def ssh_key_remove(request: AccountRequest, pk: int) -> HttpResponse:
    """GET asks to confirm; only the confirming POST (`confirm`) removes the key."""
    key = get_object_or_404(selectors.ssh_keys_of(request.user), pk=pk)
    removed = submit(
        request,
        SshKeyRemoveForm(request.POST or None),
        lambda _: services.ssh_key_remove(user=request.user, key_id=key.pk),
        refusal="messages",
    )
    if removed.done:
        notice = f"SSH key {key.name!r} removed: it no longer opens the gateway."
        if not is_partial(request):
            messages.success(request, notice)
            return redirect(f"{reverse('tenants:account')}#ssh-keys")
        return _ssh_keys_response(request, ssh_key_notice=notice)
    if removed.refused:
        return redirect(f"{reverse('tenants:account')}#ssh-keys")
    return render(request, "tenants/ssh_key_remove.html", {"key": key}, status=removed.status)


def _members_response(request: MemberRequest, **extra: Any) -> HttpResponse:
    error = extra.get("member_error")
    if not is_partial(request):
        if error:
            messages.error(request, error)
        return redirect("tenants:account")
    return render(
        request, "tenants/_members.html", _account_context(request, oob_activity=True, **extra)
    )


@member_required
@require_POST
def invitation_create(request: MemberRequest) -> HttpResponse:
    form = InvitationForm(request.POST)
    if not form.is_valid():
        if not is_partial(request):
            messages.error(
                request, "; ".join(str(e) for errs in form.errors.values() for e in errs)
            )
            return redirect("tenants:account")
        context = _account_context(request, invite_form=form)
        return render(request, "tenants/_members.html", context, status=400)
    try:
        invitation = services.invitation_create(
            actor_membership=request.membership, **form.cleaned_data
        )
    except ServiceError as exc:
        if is_partial(request):
            form_error(form, exc)
            return render(
                request,
                "tenants/_members.html",
                _account_context(request, invite_form=form),
                status=exc.status_code,
            )
        return _members_response(request, member_error=exc.message)
    return _members_response(request, member_notice=f"Invitation sent to {invitation.email}.")


@member_required
@require_POST
def invitation_revoke(request: MemberRequest, pk: int) -> HttpResponse:
    invitation = get_object_or_404(Invitation.objects.for_tenant(request.membership.tenant), pk=pk)
    try:
        services.invitation_revoke(actor_membership=request.membership, invitation=invitation)
    except ServiceError as exc:
        return _members_response(request, member_error=exc.message)
    return _members_response(request, member_notice=f"Invitation for {invitation.email} revoked.")


@member_required
@require_POST
def invitation_resend(request: MemberRequest, pk: int) -> HttpResponse:
    invitation = get_object_or_404(Invitation.objects.for_tenant(request.membership.tenant), pk=pk)
    try:
        services.invitation_resend(actor_membership=request.membership, invitation=invitation)
    except ServiceError as exc:
        return _members_response(request, member_error=exc.message)
    return _members_response(request, member_notice=f"Invitation re-sent to {invitation.email}.")


@member_required
@require_POST
def member_role(request: MemberRequest, pk: int) -> HttpResponse:
    member = get_object_or_404(Membership.objects.for_tenant(request.membership.tenant), pk=pk)
    form = RoleForm(request.POST)
    if not form.is_valid():
        return _members_response(request, member_error="Choose owner, member or viewer.")
    try:
        services.membership_change_role(
            actor_membership=request.membership, membership=member, role=form.cleaned_data["role"]
        )
    except ServiceError as exc:
        return _members_response(request, member_error=exc.message)
    return _members_response(
        request, member_notice=f"{member.user.email} is now {form.cleaned_data['role']}."
    )


@member_required
@require_POST
def member_remove(request: MemberRequest, pk: int) -> HttpResponse:
    member = get_object_or_404(Membership.objects.for_tenant(request.membership.tenant), pk=pk)
    email = member.user.email
    try:
        services.membership_remove(actor_membership=request.membership, membership=member)
    except ServiceError as exc:
        return _members_response(request, member_error=exc.message)
    if member.user_id == request.user.id:
        messages.info(request, "You left the tenant.")
        response = HttpResponse(status=204)
        response["HX-Redirect"] = "/account/"
        return response if is_partial(request) else redirect("tenants:account")
    return _members_response(request, member_notice=f"{email} removed.")


@staff_member_required
@require_GET
def ops_tenants(request: UserRequest) -> HttpResponse:
    form = TenantSearchForm(request.GET)
    valid = form.is_valid()
    q = form.cleaned_data.get("q", "") if valid else ""
    status = form.cleaned_data.get("status", "") if valid else ""
    page = Paginator(selectors.tenant_list_for_ops(search=q, status=status), PAGE_SIZE)
    context = {
        "page": page.get_page(request.GET.get("page")),
        "q": q,
        "status": status,
        "statuses": Tenant.Status.choices,
    }
    template = (
        "tenants/ops/_tenant_rows.html" if is_partial(request) else "tenants/ops/tenants.html"
    )
    return render(request, template, context)


@staff_member_required
@require_POST
def ops_tenant_status(request: UserRequest, pk: int) -> HttpResponse:
    tenant = get_object_or_404(Tenant, pk=pk)
    form = TenantStatusForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose active or suspended.")
    else:
        try:
            services.tenant_set_status(tenant=tenant, actor=request.user, **form.cleaned_data)
        except ServiceError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"{tenant.name} is now {form.cleaned_data['status']}.")
    next_url = request.POST.get("next", "")
    if next_url.startswith("/ops/") and url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}
    ):
        return redirect(next_url)
    return redirect("tenants:ops_tenants")

"""Forms of the account pages: sign-up, invitations, roles, API tokens, SSH keys, ops'
tenant status and search."""

from __future__ import annotations

from typing import Any

from django import forms

from gpuplatform.api.scopes import SCOPE_HELP, SCOPES

from ..models import Role, Tenant
from ..services.accounts import API_TOKEN_MAX_DAYS
from ..services.keys import SSH_KEY_NAME_MAX
from ..ssh_keys import SSH_PUBLIC_KEY_MAX_CHARS


class NewPasswordForm(forms.Form):
    """A new password, typed twice."""

    password = forms.CharField(label="Choose a password", widget=forms.PasswordInput, min_length=8)
    password_confirm = forms.CharField(label="Repeat password", widget=forms.PasswordInput)

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data  # what Form.clean returns, typed
        if data.get("password") and data.get("password") != data.get("password_confirm"):
            self.add_error("password_confirm", "The two passwords differ.")
        return data


class SignUpForm(NewPasswordForm):
    field_order = ["tenant_name", "email", "password", "password_confirm"]

    tenant_name = forms.CharField(label="Organisation", max_length=100)
    email = forms.EmailField(label="Email", max_length=150)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["password"].label = "Password"


class SignUpConfirmForm(forms.Form):
    """The button on the page the mailed sign-up link opens: the link's token waits in
    the session, so the form posts nothing but its CSRF token."""


class AcceptInvitationForm(NewPasswordForm):
    pass


class TenantCreateForm(forms.Form):
    tenant_name = forms.CharField(label="Organisation", max_length=100)


class InvitationForm(forms.Form):
    email = forms.EmailField(label="Email", max_length=150)
    role = forms.ChoiceField(label="Role", choices=Role.choices, initial=Role.MEMBER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(label="Role", choices=Role.choices)


class ApiTokenForm(forms.Form):
    name = forms.CharField(label="Name", max_length=64)
    expires_in_days = forms.IntegerField(
        label="Expires in (days)",
        min_value=1,
        max_value=API_TOKEN_MAX_DAYS,
        required=False,
        help_text="Empty: never expires.",
    )
    # One box per scope (not one multiple-choice field) so each renders as a plain
    # labelled checkbox; read is ticked to start with, the least a token can do.
    scope_read = forms.BooleanField(label="read", required=False, initial=True)
    scope_launch = forms.BooleanField(label="launch", required=False)
    scope_billing = forms.BooleanField(label="billing", required=False)
    scope_admin = forms.BooleanField(label="admin", required=False)
    allowed_networks = forms.CharField(
        label="Client networks",
        max_length=1000,
        required=False,
        help_text="CIDR networks, separated by spaces or commas (203.0.113.0/24). "
        "Empty: usable from anywhere.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for scope in SCOPES:
            self.fields[f"scope_{scope}"].help_text = SCOPE_HELP[scope]

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data  # what Form.clean returns, typed
        data["scopes"] = [s for s in SCOPES if data.get(f"scope_{s}")]
        if not data["scopes"]:
            self.add_error("scope_read", "Choose at least one scope.")
        data["networks"] = (data.get("allowed_networks") or "").replace(",", " ").split()
        return data


class SshKeyForm(forms.Form):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Its own ids: the token form on the same page has a `name` field too.
        kwargs.setdefault("auto_id", "id_ssh_key_%s")
        super().__init__(*args, **kwargs)

    name = forms.CharField(label="Name", max_length=SSH_KEY_NAME_MAX, help_text="e.g. laptop")
    public_key = forms.CharField(
        label="Public key",
        max_length=SSH_PUBLIC_KEY_MAX_CHARS,
        widget=forms.Textarea(
            attrs={"rows": 3, "placeholder": "ssh-ed25519 AAAA… you@laptop", "spellcheck": "false"}
        ),
        help_text="The contents of your .pub file (e.g. ~/.ssh/id_ed25519.pub), never the "
        "private key.",
    )


class SshKeyRemoveForm(forms.Form):
    """The confirmation step of removing a key: only the confirming form posts `confirm`."""

    confirm = forms.BooleanField()


class TenantStatusForm(forms.Form):
    status = forms.ChoiceField(choices=Tenant.Status.choices)
    reason = forms.CharField(max_length=500, required=False)


class TenantSearchForm(forms.Form):
    """Ops tenant search; bad values (a NUL byte, an unknown status) mean no filter."""

    q = forms.CharField(max_length=100, required=False, strip=True)
    status = forms.ChoiceField(choices=[("", "any"), *Tenant.Status.choices], required=False)

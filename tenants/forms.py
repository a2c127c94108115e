"""Forms for the tenant pages. They validate shape; services enforce the rules."""

from decimal import Decimal

from django import forms

from .models import Role, Tenant
from .services import API_TOKEN_MAX_DAYS


class SignUpForm(forms.Form):
    tenant_name = forms.CharField(label="Organisation", max_length=100)
    email = forms.EmailField(label="Email", max_length=150)
    password = forms.CharField(label="Password", widget=forms.PasswordInput, min_length=8)
    password_confirm = forms.CharField(label="Repeat password", widget=forms.PasswordInput)

    def clean(self):  # type: ignore[no-untyped-def]
        data = super().clean()
        if data.get("password") and data.get("password") != data.get("password_confirm"):
            self.add_error("password_confirm", "The two passwords differ.")
        return data


class AcceptInvitationForm(forms.Form):
    password = forms.CharField(label="Choose a password", widget=forms.PasswordInput, min_length=8)
    password_confirm = forms.CharField(label="Repeat password", widget=forms.PasswordInput)

    def clean(self):  # type: ignore[no-untyped-def]
        data = super().clean()
        if data.get("password") and data.get("password") != data.get("password_confirm"):
            self.add_error("password_confirm", "The two passwords differ.")
        return data


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


class TenantStatusForm(forms.Form):
    status = forms.ChoiceField(choices=Tenant.Status.choices)
    reason = forms.CharField(max_length=500, required=False)


class TenantSearchForm(forms.Form):
    """Ops tenant search; bad values (a NUL byte, an unknown status) mean no filter."""

    q = forms.CharField(max_length=100, required=False, strip=True)
    status = forms.ChoiceField(choices=[("", "any"), *Tenant.Status.choices], required=False)


class CreditRequestForm(forms.Form):
    amount = forms.DecimalField(
        label="Credits", min_value=Decimal("0.01"), max_digits=12, decimal_places=2
    )
    note = forms.CharField(
        label="Note for ops",
        max_length=500,
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="What the credit is for (optional).",
    )


class CreditDecisionForm(forms.Form):
    note = forms.CharField(
        label="Note to the tenant",
        max_length=500,
        required=False,
        help_text="Required to decline: the tenant reads it.",
    )


class CreditRateForm(forms.Form):
    currency = forms.CharField(label="Currency (ISO 4217)", min_length=3, max_length=3)
    per_credit = forms.DecimalField(
        label="One credit is worth", max_digits=12, decimal_places=4, min_value=Decimal("0.0001")
    )
    reason = forms.CharField(label="Why", max_length=300)

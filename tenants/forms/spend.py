"""The spend-limit page's form: whose monthly limit (the tenant's, one member's or one API
token's, offered from this tenant only) and the limit in credits, empty for none. The
service checks the rest (owners only, the range) and records the change."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, TypedDict

from django import forms

from gpuplatform.pages import form_field

from ..models import ApiToken, Membership, Tenant
from ..services.spend import MAX_LIMIT

TENANT = "tenant"


class Target(TypedDict):
    """Whose limit, as `spend_limit_set` takes it: neither is the tenant's."""

    member: Membership | None
    token: ApiToken | None


class SpendLimitForm(forms.Form):
    whose = forms.ChoiceField(label="Limit of")
    limit = forms.DecimalField(
        label="Monthly limit (credits)",
        required=False,
        min_value=Decimal("0"),
        max_value=MAX_LIMIT,
        max_digits=12,
        decimal_places=2,
        help_text="Empty lifts the limit. At 100% new purchases, launches and resumes are "
        "refused until the month ends; running slices go on.",
    )

    def __init__(self, *args: Any, tenant: Tenant, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Only this tenant's members and live tokens are choices: another tenant's id is
        # an invalid choice, answered like any other bad value.
        self.members = {
            str(m.pk): m
            for m in Membership.objects.for_tenant(tenant).select_related("user").order_by("pk")
        }
        self.tokens = {
            str(t.pk): t
            for t in ApiToken.objects.for_tenant(tenant)
            .filter(revoked_at__isnull=True)
            .select_related("user")
            .order_by("name", "pk")
        }
        form_field(self, "whose", forms.ChoiceField).choices = [
            (TENANT, "the whole tenant"),
            *[(f"member:{pk}", f"member {m.user.email or m.user.username}")
              for pk, m in self.members.items()],
            *[(f"token:{pk}", f"API token {t.name} ({t.user.email or t.user.username})")
              for pk, t in self.tokens.items()],
        ]  # fmt: skip

    def whose_label(self) -> str:
        """The chosen `whose` in words, as the page lists it (a valid form)."""
        kind, _, pk = self.cleaned_data["whose"].partition(":")
        if kind == "member":
            user = self.members[pk].user
            return f"member {user.email or user.username}"
        if kind == "token":
            return f"API token {self.tokens[pk].name}"
        return "the tenant"

    def target(self) -> Target:
        """The service's `member` and `token` for the chosen `whose` (a valid form)."""
        kind, _, pk = self.cleaned_data["whose"].partition(":")
        return {
            "member": self.members.get(pk) if kind == "member" else None,
            "token": self.tokens.get(pk) if kind == "token" else None,
        }

"""Reads of the images renters bring: the registry policy's rules and history, what the
policy says of a reference, a tenant's registry logins (never their secrets), and the
login a start pulls with (unsealed there and nowhere else)."""

from __future__ import annotations

from django.db.models import QuerySet

from nodes import selectors as node_selectors
from nodes.image_refs import reference_parts
from nodes.models import AgentState, Node
from nodes.registry_pull import RegistryLogin

from .. import sealing
from ..image_policy import Decision, Rule, decide
from ..models import RegistryCredential, RegistryRule, RegistryRuleChange, Tenant


def registry_rules() -> QuerySet[RegistryRule]:
    return RegistryRule.objects.select_related("updated_by").order_by("pattern")


def registry_rule_changes() -> QuerySet[RegistryRuleChange]:
    return RegistryRuleChange.objects.select_related("changed_by").order_by("-changed_at", "-pk")


def registry_policy_decide(*, reference: str) -> Decision:
    """What the registry policy says of an image reference on no allowlist."""
    rules = [Rule(p, m) for p, m in RegistryRule.objects.values_list("pattern", "mode")]
    return decide(rules, reference)


def registry_policy_open() -> bool:
    """Whether any rule lets renters bring an image (the launch page offers the field)."""
    return RegistryRule.objects.exclude(mode=RegistryRule.Mode.ALLOWLIST).exists()


def registry_agent_nodes() -> tuple[int, int]:
    """(nodes taking slices whose agent runs, nodes taking slices): where "any image"
    rules may place."""
    gpus = node_selectors.placeable_gpus(guaranteed=False)
    taking = Node.objects.filter(pk__in=gpus.values("node_id"))
    return taking.filter(agent__state=AgentState.OK).count(), taking.count()


def registry_credentials_of(*, tenant: Tenant | None) -> QuerySet[RegistryCredential]:
    """The tenant's registry logins: which registry, who set it and when, when it was last
    used; the sealed text is never read here."""
    return (
        RegistryCredential.objects.for_tenant(tenant)
        .select_related("created_by")
        .defer("sealed")
        .order_by("registry")
    )


class LoginUnreadable(Exception):
    """The tenant's login for a registry was sealed under a key the platform no longer has."""


def registry_login_for(*, tenant_id: int, reference: str) -> RegistryLogin | None:
    """The login a start of `reference` pulls with: the tenant's own for its registry, or
    None (an anonymous pull). Raises LoginUnreadable when it cannot be unsealed."""
    registry = reference_parts(reference).registry
    row = RegistryCredential.objects.filter(tenant_id=tenant_id, registry=registry).first()
    if row is None:
        return None
    try:
        data = sealing.unseal(row.sealed)
    except sealing.Unreadable as exc:
        raise LoginUnreadable(str(exc)) from exc
    return RegistryLogin(registry, data.get("username", ""), data.get("password", ""))

"""Images renters bring: ops' registry rules (what may be run from where, and their
history), and each tenant's registry credentials, sealed (tenants.sealing) and never
shown again. The rules' grammar and how one decides is tenants.image_policy."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from ..image_policy import ALLOWLIST, ANY, MODE_WORDS, REGISTRY
from .accounts import TenantScopedQuerySet


class RegistryMode(models.TextChoices):
    ALLOWLIST = ALLOWLIST, MODE_WORDS[ALLOWLIST]
    REGISTRY = REGISTRY, MODE_WORDS[REGISTRY]
    ANY = ANY, MODE_WORDS[ANY]


class RegistryRule(models.Model):
    """One pattern of the registry policy and what it allows (image_policy's grammar)."""

    Mode = RegistryMode

    pattern = models.CharField(
        "pattern",
        max_length=255,
        unique=True,
        help_text="*, a registry (ghcr.io), a path under one (ghcr.io/acme/*) or one "
        "repository (docker.io/library/python).",
    )
    mode = models.CharField("mode", max_length=16, choices=RegistryMode.choices)
    note = models.CharField("why", max_length=500, blank=True)
    created_at = models.DateTimeField("added", auto_now_add=True)
    updated_at = models.DateTimeField("changed", auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="changed by",
    )

    class Meta:
        ordering = ["pattern"]
        verbose_name = "registry rule"
        constraints = [
            models.CheckConstraint(
                condition=Q(mode__in=[ALLOWLIST, REGISTRY, ANY]),
                name="%(app_label)s_%(class)s_mode_known",
                violation_error_message="Unknown registry mode.",
            ),
            models.CheckConstraint(
                condition=~Q(pattern=""),
                name="%(app_label)s_%(class)s_pattern_given",
                violation_error_message="A rule has a pattern.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pattern}: {self.get_mode_display()}"


class RegistryRuleChange(models.Model):
    """One change to the registry policy: who, when, the pattern, its mode before and
    after ("" where there was or is no rule), and why. The ops audit of the policy."""

    changed_at = models.DateTimeField("changed", auto_now_add=True)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="by",
    )
    pattern = models.CharField("pattern", max_length=255)
    old_mode = models.CharField("before", max_length=16, blank=True)
    new_mode = models.CharField("after", max_length=16, blank=True)
    reason = models.CharField("why", max_length=500)

    class Meta:
        ordering = ["-changed_at", "-pk"]
        verbose_name = "registry policy change"
        constraints = [
            models.CheckConstraint(
                condition=~Q(reason=""),
                name="%(app_label)s_%(class)s_reason_given",
                violation_error_message="A registry policy change needs a reason.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pattern}: {self.old_mode or '-'} -> {self.new_mode or '-'}"


class RegistryCredential(models.Model):
    """A tenant's login to one registry, used to pull the images its members bring from
    there (at every start, with the launching tenant's own login). The user name and the
    password or token are sealed together and never shown again, on a page or the API."""

    tenant = models.ForeignKey(
        "tenants.Tenant",
        on_delete=models.CASCADE,
        related_name="registry_credentials",
        verbose_name="tenant",
    )
    registry = models.CharField(
        "registry", max_length=255, help_text="Host or host:port, e.g. ghcr.io."
    )
    sealed = models.TextField("sealed login", editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="set by",
    )
    created_at = models.DateTimeField("set", auto_now_add=True)
    updated_at = models.DateTimeField("changed", auto_now=True)
    last_used_at = models.DateTimeField("last used", null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["registry"]
        verbose_name = "registry credential"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "registry"],
                name="%(app_label)s_%(class)s_one_per_registry",
                violation_error_message="The tenant has a login for this registry already.",
            ),
            models.CheckConstraint(
                condition=~Q(sealed=""),
                name="%(app_label)s_%(class)s_sealed_given",
                violation_error_message="A registry login is stored sealed.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.registry} (tenant {self.tenant_id})"

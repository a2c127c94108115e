"""Forms of the registry pages: ops' registry rules (with the reason every change keeps),
and a tenant's registry login, whose password field is never filled back in."""

from __future__ import annotations

from django import forms

from ..image_policy import MODE_WORDS, MODES


class RegistryRuleForm(forms.Form):
    pattern = forms.CharField(
        max_length=255,
        help_text="*, a registry (ghcr.io, 127.0.0.1:5000), a path under one "
        "(ghcr.io/acme/*) or one repository (docker.io/library/python). The narrowest "
        "matching rule decides; no rule: allowlist only.",
        widget=forms.TextInput(attrs={"placeholder": "ghcr.io/acme/*"}),
    )
    mode = forms.ChoiceField(
        choices=[(m, MODE_WORDS[m]) for m in MODES],
        help_text="'Any image' runs only on nodes whose node agent runs: an image's own "
        "files reach the container toolkit's hooks (CVE-2025-23267, CVE-2026-24260).",
    )
    reason = forms.CharField(
        max_length=500,
        label="Why",
        help_text="Kept in the history below.",
        widget=forms.TextInput(attrs={"placeholder": "Our team's registry, scanned on push"}),
    )


class RegistryRuleRemoveForm(forms.Form):
    reason = forms.CharField(max_length=500, label="Why")


class RegistryLoginForm(forms.Form):
    registry = forms.CharField(
        max_length=255,
        help_text="Host or host:port, as in the image references: ghcr.io, "
        "registry.example.com:5000, docker.io.",
        widget=forms.TextInput(attrs={"placeholder": "ghcr.io", "autocomplete": "off"}),
    )
    username = forms.CharField(
        max_length=255, label="User name", widget=forms.TextInput(attrs={"autocomplete": "off"})
    )
    password = forms.CharField(
        max_length=4096,
        label="Password or access token",
        help_text="Sealed at once and never shown again; a read-only token is enough.",
        # render_value=False: a refused form never sends the secret back to the browser
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}, render_value=False),
    )

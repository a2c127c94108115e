"""Forms for the ops fleet pages; services enforce the rules."""

from typing import Any

from django import forms

from gpuplatform.pages import form_field

from .allowlist import allowlisted_images
from .models import NodePolicy


class NodeForm(forms.Form):
    name = forms.CharField(max_length=63, help_text="Lower-case letters, digits and hyphens.")
    address = forms.CharField(max_length=255, help_text="Host name or IP address.")
    port = forms.IntegerField(min_value=1, max_value=65535, initial=22)
    ssh_user = forms.CharField(max_length=32, initial="gpuplatform", label="SSH user")
    container_network = forms.CharField(
        max_length=64,
        required=False,
        initial="bridge",
        label="Container network",
        help_text="The Docker network slices join: bridge publishes their ports on the node; "
        "none keeps them on their own loopback.",
    )
    access = forms.ChoiceField(
        choices=[
            ("gateway", "Through the platform's SSH gateway (nothing published on the node)"),
            ("direct", "Direct: ports published on the node's address"),
        ],
        initial="gateway",
        required=False,
        label="How renters reach its slices",
    )
    host_key = forms.CharField(
        required=False,
        max_length=4096,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Optional: a known_hosts line you trust (ssh-keyscan output checked out of "
        "band). Empty: the platform reads the key and you approve its fingerprint.",
    )

    def clean_container_network(self) -> str:
        return self.cleaned_data.get("container_network") or "bridge"

    def clean_access(self) -> str:
        return self.cleaned_data.get("access") or "gateway"


class DrainForm(forms.Form):
    reason = forms.CharField(max_length=500, required=False)


class ApproveForm(forms.Form):
    fingerprint = forms.CharField(max_length=128)


class WatchdogOnlyForm(forms.Form):
    accept = forms.TypedChoiceField(choices=[("1", "accept"), ("0", "withdraw")], coerce=int)
    reason = forms.CharField(max_length=500)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in (text or "").splitlines() if line.strip()]


class NodePolicyForm(forms.Form):
    """The node policy as text fields (one item a line); the service checks each value."""

    min_toolkit_version = forms.CharField(max_length=32, label="Minimum NVIDIA Container Toolkit")
    min_runc_version = forms.CharField(max_length=32, label="Minimum runc")
    driver_branches = forms.CharField(
        max_length=200,
        required=False,
        label="Driver branches",
        help_text="Comma-separated, e.g. 535, 550, 570. Empty: any branch.",
    )
    known_fixed_builds = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        label="Known-fixed builds",
        help_text="One a line: component (runc or toolkit), the package's build, then why, "
        "e.g. runc 1.1.5+ds1-1+deb12u1 Debian DSA-5615-1 backports the CVE-2024-21626 fix.",
    )
    probe_image = forms.ChoiceField(
        required=False,
        label="Probe image",
        help_text="One of the allowlisted images (ops add them on /ops/images/), with sh "
        "and the allocation command below. Until one is chosen every node fails the gate.",
    )
    probe_command = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Probe allocation command",
        help_text="One argument a line: allocates the MiB in its environment, exits 0 when "
        "it got them, and when refused exits non-zero printing the CUDA out-of-memory error "
        "(CUDA_ERROR_OUT_OF_MEMORY, or PyTorch's 'CUDA out of memory').",
    )
    probe_environment = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4}),
        label="Probe environment",
        help_text="NAME=value a line; {alloc_mb} is replaced by the MiB to allocate.",
    )
    require_userns_remap = forms.BooleanField(
        required=False,
        label="Require user-namespace remapping",
        help_text="A node passes only when its dockerd remaps user namespaces "
        "(userns-remap), so a container's root is not the node's root.",
    )
    reason = forms.CharField(max_length=500, help_text="Why: kept with the change.")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        current = (self.initial or {}).get("probe_image") or ""
        choices = [(i.reference, f"{i.name} ({i.reference})") for i in allowlisted_images()]
        if not current:
            choices.insert(0, ("", "none set: choose one"))
        elif current not in dict(choices):
            # kept as it is until ops choose another (saving the rest must not drop it)
            choices.insert(0, (current, f"{current} (no longer on the allowlist)"))
        form_field(self, "probe_image", forms.ChoiceField).choices = choices

    def clean(self) -> dict[str, Any] | None:
        data = super().clean()
        if data is not None and not data.get("probe_image"):
            data.pop("probe_image", None)  # none chosen: the rest of the policy still saves
        return data

    @classmethod
    def initial_from(cls, policy: NodePolicy) -> dict[str, object]:
        return {
            "min_toolkit_version": policy.min_toolkit_version,
            "min_runc_version": policy.min_runc_version,
            "driver_branches": ", ".join(policy.driver_branches or []),
            "known_fixed_builds": "\n".join(
                f"{k['component']} {k['build']} {k.get('reason', '')}".strip()
                for k in policy.known_fixed_builds or []
            ),
            "probe_image": policy.probe_image,
            "probe_command": "\n".join(policy.probe_command or []),
            "probe_environment": "\n".join(
                f"{k}={v}" for k, v in (policy.probe_environment or {}).items()
            ),
            "require_userns_remap": policy.require_userns_remap,
        }

    def clean_driver_branches(self) -> list[str]:
        text = self.cleaned_data.get("driver_branches") or ""
        return [b.strip() for b in text.split(",") if b.strip()]

    def clean_known_fixed_builds(self) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        for line in _lines(self.cleaned_data.get("known_fixed_builds", "")):
            parts = line.split(None, 2)
            if len(parts) < 3:
                raise forms.ValidationError(
                    f"{line!r}: write the component, the build and why, separated by spaces."
                )
            out.append({"component": parts[0], "build": parts[1], "reason": parts[2]})
        return out

    def clean_probe_command(self) -> list[str]:
        return _lines(self.cleaned_data.get("probe_command", ""))

    def clean_probe_environment(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for line in _lines(self.cleaned_data.get("probe_environment", "")):
            name, sep, value = line.partition("=")
            if not sep or not name.strip():
                raise forms.ValidationError(f"{line!r}: write NAME=value.")
            out[name.strip()] = value.strip()
        return out

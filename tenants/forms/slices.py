"""Forms of the slice pages: launch (and its live estimate), stop, ops' slice filters and
force-stop, the image allowlist. They turn page fields into the shapes services take;
services enforce the rules and their messages reach the form."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import forms
from django.contrib.auth.models import AnonymousUser, User
from django.db.models import QuerySet
from django.forms import BoundField

from gpuplatform.errors import ServiceError
from gpuplatform.pages import form_field
from gpuplatform.querystring import is_id
from nodes import volumes
from nodes.models import Node

from ..launch_input import clean_command, clean_environment
from ..launch_request import LaunchRequest
from ..models import Image, LaunchTemplate, Purchase, Slice, SshKey, Tenant, Tier, Volume
from ..selectors import image_list, purchases_usable, registry_policy_open, ssh_keys_of
from .estimate import JobForm, model_for_tier
from .fields import TokenField, new_form_token


class PurchaseChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Purchase) -> str:
        left = f"{obj.minutes_left} of {obj.minutes_total} min left"
        if obj.interruptible:  # said in the list: its slices may be preempted with notice
            return f"#{obj.pk} · {obj.tier.name} · interruptible · {left}"
        return f"#{obj.pk} · {obj.tier.name} · {left}"


def lines(text: str) -> list[str]:
    return [line.rstrip("\r") for line in (text or "").split("\n")]


class VolumeChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Volume) -> str:
        return f"{obj.name} · {obj.size_gb} GB · on {obj.node.name}"


class SshKeyChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: SshKey) -> str:
        return f"{obj.name} · {obj.get_key_type_display()} · {obj.fingerprint}"


class ImageChoiceField(forms.ModelChoiceField):
    """The launch's image, from the allowlist the form always sets (so typed as set)."""

    queryset: QuerySet[Image]


class LaunchForm(JobForm):
    field_order = ["purchase", "image"]  # then the job, then how to run it
    MOUNT_ROWS = volumes.MAX_MOUNTS

    purchase = PurchaseChoiceField(queryset=Purchase.objects.none(), empty_label=None)
    image = ImageChoiceField(queryset=Image.objects.none(), empty_label=None)
    image_reference = forms.CharField(
        label="Or an image of your own",
        required=False,
        max_length=255,
        widget=forms.TextInput(attrs={"placeholder": "ghcr.io/acme/train:2"}),
        help_text="An image reference, where the registry policy lets renters bring images "
        "from its registry (your Registries page lists where). It is pulled at every start "
        "with your tenant's own login for the registry and run by digest.",
    )
    model = forms.ChoiceField(label="Model")
    command = forms.CharField(
        required=False,
        max_length=64 * 1024,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "python\nserve.py\n--port\n8000"}),
        help_text="One argument per line, run without a shell. Empty: the image's default.",
    )
    environment = forms.CharField(
        required=False,
        max_length=256 * 1024,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "HF_HOME=/data/hf"}),
        help_text="NAME=value, one per line; the value is everything after the first '='.",
    )
    ssh_key = SshKeyChoiceField(
        label="SSH key",
        queryset=SshKey.objects.none(),
        required=False,
        empty_label="Paste a key below",
        help_text="One registered on your account, or paste one for this slice.",
    )
    ssh_public_key = forms.CharField(
        label="SSH public key",
        required=False,
        max_length=9000,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "ssh-ed25519 AAAA… you@laptop"}),
        help_text="Required for images you reach over SSH.",
    )
    guaranteed = forms.BooleanField(
        label="Guaranteed VRAM (never on an overcommitted GPU)",
        required=False,
        initial=True,
        help_text="Uncheck to allow a GPU whose slices are sold above its physical VRAM "
        "(ops set this only from measured peaks): placement may come sooner, but a "
        "neighbour's peak can squeeze yours. Keep it for online inference.",
    )
    template = forms.ModelChoiceField(
        queryset=LaunchTemplate.objects.none(), required=False, widget=forms.HiddenInput
    )
    idempotency_token = TokenField()

    def __init__(
        self,
        *args: Any,
        tenant: Tenant | None = None,
        user: User | AnonymousUser | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        # Keys are personal: only the signed-in member's own validate (another account's
        # key id is an invalid choice); the newest is offered first.
        keys = form_field(self, "ssh_key", SshKeyChoiceField)
        keys.queryset = ssh_keys_of(user) if user is not None else SshKey.objects.none()
        newest = keys.queryset.first()
        self.has_ssh_keys = newest is not None
        if newest is not None and not self.is_bound:
            self.initial.setdefault("ssh_key", newest.pk)
        templates = form_field(self, "template", forms.ModelChoiceField)
        templates.queryset = LaunchTemplate.objects.filter(is_active=True)
        # Any own purchase validates, so a used one gets the service's reason (and a double
        # submit its first slice); only usable ones are offered.
        purchases = form_field(self, "purchase", PurchaseChoiceField)
        purchases.queryset = Purchase.objects.for_tenant(tenant).select_related("tier")
        self.usable = list(purchases_usable(tenant))
        purchases.widget.choices = [(p.pk, purchases.label_from_instance(p)) for p in self.usable]
        self._preselect()
        form_field(self, "image", ImageChoiceField).queryset = image_list(active_only=True)
        self.brings_images = self._offer_own_images()
        # An SSH image's login home may be a volume too, so the home survives a stop.
        self.home_paths = sorted(
            f"/home/{i.ssh_user}"
            for i in self.images
            if i.connect == Image.Connect.SSH and i.ssh_user not in ("", "root")
        )
        self.fields["idempotency_token"].initial = new_form_token()
        # Any of the tenant's volumes validates (a deleted or busy one gets the service's
        # reason); the ready ones are offered.
        mine = Volume.objects.for_tenant(tenant).select_related("node")
        offered = [v for v in mine.order_by("name") if v.state == Volume.State.READY]
        self.has_volumes = bool(offered)
        for n in range(self.MOUNT_ROWS):
            field = VolumeChoiceField(
                queryset=mine, required=False, label=f"Volume {n + 1}", empty_label="(none)"
            )
            field.widget.choices = [("", "(none)")] + [
                (v.pk, field.label_from_instance(v)) for v in offered
            ]
            self.fields[f"volume_{n}"] = field
            self.fields[f"volume_path_{n}"] = forms.CharField(
                label=f"Mounted at {n + 1}",
                required=False,
                max_length=400,
                initial="/data" if n == 0 else "",
                widget=forms.TextInput(attrs={"placeholder": "/data/models"}),
            )

    def _offer_own_images(self) -> bool:
        """An image of the renter's own is offered where some registry rule allows one;
        else the form is the allowlist's alone, as it always was."""
        if not registry_policy_open():
            del self.fields["image_reference"]
            return False
        chosen = form_field(self, "image", ImageChoiceField)
        chosen.required = False
        chosen.empty_label = "(an image of your own: below)"
        return True

    @property
    def images(self) -> QuerySet[Image]:
        """The images offered (and validated against): the image field's own queryset."""
        return form_field(self, "image", ImageChoiceField).queryset

    def mount_rows(self) -> list[tuple[BoundField, BoundField]]:
        return [(self[f"volume_{n}"], self[f"volume_path_{n}"]) for n in range(self.MOUNT_ROWS)]

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data  # what Form.clean returns, typed
        self._clean_ssh_key(data)
        mounts = []
        for n in range(self.MOUNT_ROWS):
            volume, path = data.get(f"volume_{n}"), (data.get(f"volume_path_{n}") or "").strip()
            if volume is None:
                continue
            if not path:
                self.add_error(
                    f"volume_path_{n}", "Where in the container: under /data or /workspace."
                )
                continue
            mounts.append({"volume": volume.pk, "path": path})
        data["volumes"] = mounts
        return data

    def _clean_ssh_key(self, data: dict[str, Any]) -> None:
        """A registered key chosen stands for the pasted one; both at once is ambiguous."""
        key = data.get("ssh_key")
        if key is None:
            return
        if (data.get("ssh_public_key") or "").strip():
            self.add_error(
                "ssh_public_key",
                f"You chose your registered key {key.name!r} above: pick 'Paste a key "
                "below' there to use this one instead, or empty this field.",
            )
            return
        data["ssh_public_key"] = key.public_key

    def error_field_of(self, field: str | None) -> str | None:
        """A service's `volumes.<n>.volume` / `volumes.<n>.path` is this form's row n."""
        parts = (field or "").split(".")
        if parts[0] == "volumes" and len(parts) == 3 and parts[1].isdigit():
            rows = [n for n in range(self.MOUNT_ROWS) if self.cleaned_data.get(f"volume_{n}")]
            if int(parts[1]) < len(rows):
                n = rows[int(parts[1])]
                return f"volume_{n}" if parts[2] == "volume" else f"volume_path_{n}"
        if parts[0] == "volumes":
            return "volume_0"
        return None

    def _preselect(self) -> None:
        """The purchase asked for (?purchase=) if usable, else the largest usable one (a
        full-price one when there is one: interruptible is chosen, never defaulted), and a
        catalog model the default job fits on its tier."""
        if self.is_bound or not self.usable:
            return
        wanted = self.initial.get("purchase")
        chosen = next((p for p in self.usable if p.pk == wanted), None)
        if chosen is None:
            chosen = max(
                self.usable,
                key=lambda p: (not p.interruptible, p.tier.vram_mb, p.minutes_left),
            )
            self.initial["purchase"] = chosen.pk
        self.initial.setdefault("model", model_for_tier(chosen.tier.vram_mb))

    def clean_command(self) -> list[str]:
        argv = [item for item in lines(self.cleaned_data.get("command", "")) if item.strip()]
        try:
            return clean_command(argv)
        except ServiceError as exc:
            raise forms.ValidationError(exc.message) from exc

    def clean_environment(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for number, line in enumerate(lines(self.cleaned_data.get("environment", "")), 1):
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            if not sep:
                raise forms.ValidationError(f"Line {number}: write NAME=value.")
            name = name.strip()
            if name in env:
                raise forms.ValidationError(f"{name} is set twice.")
            env[name] = value
        try:
            return clean_environment(env)
        except ServiceError as exc:
            raise forms.ValidationError(exc.message) from exc

    def model_request(self) -> dict[str, Any]:
        """The estimator input without the tier: the purchase supplies it. From a
        template, the launch service keeps what its job sets that the page has no field
        for (the share of the slice vLLM reserves among it)."""
        return self.job_mapping(self.chosen_model())

    def launch_request(self) -> LaunchRequest:
        """The launch this valid form asks for, as the API's would be."""
        data = self.cleaned_data
        return LaunchRequest(
            purchase=data["purchase"],
            image=data["image"],
            image_reference=data.get("image_reference") or "",
            model_request=self.model_request(),
            command=data["command"],
            environment=data["environment"],
            ssh_public_key=data["ssh_public_key"],
            guaranteed=data["guaranteed"],
            volumes=data["volumes"],
            template=data["template"],
            idempotency_key=data["idempotency_token"],
        )


def template_initial(template: LaunchTemplate) -> dict[str, Any]:
    """The launch form's fields as a template fills them; the tenant adjusts from there."""
    job = template.model_request or {}
    initial: dict[str, Any] = {
        "template": template.pk,
        "image": template.image_id,
        "command": "\n".join(template.command or []),
        "environment": "\n".join(f"{k}={v}" for k, v in (template.environment or {}).items()),
    }
    catalog = (
        (job.get("model") or {}).get("catalog") if isinstance(job.get("model"), dict) else None
    )
    if catalog:
        initial["model"] = catalog
    hub_model = (job.get("model") or {}).get("hub") if isinstance(job.get("model"), dict) else None
    if hub_model:
        initial["hub_model"] = hub_model
        initial["hub_revision"] = job["model"].get("revision") or ""
    for name in ("workload", "weights_dtype", "kv_cache_dtype", "engine", "batch",
                 "context_tokens", "prefill_chunk", "enforce_eager"):  # fmt: skip
        if name in job:
            initial[name] = job[name]
    return initial


class LaunchEstimateForm(JobForm):
    """The launch page's live estimate: the job's fields, against the chosen purchase's
    tier (any own purchase; none: no tier, only the smallest that fits)."""

    model = forms.ChoiceField(label="Model")

    def __init__(
        self,
        *args: Any,
        tenant: Tenant | None = None,
        tiers: Iterable[Tier] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.tiers = list(tiers)
        wanted = str(self.data.get("purchase", ""))
        self.purchase = (
            Purchase.objects.for_tenant(tenant).select_related("tier").filter(pk=wanted).first()
            if is_id(wanted)
            else None
        )

    def to_mapping(self) -> dict[str, Any]:
        mapping = self.job_mapping(self.chosen_model())
        if self.tiers:
            mapping["tiers_mib"] = [t.vram_mb for t in self.tiers]
        if self.purchase is not None:
            mapping["tier_mib"] = self.purchase.tier.vram_mb
        return mapping


class StopForm(forms.Form):
    """The confirmation step of a stop: only the confirm page posts `confirm`."""

    confirm = forms.BooleanField()


class SliceFilterForm(forms.Form):
    """Ops slice filters; an unknown value means no filter rather than an error page."""

    state = forms.ChoiceField(choices=[("", "any state"), *Slice.State.choices], required=False)
    tenant = forms.ModelChoiceField(
        queryset=Tenant.objects.order_by("name"), required=False, empty_label="any tenant"
    )
    node = forms.ModelChoiceField(
        queryset=Node.objects.order_by("name"), required=False, empty_label="any node"
    )
    image = forms.ModelChoiceField(
        queryset=Image.objects.order_by("name"), required=False, empty_label="any image"
    )

    def filters(self) -> dict[str, Any]:
        """The filters for `selectors.slice_list_for_ops`: none for an invalid form."""
        if not self.is_valid():
            return {}
        data = self.cleaned_data
        node = data.get("node")
        return {
            "state": data.get("state") or "",
            "tenant": data.get("tenant"),
            "node_id": node.pk if node is not None else None,
            "image": data.get("image"),
        }


class ForceStopForm(forms.Form):
    reason = forms.CharField(
        max_length=300, help_text="Recorded on the slice and shown to the tenant."
    )
    confirm = forms.BooleanField(widget=forms.HiddenInput, initial=True)


class ImageForm(forms.Form):
    name = forms.CharField(max_length=64)
    reference = forms.CharField(max_length=255, help_text="e.g. pytorch/pytorch:2.4.0-runtime")
    digest = forms.CharField(
        max_length=71, required=False, help_text="Optional sha256:… to pin the exact image."
    )
    description = forms.CharField(max_length=300, required=False)
    default_command = forms.CharField(
        label="Default command",
        required=False,
        max_length=64 * 1024,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="One argument per line.",
    )
    ports = forms.CharField(
        label="Exposed ports",
        required=False,
        max_length=100,
        help_text="Comma-separated, e.g. 22 for SSH, 8888 for Jupyter.",
    )
    connect = forms.ChoiceField(label="Tenants connect by", choices=Image.Connect.choices)
    ssh_user = forms.CharField(
        label="SSH user",
        max_length=32,
        required=False,
        initial="root",
        help_text="Who the image's sshd logs in with the renter's key (SSH images; root "
        "when empty).",
    )
    is_active = forms.BooleanField(label="Allowed", required=False, initial=True)

    def clean_ssh_user(self) -> str:
        return self.cleaned_data.get("ssh_user", "").strip() or "root"

    def clean_default_command(self) -> list[str]:
        return [i for i in lines(self.cleaned_data.get("default_command", "")) if i.strip()]

    def clean_ports(self) -> list[int]:
        raw = self.cleaned_data.get("ports", "").replace(",", " ").split()
        try:
            return [int(p) for p in raw]
        except ValueError as exc:
            raise forms.ValidationError("Ports are whole numbers, e.g. 22, 8888.") from exc

    @classmethod
    def initial_for(cls, image: Image) -> dict[str, Any]:
        return {
            "name": image.name,
            "reference": image.reference,
            "digest": image.digest,
            "description": image.description,
            "default_command": "\n".join(image.default_command or []),
            "ports": ", ".join(str(p) for p in image.ports or []),
            "connect": image.connect,
            "ssh_user": image.ssh_user,
            "is_active": image.is_active,
        }

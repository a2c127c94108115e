"""The job the estimator sizes, as a form ("will it fit?" and the launch page share it):
page fields -> an estimator request mapping, and the estimator's refusals put on the
fields they name."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from django import forms

import estimator
from estimator import hub
from estimator import request as accepted
from gpuplatform import pages
from gpuplatform.pages import form_field

from ..selectors import tier_list

LABELS = {
    "training": "fine-tuning / training",
    "transformers": "transformers (plain)",
    "vllm": "vLLM (paged KV)",
    "lora": "LoRA",
    "qlora": "QLoRA",
    "full": "full fine-tune",
    "adamw": "AdamW (mixed precision)",
    "adamw_bf16": "AdamW, pure bf16",
    "adam8bit": "8-bit Adam",
    "sgd_momentum": "SGD with momentum",
    "auto": "auto (16-bit)",
}


def _choices(values: tuple[str, ...]) -> list[tuple[str, str]]:
    """The estimator's own accepted values: the form never offers one it would refuse."""
    return [(v, LABELS.get(v, v)) for v in values]


WORKLOADS = _choices(accepted.WORKLOADS)


# "": the request leaves weights_dtype out, and the estimator takes the checkpoint's own
# format (a pre-quantized checkpoint as stored; 16-bit otherwise).
WEIGHTS = [("", "as the checkpoint stores it"), *_choices(accepted.WEIGHT_DTYPES)]


KV = _choices(accepted.KV_DTYPES)


ENGINES = _choices(accepted.ENGINES)


METHODS = _choices(accepted.METHODS)


OPTIMIZERS = _choices(accepted.OPTIMIZERS)


DEFAULT_MODEL = "meta-llama/Llama-3.1-8B"


def _checked(value: object, check: Callable[[str], object]) -> str:
    """A stripped Hub id or revision that ``check`` accepts ("" when not given)."""
    text = str(value or "").strip()
    if text:
        try:
            check(text)
        except estimator.EstimatorError as exc:
            raise forms.ValidationError(exc.message) from exc
    return text


class JobForm(forms.Form):
    """The job the estimator sizes: shared by "will it fit?" and the launch page."""

    model = forms.ChoiceField(label="Model", required=False)
    hub_model = forms.CharField(
        label="Hugging Face model id",
        required=False,
        max_length=hub.MAX_REPO_ID,
        widget=forms.TextInput(attrs={"placeholder": "Qwen/Qwen3-8B", "spellcheck": "false"}),
        help_text="Instead of the list: read from the Hub (config.json and the safetensors "
        "headers, never the weights).",
    )
    hub_revision = forms.CharField(
        label="Revision",
        required=False,
        max_length=hub.MAX_REVISION,
        widget=forms.TextInput(attrs={"placeholder": hub.DEFAULT_REVISION, "spellcheck": "false"}),
        help_text="Branch, tag or commit of the model id (empty: main).",
    )
    workload = forms.ChoiceField(choices=WORKLOADS, initial="inference")
    weights_dtype = forms.ChoiceField(label="Weights", choices=WEIGHTS, initial="", required=False)
    kv_cache_dtype = forms.ChoiceField(label="KV cache", choices=KV, initial="bf16")
    engine = forms.ChoiceField(choices=ENGINES, initial="transformers")
    batch = forms.IntegerField(min_value=1, max_value=100_000, initial=1)
    context_tokens = forms.IntegerField(
        label="Context (tokens)", min_value=1, max_value=10_000_000, initial=4096
    )
    method = forms.ChoiceField(
        label="Training method", choices=METHODS, initial="lora", required=False
    )
    optimizer = forms.ChoiceField(choices=OPTIMIZERS, initial="adamw", required=False)
    gradient_checkpointing = forms.BooleanField(label="Gradient checkpointing", required=False)
    prefill_chunk = forms.IntegerField(
        label="Prefill chunk (tokens)",
        min_value=1,
        max_value=10_000_000,
        required=False,
        help_text="Empty: the whole prompt at once (vLLM: 2048).",
    )
    enforce_eager = forms.BooleanField(label="vLLM eager mode (no CUDA graphs)", required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        model = form_field(self, "model", forms.ChoiceField)
        model.choices = [(name, name) for name in sorted(estimator.CATALOG)]
        model.initial = DEFAULT_MODEL

    def clean_hub_model(self) -> str:
        """A Hub id, checked before the Hub is asked anything."""
        return _checked(self.cleaned_data.get("hub_model"), hub.check_repo_id)

    def clean_hub_revision(self) -> str:
        return _checked(self.cleaned_data.get("hub_revision"), hub.check_revision)

    def hub_source(self) -> dict[str, Any] | None:
        """The model as a Hub id (`{"hub": id, "revision": rev}`), or None: not given."""
        data = self.cleaned_data
        if not data.get("hub_model"):
            return None
        return {"hub": data["hub_model"], "revision": data.get("hub_revision") or "main"}

    def chosen_model(self) -> dict[str, Any]:
        """The Hub id when one is given, else the catalog model."""
        return self.hub_source() or {"catalog": self.cleaned_data.get("model") or DEFAULT_MODEL}

    def job_mapping(self, model: dict[str, Any]) -> dict[str, Any]:
        """The estimator request for the cleaned job, without any tier."""
        data = self.cleaned_data
        mapping: dict[str, Any] = {
            "model": model,
            "workload": data["workload"],
            "kv_cache_dtype": data["kv_cache_dtype"],
            "engine": data["engine"],
            "batch": data["batch"],
            "context_tokens": data["context_tokens"],
        }
        # Only when set: a job that leaves them alone keeps the request it always had.
        if data.get("weights_dtype"):
            mapping["weights_dtype"] = data["weights_dtype"]
        if data.get("prefill_chunk"):
            mapping["prefill_chunk"] = data["prefill_chunk"]
        if data.get("enforce_eager"):
            mapping["enforce_eager"] = True
        if data["workload"] == "training":
            mapping.update(
                method=data.get("method") or "lora",
                optimizer=data.get("optimizer") or "adamw",
                gradient_checkpointing=bool(data.get("gradient_checkpointing")),
                seq_len=data["context_tokens"],
                micro_batch=data["batch"],
            )
        return mapping


def _default_job(model: str, tier_mib: int) -> dict[str, Any]:
    """The job the forms show before anyone changes a field, with this model and tier."""
    fields = JobForm.base_fields
    job = {
        name: fields[name].initial
        for name in ("workload", "weights_dtype", "kv_cache_dtype", "engine", "batch")
        if fields[name].initial != ""  # weights as stored: left out of the request
    }
    return {
        **job,
        "context_tokens": fields["context_tokens"].initial,
        "model": {"catalog": model},
        "tier_mib": tier_mib,
    }


@lru_cache(maxsize=64)
def model_for_tier(tier_mib: int) -> str:
    """The catalog model to preselect for a tier: the default model when the default job
    fits the tier with it, else the largest catalog model that fits, else the smallest
    (the closest to fitting)."""
    fits: list[tuple[float, str]] = []
    sizes: list[tuple[float, str]] = []
    for name in sorted(estimator.CATALOG):
        try:
            result = estimator.estimate(
                estimator.EstimateRequest.from_mapping(_default_job(name, tier_mib)),
                suggestions=False,
            )
        except estimator.EstimatorError:  # e.g. a context longer than the model's
            continue
        sizes.append((result.total_mib, name))
        if result.fits:
            if name == DEFAULT_MODEL:
                return name
            fits.append((result.total_mib, name))
    if fits:
        return max(fits)[1]
    return min(sizes)[1] if sizes else DEFAULT_MODEL


class FitForm(JobForm):
    field_order = ["model", "hub_model", "hub_revision", "config_json"]  # then JobForm's order

    config_json = forms.CharField(
        label="…or paste a config.json",
        required=False,
        max_length=1024 * 1024,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": '{"model_type": "llama", …}'}),
    )
    tier_mib = forms.TypedChoiceField(label="Tier", coerce=int, required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tiers = list(tier_list())
        tier = form_field(self, "tier_mib", forms.TypedChoiceField)
        tier.choices = [(t.vram_mb, t.name) for t in self.tiers]
        if self.tiers:
            tier.initial = self.tiers[-1].vram_mb

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("hub_model") and str(data.get("config_json") or "").strip():
            self.add_error("hub_model", "Give a model id or paste a config.json, not both.")
        return data

    def to_mapping(self) -> dict[str, Any]:
        data = self.cleaned_data
        model: dict[str, Any]
        if data.get("config_json", "").strip():
            model = {"config_json": data["config_json"]}
        else:
            model = self.chosen_model()
        mapping = self.job_mapping(model)
        if self.tiers:
            mapping["tiers_mib"] = [t.vram_mb for t in self.tiers]
        if data.get("tier_mib"):
            mapping["tier_mib"] = data["tier_mib"]
        return mapping


# Where a suggestion's change lands in the form: training names its batch and length
# differently from the job's fields (job_mapping copies batch and context into them).
FORM_FIELD_FOR = {"micro_batch": "batch", "seq_len": "context_tokens"}


def error_field(form: forms.Form, field: str) -> str | None:
    """The form field an estimator error names: `model.config_json` -> config_json,
    `seq_len` -> context_tokens, `model.num_layers` -> the model (or pasted config)."""
    aliases = {**FORM_FIELD_FOR, "hub": "hub_model", "revision": "hub_revision"}
    if "config_json" in form.fields and str(form.data.get("config_json", "")).strip():
        aliases["model"] = "config_json"  # the pasted config is what describes the model
    elif "hub_model" in form.fields and str(form.data.get("hub_model", "")).strip():
        aliases["model"] = "hub_model"  # the model read from the Hub
    return pages.error_field(form, field, aliases=aliases)


def add_estimator_error(form: forms.Form, exc: estimator.EstimatorError) -> None:
    """Put the estimator's refusal on the field it names, or on the form."""
    name = error_field(form, exc.field)
    if name:
        form.add_error(name, exc.message)
    else:
        form.add_error(None, f"{exc.field}: {exc.message}" if exc.field else exc.message)


def error_summary(form: forms.Form) -> str:
    """One line above the (cleared) result: which fields to fix."""
    parts = []
    for name, errors in form.errors.items():
        label = form.fields[name].label if name in form.fields else ""
        label = label or name.replace("_", " ")
        text = " ".join(str(e) for e in errors)  # an ErrorList reads as text
        parts.append(text if name == "__all__" else f"{label}: {text}")
    return "Nothing estimated: " + "; ".join(parts)

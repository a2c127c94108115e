"""The job the estimator sizes, as a form ("will it fit?" and the launch page share it):
page fields -> an estimator request mapping, and the estimator's refusals put on the
fields they name."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from django import forms

import estimator
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


WEIGHTS = _choices(accepted.WEIGHT_DTYPES)


KV = _choices(accepted.KV_DTYPES)


ENGINES = _choices(accepted.ENGINES)


METHODS = _choices(accepted.METHODS)


OPTIMIZERS = _choices(accepted.OPTIMIZERS)


DEFAULT_MODEL = "meta-llama/Llama-3.1-8B"


class JobForm(forms.Form):
    """The job the estimator sizes: shared by "will it fit?" and the launch page."""

    model = forms.ChoiceField(label="Model", required=False)
    workload = forms.ChoiceField(choices=WORKLOADS, initial="inference")
    weights_dtype = forms.ChoiceField(label="Weights", choices=WEIGHTS, initial="bf16")
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

    def job_mapping(self, model: dict[str, Any]) -> dict[str, Any]:
        """The estimator request for the cleaned job, without any tier."""
        data = self.cleaned_data
        mapping: dict[str, Any] = {
            "model": model,
            "workload": data["workload"],
            "weights_dtype": data["weights_dtype"],
            "kv_cache_dtype": data["kv_cache_dtype"],
            "engine": data["engine"],
            "batch": data["batch"],
            "context_tokens": data["context_tokens"],
        }
        # Only when set: a job that leaves them alone keeps the request it always had.
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
    field_order = ["model", "config_json"]  # the rest keep the order JobForm gives them

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

    def to_mapping(self) -> dict[str, Any]:
        data = self.cleaned_data
        model: dict[str, Any]
        if data.get("config_json", "").strip():
            model = {"config_json": data["config_json"]}
        else:
            model = {"catalog": data.get("model") or DEFAULT_MODEL}
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
    aliases = dict(FORM_FIELD_FOR)
    if "config_json" in form.fields and str(form.data.get("config_json", "")).strip():
        aliases["model"] = "config_json"  # the pasted config is what describes the model
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

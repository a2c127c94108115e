"""`gpp estimate`: a model's peak VRAM from the platform's estimator (POST
/api/v1/estimates/), a catalog model, a Hugging Face model id (the platform reads it from
the Hub) or a local config.json, with the verdict per tier."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from cli import output
from cli.client import CliError
from cli.common import api, json_option

CONFIG_MAX_BYTES = 1024 * 1024  # the API takes JSON bodies up to 1 MiB


def job_options(command: Any) -> Any:
    """The estimator's job as flags; shared by `estimate` and `launch`."""
    options = [
        click.option("--config", "config_json", type=click.Path(dir_okay=False, path_type=Path),
                     help="A local Hugging Face config.json instead of a catalog model."),
        click.option("--hub", "hub_id", metavar="ID",
                     help="A Hugging Face model id (e.g. Qwen/Qwen3-8B), read from the Hub by "
                          "the platform: its config.json and safetensors headers."),
        click.option("--revision", "hub_revision", metavar="REV",
                     help="The --hub model's branch, tag or commit (default: main)."),
        click.option("--workload", type=click.Choice(["inference", "training"]),
                     help="inference (default) or training."),
        click.option("--dtype", "weights_dtype", help="Weights as loaded: bf16, int8, nf4..."),
        click.option("--kv-dtype", "kv_cache_dtype", help="The KV cache's: auto, fp8..."),
        click.option("--engine", type=click.Choice(["transformers", "vllm"]),
                     help="transformers (default) or vllm."),
        click.option("--context", "context_tokens", type=click.IntRange(1),
                     help="Tokens of context per sequence."),
        click.option("--batch", type=click.IntRange(1), help="Sequences at once."),
        click.option("--set", "settings", multiple=True, metavar="NAME=VALUE",
                     help="Any other estimator setting (VALUE read as JSON when it parses)."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def read_config_json(path: Path) -> str:
    try:
        text = path.read_text()
    except OSError as exc:
        raise click.BadParameter(f"{path}: {exc.strerror}", param_hint="--config") from exc
    if len(text.encode()) > CONFIG_MAX_BYTES:
        raise click.BadParameter(f"{path} is larger than 1 MiB", param_hint="--config")
    return text


def build_job(
    model: str | None,
    config_json: Path | None,
    *,
    base: dict[str, Any] | None = None,
    **flags: Any,
) -> dict[str, Any]:
    """The estimator's request: `base` (a launch file's job), then the flags over it."""
    job = dict(base or {})
    hub_id, revision = flags.pop("hub_id", None), flags.pop("hub_revision", None)
    if sum(bool(x) for x in (model, config_json, hub_id)) > 1:
        raise click.UsageError("give one of a catalog MODEL, --hub or --config")
    if revision and not hub_id:
        raise click.UsageError("--revision goes with --hub (a Hugging Face model id)")
    if config_json is not None:
        job["model"] = {"config_json": read_config_json(config_json)}
    elif hub_id:
        job["model"] = {"hub": hub_id, "revision": revision or "main"}
    elif model:
        job["model"] = {"catalog": model}
    settings = flags.pop("settings", ()) or ()
    for name, value in flags.items():
        if value is not None:
            job[name] = value
    for pair in settings:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r}: expected NAME=VALUE", param_hint="--set")
        job[name] = _json_or_text(value)
    if "model" not in job:
        raise click.UsageError(
            "say which model: a catalog name (gpp estimate --models), --hub ID or --config"
        )
    return job


def _tier_sizes(client: Any, first: dict[str, Any]) -> list[dict[str, Any]]:
    """The platform's tiers; without a token, the sizes the estimator knows."""
    if client.token:
        rows = [t for t in client.all("/tiers/") if t.get("is_active", True)]
        return [{"tier": t["id"], "name": t["name"], "vram_mb": t["vram_mb"]} for t in rows]
    sizes = (first.get("request") or {}).get("tiers_mib") or []
    return [{"tier": None, "name": output.gib(mib), "vram_mb": mib} for mib in sizes]


def verdicts(client: Any, job: dict[str, Any]) -> dict[str, Any]:
    """The estimate, then the verdict against each tier: the estimator decides what is
    usable of a tier (an engine may keep a share), so each tier is asked, not computed."""
    first = client.post("/estimates/", {k: v for k, v in job.items() if k != "tier_mib"},
                        auth=bool(client.token))  # fmt: skip
    rows = []
    for tier in sorted(_tier_sizes(client, first), key=lambda t: t["vram_mb"]):
        answer = client.post("/estimates/", {**job, "tier_mib": tier["vram_mb"]},
                             auth=bool(client.token))  # fmt: skip
        rows.append({**tier, "usable_mib": answer.get("usable_mib"), "fits": answer.get("fits"),
                     "total_mib": answer.get("total_mib"),
                     "suggestions": answer.get("suggestions", [])})  # fmt: skip
    fitting = next((r for r in rows if r["fits"]), None)
    return {"estimate": first, "tiers": rows, "smallest_fitting_tier": fitting}


def _describe(estimate: dict[str, Any]) -> str:
    model = estimate.get("model") or {}
    request = estimate.get("request") or {}
    return (
        f"{model.get('name') or 'your model'}: {estimate.get('workload')}, "
        f"{estimate.get('weights_dtype')} weights, {estimate.get('engine')}, "
        f"batch {request.get('batch')}, {request.get('context_tokens')} tokens"
    )


@click.command()
@click.argument("model", required=False)
@job_options
@click.option("--models", "list_models", is_flag=True, help="List the catalog's models.")
@json_option
def estimate(
    model: str | None, config_json: Path | None, list_models: bool, as_json: bool, **flags: Any
) -> None:
    """Estimate MODEL's peak VRAM (a catalog name, a Hugging Face model id, --hub ID, or
    --config config.json) and say which tiers it fits. Exits 0 whether or not it fits;
    `fits` per tier is in --json."""
    client = api()
    if list_models:
        catalog = client.get("/estimates/models/", auth=bool(client.token))
        if as_json:
            output.emit_json(catalog["results"])
        else:
            output.table(
                ["MODEL", "PARAMETERS", "SOURCE"],
                ([m["name"], f"{m['params'] / 1e9:.2f} B", m["source"]]
                 for m in catalog["results"]),
            )  # fmt: skip
        return
    if model and config_json is None and not flags.get("hub_id"):
        names = {
            m["name"] for m in client.get("/estimates/models/", auth=bool(client.token))["results"]
        }
        if model not in names:  # not a catalog name: a Hugging Face model id
            flags["hub_id"], model = model, None
    job = build_job(model, config_json, **flags)
    try:
        result = verdicts(client, job)
    except CliError as exc:
        if exc.status == 400:
            exc.message = f"the estimator refused the job: {exc.message}"
        raise
    if as_json:
        output.emit_json(result)
        return
    first = result["estimate"]
    output.plain(f"{_describe(first)}: peak {first['total_mib']:,.0f} MiB")
    output.table(
        ["TIER", "VRAM", "USABLE", "VERDICT"],
        ([row["name"], output.gib(row["vram_mb"]),
          f"{row['usable_mib']:,.0f} MiB" if row["usable_mib"] is not None else "",
          "fits" if row["fits"] else "does not fit"] for row in result["tiers"]),
    )  # fmt: skip
    fitting = result["smallest_fitting_tier"]
    if fitting:
        output.plain(f"Smallest tier that fits: {fitting['name']}.")
        return
    output.plain("No tier fits. What would help on the largest:")
    largest = result["tiers"][-1] if result["tiers"] else {"suggestions": []}
    for hint in largest["suggestions"][:5]:
        verdict = "fits" if hint.get("fits") else "still too big"
        output.plain(f"  - {hint['label']}: {hint['total_mib']:,.0f} MiB ({verdict})")

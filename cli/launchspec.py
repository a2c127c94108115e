"""A launch as `gpp launch` sends it: a YAML or TOML file and the flags over it, with the
names a person writes (an image's name, a tier, a volume's name) turned into the API's ids.

    image: CUDA base              # a name or an id (gpp images), or a reference of your
                                  # own where ops allow its registry: ghcr.io/acme/train:2
    purchase: 12                  # or  tier: 8  (a purchase of that tier not in use)
    model: Qwen/Qwen2.5-1.5B      # a catalog model, or  config: ./config.json
    job: {context_tokens: 2048}   # the estimator's other settings
    command: [python, serve.py]   # or one string, split as a shell would
    environment: {HF_HOME: /data/hf}
    ssh_key: ~/.ssh/id_ed25519.pub
    volumes: [{volume: ckpt, path: /data/ckpt}]   # or "ckpt:/data/ckpt"
    guaranteed: true
"""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path
from typing import Any

import click
import yaml

from cli import output
from cli.client import Api, CliError, refused
from cli.common import find_by_name_or_id, find_tier
from cli.estimate import build_job

FILE_KEYS = frozenset(
    {"image", "purchase", "tier", "model", "config", "job", "command", "environment",
     "ssh_key", "volumes", "guaranteed"}
)  # fmt: skip
DEFAULT_KEYS = ("id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub")


def read_file(path: Path) -> dict[str, Any]:
    """The launch file's keys; a usage error (exit 2) names what is wrong with it."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise click.BadParameter(f"{path}: {exc.strerror}", param_hint="FILE") from exc
    try:
        if path.suffix.lower() == ".toml":
            data: Any = tomllib.loads(text)
        else:
            data = yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise click.BadParameter(f"{path} does not parse: {exc}", param_hint="FILE") from exc
    if not isinstance(data, dict):
        raise click.BadParameter(f"{path} is not a mapping of launch settings", param_hint="FILE")
    unknown = sorted(set(data) - FILE_KEYS)
    if unknown:
        raise click.BadParameter(
            f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(FILE_KEYS))}",
            param_hint="FILE",
        )
    if "config" in data:  # a config.json next to the launch file, as people keep them
        data["config"] = (path.parent / Path(str(data["config"])).expanduser()).resolve()
    return data


def ssh_key_text(value: str | None) -> str:
    """A public key line, given as the line itself or a path to a .pub file."""
    if not value:
        return ""
    text = str(value).strip()
    if text.startswith(("ssh-", "ecdsa-", "sk-")):
        return text
    path = Path(text).expanduser()
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise click.BadParameter(f"{path}: {exc.strerror}", param_hint="--ssh-key") from exc


def default_ssh_key() -> str:
    """The user's own public key, for an image with its own sshd (`gpp ssh` logs in with
    it), when none was given."""
    for name in DEFAULT_KEYS:
        path = Path.home() / ".ssh" / name
        if path.is_file():
            output.note(f"Using {path} as the slice's SSH key (--ssh-key to choose another).")
            return path.read_text().strip()
    return ""


def _mounts(values: list[Any]) -> list[tuple[str, str]]:
    mounts = []
    for value in values:
        if isinstance(value, dict) and {"volume", "path"} <= set(value):
            mounts.append((str(value["volume"]), str(value["path"])))
        elif isinstance(value, str) and ":" in value:
            volume, _, where = value.partition(":")
            mounts.append((volume, where))
        else:
            raise click.BadParameter(f"{value!r}: expected VOLUME:PATH", param_hint="--volume")
    return mounts


def free_purchase(client: Api, tier: dict[str, Any]) -> dict[str, Any]:
    """A purchase of the tier with minutes left that no slice uses; the one bought last."""
    rows = client.all("/purchases/", tier=tier["id"], has_minutes_left="true")
    free = [p for p in rows if not p.get("live_slices")]
    if not free:
        raise refused(
            "no_free_purchase",
            f"No purchase of {tier['name']} with minutes left and no slice on it: "
            f"buy one with `gpp buy {tier['vram_mb'] // 1024} --hours N`.",
        )
    return max(free, key=lambda p: (p["created_at"], p["id"]))


def build(
    client: Api,
    spec: dict[str, Any],
    *,
    model: str | None,
    config_json: Path | None,
    purchase: int | None,
    tier: str | None,
    image: str | None,
    command: str | None,
    env: dict[str, str],
    ssh_key: str | None,
    volumes: tuple[str, ...],
    guaranteed: bool | None,
    job_flags: dict[str, Any],
) -> dict[str, Any]:
    """The POST /api/v1/slices/ body: the file's values, the flags over them."""
    # what the command line lacks is said before anything is asked of the API
    chosen_image = image if image is not None else spec.get("image")
    if chosen_image is None:
        raise click.UsageError("say which image: --image NAME (gpp images lists them)")
    job = _job(spec, model=model, config_json=config_json, job_flags=job_flags)
    found_image = _image(client, str(chosen_image))
    chosen_purchase = _purchase_id(client, spec, purchase=purchase, tier=tier)

    raw_command = command if command is not None else spec.get("command", [])
    argv = shlex.split(raw_command) if isinstance(raw_command, str) else list(raw_command)

    environment = {str(k): str(v) for k, v in (spec.get("environment") or {}).items()}
    environment.update(env)

    key = ssh_key_text(ssh_key if ssh_key is not None else spec.get("ssh_key"))
    if not key and ssh_key is None and found_image.get("connect") == "ssh":
        key = default_ssh_key()
    mounts = _volume_mounts(client, spec, volumes)

    body: dict[str, Any] = {
        "purchase": int(chosen_purchase),
        **({"image": found_image["id"]} if "id" in found_image else found_image),
        "model": job,
        "command": [str(a) for a in argv],
        "environment": environment,
        "ssh_public_key": key,
        "volumes": mounts,
    }
    chosen_guaranteed = guaranteed if guaranteed is not None else spec.get("guaranteed")
    if chosen_guaranteed is not None:
        body["guaranteed"] = bool(chosen_guaranteed)
    return body


def _image(client: Api, text: str) -> dict[str, Any]:
    """The allowlisted image a name or id picks; else, for what reads as an image reference
    (a tag, a registry or a path: `ghcr.io/acme/train:2`), the reference itself, which the
    platform runs where the registry policy lets renters bring it (and refuses naming the
    policy otherwise)."""
    images = client.all("/images/")
    try:
        return find_by_name_or_id(images, text, kind="image")
    except CliError:
        if not any(c in text for c in "/:@") or " " in text.strip():
            raise
    return {"image_reference": text.strip()}


def _job(
    spec: dict[str, Any],
    *,
    model: str | None,
    config_json: Path | None,
    job_flags: dict[str, Any],
) -> dict[str, Any]:
    """The estimator's job: the flags' model or config, else the file's, with the file's
    `job` settings under the flags'."""
    if model is None and config_json is None:
        model, config_json = spec.get("model"), spec.get("config")
    base = spec.get("job") or {}
    if not isinstance(base, dict):
        raise click.BadParameter("`job` must be a mapping of estimator settings", param_hint="FILE")
    return build_job(model, config_json, base=base, **job_flags)


def _purchase_id(
    client: Api, spec: dict[str, Any], *, purchase: int | None, tier: str | None
) -> Any:
    """The purchase that pays: the one named (as given: the body makes it an int), else a
    free one of the tier named."""
    chosen_purchase = purchase if purchase is not None else spec.get("purchase")
    chosen_tier = tier if tier is not None else spec.get("tier")
    if chosen_purchase is None:
        if chosen_tier is None:
            raise click.UsageError("say what pays: --purchase ID or --tier GB (gpp usage)")
        found_tier = find_tier(client.all("/tiers/"), str(chosen_tier))
        chosen_purchase = free_purchase(client, found_tier)["id"]
    return chosen_purchase


def _volume_mounts(
    client: Api, spec: dict[str, Any], volumes: tuple[str, ...]
) -> list[dict[str, Any]]:
    """The mounts given (flags over the file's), each volume named by its id."""
    mounts = _mounts(list(volumes) if volumes else list(spec.get("volumes") or []))
    owned = client.all("/volumes/") if mounts else []
    return [
        {"volume": find_by_name_or_id(owned, name, kind="volume")["id"], "path": where}
        for name, where in mounts
    ]

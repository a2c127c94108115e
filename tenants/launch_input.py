"""A launch's fields as a tenant gives them (the page, the API, a template), checked and
normalised before anything is reserved: the environment, the command, the SSH key, and the
job the pre-launch VRAM estimate reads. Pure: no database; a refusal is a ServiceError
naming the field."""

from __future__ import annotations

import re

import estimator
from estimator.hub import HubReader
from gpuplatform.errors import ServiceError
from nodes import command_env, isolation

from .hub import hub_model
from .ssh_keys import ssh_public_key_parse

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


# The tenant's own connection secrets, set by the platform from the launch's fields; the
# variables that change isolation are nodes.isolation's one list.
CONNECTION_ENV = {
    "PUBLIC_KEY": "it carries the SSH key given with the launch (the public_key field)",
    "JUPYTER_TOKEN": "it carries the slice's Jupyter token, made by the platform",
}


MAX_ENV = 64


MAX_ENV_VALUE = 4096


MAX_COMMAND_ITEMS = 64


MAX_COMMAND_ITEM = 4096


def clean_environment(environment: object) -> dict[str, str]:
    if environment in (None, ""):
        return {}
    if not isinstance(environment, dict):
        raise ServiceError("The environment is an object of NAME: value.", field="environment")
    if len(environment) > MAX_ENV:
        raise ServiceError(
            f"At most {MAX_ENV} environment variables.", code="max_length", field="environment"
        )
    out: dict[str, str] = {}
    for name, value in environment.items():
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            raise ServiceError(
                f"{str(name)[:40]!r} is not a valid variable name: letters, digits and _ "
                "only, not starting with a digit (no '=', spaces or shell characters).",
                field="environment",
            )
        upper = name.upper()  # case-blind: never let a near-miss spelling through
        reason = CONNECTION_ENV.get(upper) or isolation.reserved_reason(upper)
        if reason:
            raise ServiceError(
                f"{name} cannot be set: {reason}.", code="reserved_variable", field="environment"
            )
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ServiceError(f"The value of {name} must be text.", field="environment")
        value = str(value)
        if len(value) > MAX_ENV_VALUE or any(c in value for c in "\x00\n\r"):
            raise ServiceError(
                f"The value of {name} must be one line of at most {MAX_ENV_VALUE} characters.",
                field="environment",
            )
        out[name] = value
    return out


def clean_command(command: object) -> list[str]:
    """The launch's argv, checked. One that sets, unsets or clears a reserved variable is
    refused naming it (nodes.command_env: a courtesy, the node is the boundary)."""
    if command in (None, "", []):
        return []
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        raise ServiceError(
            'The command is a list of arguments, e.g. ["python", "serve.py", "--port", "8000"].',
            field="command",
        )
    if len(command) > MAX_COMMAND_ITEMS:
        raise ServiceError(
            f"At most {MAX_COMMAND_ITEMS} arguments.", code="max_length", field="command"
        )
    for item in command:
        if len(item) > MAX_COMMAND_ITEM or "\x00" in item:
            raise ServiceError(
                f"Each argument is at most {MAX_COMMAND_ITEM} characters, without NUL bytes.",
                field="command",
            )
    if command_env.unexpanded_syntax(command):
        raise ServiceError(command_env.UNEXPANDED_REFUSAL, field="command")
    if not command[0].strip():
        raise ServiceError("The command's first argument is the program to run.", field="command")
    refused = command_env.command_reserved(command)
    if refused:
        raise ServiceError(refused.message, code="reserved_variable", field="command")
    return command


def clean_ssh_key(key: str, *, required: bool) -> str:
    """The key a slice's sshd lets in, read as an account's keys are (tenants.ssh_keys:
    its type, and the key itself decoded), the comment kept."""
    if not " ".join((key or "").split()):
        if required:
            raise ServiceError(
                "This image connects over SSH: paste your public key (ssh-ed25519 …).",
                field="ssh_public_key",
            )
        return ""
    try:
        parsed = ssh_public_key_parse(key)
    except ServiceError as exc:  # the same refusal, on this form's field
        raise ServiceError(exc.message, code=exc.code, field="ssh_public_key") from exc
    return f"{parsed.public_key} {parsed.comment}".strip()


def launch_estimate_input(
    model_request: object, tier_mib: int, *, hub: HubReader | None = None
) -> estimator.EstimateRequest:
    """The job's estimate request on ``tier_mib``. A launch passes ``hub``, the reader
    tenants.hub.hub_prefetch made before its transaction (no network inside it)."""
    if not isinstance(model_request, dict) or not model_request:
        raise ServiceError(
            'Describe the job for the VRAM check, e.g. {"model": {"catalog": '
            '"Qwen/Qwen2.5-7B"}, "weights_dtype": "bf16", "context_tokens": 4096}.',
            field="model",
        )
    for key in ("tier_mib", "tiers_mib"):
        if key in model_request:
            raise ServiceError(
                f"{key} comes from your purchase's tier; leave it out.",
                code="unknown_field",  # the estimator knows it; a launch does not take it
                field=f"model.{key}",
            )
    try:
        return estimator.EstimateRequest.from_mapping(
            {**model_request, "tier_mib": tier_mib}, hub=hub or hub_model
        )
    except estimator.EstimatorError as exc:
        raise ServiceError(
            exc.message, code=exc.code, field=f"model.{exc.field}" if exc.field else "model"
        ) from exc

"""The environment variables that change a slice's isolation, in one place, each with why.

No tenant may set one (a launch naming one is refused with the reason); an image whose own
configuration sets one cannot be allowlisted, except the few CUDA base images ship with
values the platform overrides at run time (`IMAGE_MAY_SET`); and a started container's
effective environment is checked against the same list (`container_env_problems`).
Pure Python: no Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

QUOTA_SWITCH = "the quota library reads it"

# name -> why a tenant may not set it
RESERVED_NAMES: dict[str, str] = {
    # the quota library's own knobs (HAMi-core's documented variables)
    "CUDA_DISABLE_CONTROL": "it switches the quota library's VRAM enforcement off",
    "CUDA_DEVICE_MEMORY_LIMIT": "it is the slice's VRAM quota, set by the platform",
    "CUDA_DEVICE_SM_LIMIT": "it sets the quota library's share of the GPU's compute",
    "CUDA_OVERSUBSCRIBE": "it lets the quota library hand out more VRAM than the quota",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE": (
        "it moves the quota library's usage books, which it then cannot find"
    ),
    "LIBCUDA_LOG_LEVEL": f"{QUOTA_SWITCH} (its logging is the node's, not the tenant's)",
    "ACTIVE_OOM_KILLER": f"{QUOTA_SWITCH}: it decides what happens past the quota",
    "GPU_CORE_UTILIZATION_POLICY": f"{QUOTA_SWITCH}: it switches the compute limit off",
    "CUDA_TASK_PRIORITY": f"{QUOTA_SWITCH}: it ranks the slice above its neighbours",
    # the dynamic loader: what runs ahead of (or instead of) the quota library
    "LD_PRELOAD": "it loads code ahead of the quota library, or leaves the library out",
    "LD_LIBRARY_PATH": "it can point the job at a CUDA driver library the quota library "
    "does not intercept",
    "LD_AUDIT": "it runs code inside every library the job loads, the quota library's too",
    # which device the job sees
    "CUDA_VISIBLE_DEVICES": "the platform gives the slice its one device",
    # the platform's own caps (frameworks size themselves from them)
    "XLA_PYTHON_CLIENT_MEM_FRACTION": "it is the slice's share of the device for JAX",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "JAX would take 75% of the device at start",
    "PYTORCH_CUDA_ALLOC_CONF": "it is set by the platform to keep PyTorch's cache small",
    "TF_FORCE_GPU_ALLOW_GROWTH": "TensorFlow would take the whole device at start",
}
# prefix -> why
RESERVED_PREFIXES: dict[str, str] = {
    "GPUPLATFORM_": "the platform's own variables (the slice's VRAM cap among them)",
    # NVIDIA_VISIBLE_DEVICES=all would reach every GPU of the node; NVIDIA_GDS,
    # NVIDIA_MOFED, NVIDIA_IMEX_CHANNELS... add host devices; NVIDIA_DISABLE_REQUIRE...
    "NVIDIA_": "the NVIDIA Container Toolkit's hook reads it on the host, before the "
    "container starts (devices, capabilities, mounts)",
    "CUDA_DEVICE_MEMORY_": "the quota library's memory knobs (per-device limits among them)",
    "CUDA_DEVICE_SM_LIMIT": "the quota library's per-device compute limits",
    "CUDA_MPS_": "Multi-Process Service settings change how the GPU is shared",
    "LD_": "the dynamic loader's settings decide which libraries the job loads",
}
# Variables CUDA base images (nvidia/cuda, pytorch/pytorch...) carry in their own
# configuration, and why an image may keep them: the platform's values replace them, or
# they can only narrow what the container gets. Tenants still may not set them.
IMAGE_MAY_SET: dict[str, str] = {
    "NVIDIA_VISIBLE_DEVICES": "`--gpus device=...` names the slice's device after it",
    "NVIDIA_DRIVER_CAPABILITIES": "the platform sets compute,utility in its place",
    "LD_LIBRARY_PATH": "CUDA images point it at the driver's libraries; it loads nothing "
    "ahead of the quota library (LD_PRELOAD does, and images may not set that)",
}
IMAGE_MAY_SET_PREFIXES: dict[str, str] = {
    "NVIDIA_REQUIRE_": "a requirement only stops a container that does not meet it",
}
# What a CUDA image's requirement may not be: it would switch every requirement off.
_NEVER_IN_IMAGE = frozenset({"NVIDIA_DISABLE_REQUIRE"})


def reserved_reason(name: str) -> str | None:
    """Why the tenant may not set `name`, or None when they may."""
    if name in RESERVED_NAMES:
        return RESERVED_NAMES[name]
    for prefix, why in RESERVED_PREFIXES.items():
        if name.startswith(prefix):
            return why
    return None


def refusal(name: str) -> str:
    """The sentence a refused launch shows, naming the variable."""
    return f"{name} cannot be set: {reserved_reason(name)}."


def image_may_set(name: str) -> bool:
    if name in _NEVER_IN_IMAGE:
        return False
    return name in IMAGE_MAY_SET or name.startswith(tuple(IMAGE_MAY_SET_PREFIXES))


def _split(env: Iterable[str]) -> list[tuple[str, str]]:
    out = []
    for item in env:
        name, _, value = str(item).partition("=")
        out.append((name, value))
    return out


def image_env_problems(env: Iterable[str]) -> list[tuple[str, str]]:
    """(name, why) for each variable of an image's configuration (`Config.Env`, items
    `NAME=value`) that changes isolation and that no image may carry."""
    return [
        (name, reason)
        for name, _ in _split(env)
        if (reason := reserved_reason(name)) is not None and not image_may_set(name)
    ]


def container_env_problems(env: Iterable[str], expected: Mapping[str, str]) -> list[str]:
    """What is wrong with a started container's effective environment (`docker inspect`'s
    Config.Env): each platform variable must carry the platform's value, and no other
    variable that changes isolation may be there (from the image, or from anywhere else)."""
    seen: dict[str, str] = {}
    problems = []
    for name, value in _split(env):
        if name in seen and name in expected:
            problems.append(f"{name} is set twice")
        seen[name] = value
    for name, value in expected.items():
        if name not in seen:
            problems.append(f"{name} is missing")
        elif seen[name] != value:
            problems.append(f"{name} is {seen[name]!r}, not the platform's {value!r}")
    for name in seen:
        if name in expected or image_may_set(name):
            continue
        reason = reserved_reason(name)
        if reason is not None:
            problems.append(f"{name} is set ({reason})")
    return problems


def reserved_list() -> list[dict[str, str]]:
    """The whole list, for pages and the API: what, why, and whether an image may keep it."""
    rows = [{"name": n, "kind": "name", "reason": r} for n, r in RESERVED_NAMES.items()]
    rows += [{"name": f"{p}*", "kind": "prefix", "reason": r} for p, r in RESERVED_PREFIXES.items()]
    for row in rows:
        name = row["name"].rstrip("*")
        row["image_may_set"] = (
            IMAGE_MAY_SET.get(name)
            or next((w for p, w in IMAGE_MAY_SET_PREFIXES.items() if name.startswith(p)), "")
            if row["kind"] == "name"
            else ""
        )
    return rows


def card_isolation(
    *,
    mig_enabled: bool,
    mig_instances: int,
    model: str,
    whole_card_only: bool,
    quota_library: str,
    proven_models: Iterable[str],
    watchdog_only: bool,
) -> str:
    """What holds a slice on one card to its VRAM, strongest layer first, in words for the
    node page: MIG's hardware partitions, the node's quota library (proven for the card's
    model by preflight, or not yet), or neither (the card is sold whole, or ops accepted
    the node agent and the watchdog alone)."""
    if mig_enabled:
        count = f"{mig_instances} instance{'s' if mig_instances != 1 else ''}"
        return f"MIG: hardware partitions ({count}); each slice gets its own"
    proven = model in set(proven_models)
    if quota_library and proven:
        return f"quota library {quota_library}, proven for {model} by preflight"
    if quota_library and not whole_card_only:
        return (
            f"quota library {quota_library}, not proven for {model}: the node agent and "
            "the watchdog hold slices to their quota (ops accepted watchdog-only)"
        )
    if quota_library:
        return f"quota library {quota_library}, not proven for {model} yet: sold whole"
    if watchdog_only and not whole_card_only:
        return "no MIG, no quota library: the node agent and the watchdog alone (accepted by ops)"
    return "no MIG, no quota library: sold whole, one slice per card"

"""The preflight gate: probe containers on each GPU model, judged with the preflight (node)
policy by the pure rules of nodes.preflight; the verdict opens or closes the node to
placements."""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import NamedTuple

from django.db import transaction
from django.utils import timezone

from gpuplatform.dispatch import enqueue
from gpuplatform.errors import Conflict

from .. import preflight, runtime, ssh
from ..docker_messages import cli_error_line, container_exit_reason, image_env_refusal
from ..errors import ContainerError
from ..locks import node_lock, preflight_claim
from ..models import GateStatus, Gpu, Node, NodePolicy
from ..preflight import PROBE_OWNER_PREFIX
from ..selectors import preflight_policy
from .containers import container_inspect, image_inspect, node_containers_list, node_run
from .images import node_images_refresh
from .policy import PROBE_IMAGE_PAGE, gpus_set_whole_card

PROBE_WAIT_S = 30.0  # a probe that has not finished by then counts as not finished


def _gate_policy(row: NodePolicy) -> preflight.Policy:
    return preflight.Policy(
        min_toolkit_version=row.min_toolkit_version,
        min_runc_version=row.min_runc_version,
        driver_branches=tuple(row.driver_branches or ()),
        known_fixed=tuple(
            preflight.KnownBuild(k["component"], k["build"], k.get("reason", ""))
            for k in row.known_fixed_builds or ()
        ),
        require_userns_remap=row.require_userns_remap,
    )


class _Target(NamedTuple):
    """Where a probe runs: a GPU, or one MIG device of it."""

    gpu: Gpu
    device: str  # the GPU's UUID or the MIG device's
    device_mb: int
    mig: bool


def _probe_targets(node: Node) -> list[_Target]:
    """One GPU of each model sold through the quota library (the least used one), or,
    on a node with MIG-partitioned GPUs only, one MIG device (for the hardening reading):
    (gpu, device, device MiB, mig)."""
    # the freest card of each model: the probe's 512 MiB must not be what runs a card out
    gpus = sorted(
        Gpu.objects.filter(node=node, present=True),
        key=lambda g: (g.held_mb, g.index),
    )
    targets: dict[str, _Target] = {}
    for gpu in gpus:
        if not gpu.mig_enabled and gpu.model not in targets:
            targets[gpu.model] = _Target(gpu, gpu.uuid, gpu.vram_total_mb, False)
    if targets:
        return list(targets.values())
    for gpu in gpus:
        for mig in gpu.mig_devices or []:
            if mig.get("uuid"):
                return [_Target(gpu, mig["uuid"], int(mig.get("memory_total_mb") or 0), True)]
    return []


PROBES_AT_ONCE = 4
# The script's own lines are its first five and last two: an allocation command that
# prints more than this pushes the first ones out of what is read (the probe then fails).
PROBE_LOG_LINES = 400


def _probe_run(
    node: Node,
    target: _Target,
    kind: str,
    row: NodePolicy,
    library: str,
    pool: ssh.SSHPool,
    deadline: float,
) -> preflight.ProbeRun:
    """One probe container through the same `docker run` argv as a tenant's slice."""
    run = preflight.ProbeRun(gpu_model=target.gpu.model, device=target.device, kind=kind)
    if time.monotonic() > deadline:
        return dataclasses.replace(run, error="the preflight ran out of time before this probe")
    # fresh for each probe, so no output of another run (or of the command) can pass
    nonce = secrets.token_hex(16)
    try:
        spec = _probe_spec(node, target, kind, row, library, nonce)
        argv = runtime.run_argv(spec)
    except ValueError as exc:
        return dataclasses.replace(run, error=f"the probe settings are not valid: {exc}")
    name = spec.name
    try:
        started = node_run(node=node, argv=argv, pool=pool, timeout=PROBE_WAIT_S)
        if not started.ok:
            return dataclasses.replace(
                run, error=f"docker run failed: {cli_error_line(started.stderr)}"
            )
        info = _probe_wait(node, name, pool, min(deadline, time.monotonic() + PROBE_WAIT_S))
        if info is None:
            return dataclasses.replace(run, error="the probe container disappeared")
        # read even from a probe that did not finish: its confinement is printed first
        logs = node_run(node=node, argv=runtime.logs_tail_argv(name, PROBE_LOG_LINES), pool=pool)
        seen = preflight.parse_probe_output(logs.stdout.decode("utf-8", "replace"), nonce)
        run = dataclasses.replace(run, readings=seen.readings, output=seen.output)
        return _probe_verdict(run, seen, info)
    except (ssh.SSHError, ContainerError, runtime.RuntimeParseError) as exc:
        return dataclasses.replace(run, error=str(exc)[:300])
    finally:
        with contextlib.suppress(ssh.SSHError):
            node_run(node=node, argv=runtime.rm_argv(name), pool=pool)


def _probe_spec(
    node: Node, target: _Target, kind: str, row: NodePolicy, library: str, nonce: str
) -> runtime.ContainerSpec:
    """The probe's container, held like a slice's: the quota, the caps, the node's network."""
    gpu, device, device_mb, mig = target
    return runtime.ContainerSpec(
        name=f"gpp-probe-{node.pk}-{gpu.index}-{kind}-{secrets.token_hex(3)}",
        image=row.probe_image,
        owner_key=f"{PROBE_OWNER_PREFIX}{node.pk}",
        device=device,
        vram_mb=min(preflight.PROBE_QUOTA_MB, device_mb or preflight.PROBE_QUOTA_MB),
        gpu_total_mb=device_mb or preflight.PROBE_QUOTA_MB,
        cpus=Decimal(preflight.PROBE_CPUS),
        memory_mb=preflight.PROBE_MEMORY_MB,
        pids_limit=preflight.PROBE_PIDS,
        command=preflight.probe_command(nonce, kind, row.probe_command),
        environment=preflight.probe_environment(
            row.probe_environment or {}, preflight.probe_alloc_mb(kind)
        ),
        mig=mig,
        quota_library="" if mig else library,
        network=node.container_network,
    )


def _probe_wait(
    node: Node, name: str, pool: ssh.SSHPool, deadline: float
) -> runtime.ContainerInfo | None:
    """The probe container once it has ended, or at the deadline (None: it is gone)."""
    info = container_inspect(node=node, container=name, pool=pool)
    while info is not None and info.running and time.monotonic() < deadline:
        time.sleep(0.25)
        info = container_inspect(node=node, container=name, pool=pool)
    return info


def _probe_verdict(
    run: preflight.ProbeRun, seen: preflight.ProbeOutput, info: runtime.ContainerInfo
) -> preflight.ProbeRun:
    """The run, with why it failed when its output or its ending is not the script's."""
    if seen.problem:
        return dataclasses.replace(run, error=f"the probe's output: {seen.problem}")
    if info.running:
        return dataclasses.replace(
            run, error=f"the probe did not finish within {PROBE_WAIT_S:.0f} s"
        )
    if "alloc_exit" not in seen.readings:
        return dataclasses.replace(
            run,
            error=f"the probe stopped before its allocation ({container_exit_reason(info)})",
        )
    if info.exit_code != 0 or info.oom_killed:
        # the script ends with `exit 0`: anything else is not the script's ending
        return dataclasses.replace(
            run, error=f"the probe script did not end itself ({container_exit_reason(info)})"
        )
    return run


def _remove_stale_probes(node: Node, pool: ssh.SSHPool) -> None:
    """Probe containers an earlier preflight left (its worker died mid-probe)."""
    key = f"{PROBE_OWNER_PREFIX}{node.pk}"
    with contextlib.suppress(ssh.SSHError, ContainerError, runtime.RuntimeParseError):
        for info in node_containers_list(node=node, pool=pool):
            if info.owner_key == key:
                node_run(node=node, argv=runtime.rm_argv(info.id), pool=pool)


def _relay_facts(node: Node, pool: ssh.SSHPool) -> dict[str, str]:
    """What the SSH gateway's relay needs on the node (preflight.RELAY_FACT_KEYS), each
    read by its own fixed argv: the program's version line, "" when it is not there."""
    facts: dict[str, str] = {}
    for key in preflight.RELAY_FACT_KEYS:
        try:
            result = node_run(
                node=node, argv=list(preflight.RELAY_PROBES[key]), pool=pool, timeout=15
            )
        except ssh.SSHError:
            facts[key] = ""
            continue
        facts[key] = preflight.relay_reading(key, result.exit_status, result.stdout)
    return facts


def node_preflight(
    *, node_id: int, facts: dict[str, str], pool: ssh.SSHPool | None = None
) -> Node | None:
    """Judge the node by the policy: the versions discovery read, and probe containers on
    each GPU model proving the hardening and the VRAM quota. Stores the verdict; a node
    that fails takes no new placements (running slices stay), one that passes again is
    released. Never raises for what the node answers: a probe that fails says why."""
    node = Node.objects.filter(pk=node_id).first()
    if node is None or not node.host_key:
        return node
    with preflight_claim(node_id) as claimed:
        if not claimed:  # another worker is judging this node now: its verdict will land
            return node
        return _node_preflight(node, facts, pool or ssh.get_pool())


PREFLIGHT_DEADLINE_S = 240.0  # the task's soft limit is 300 s: the verdict is always stored
NO_PROBE_IMAGE = f"no probe image set: ops choose one from the allowlist on {PROBE_IMAGE_PAGE}"


def _node_preflight(node: Node, facts: dict[str, str], pool: ssh.SSHPool) -> Node:
    judged_key = node.host_key
    row = preflight_policy()
    library = (node.capabilities or {}).get("vram_quota_library") or ""
    deadline = time.monotonic() + PREFLIGHT_DEADLINE_S
    _remove_stale_probes(node, pool)
    facts = {**facts, **_relay_facts(node, pool)}
    node_images_refresh(node=node, pool=pool)
    targets = _probe_targets(node)
    image_error = _probe_image_error(node, row, pool)
    jobs = [
        (target, kind)
        for target in targets
        for kind in (preflight.PROBE_KINDS if library and not target.mig else ("within",))
    ]
    if image_error:
        runs = [preflight.ProbeRun(t.gpu.model, t.device, k, error=image_error) for t, k in jobs]
    else:
        # side by side (the SSH pool is shared by threads): a node's probes take about as
        # long as one; each waits at most until the deadline
        with ThreadPoolExecutor(max_workers=PROBES_AT_ONCE) as pool_of_probes:
            futures = [
                pool_of_probes.submit(_probe_run, node, t, k, row, library, pool, deadline)
                for t, k in jobs
            ]
            runs = [f.result() for f in futures]
    gate = preflight.evaluate(
        facts=facts,
        driver_version=node.driver_version,
        policy=_gate_policy(row),
        runs=runs,
        software_models=[t.gpu.model for t in targets if not t.mig],
        quota_library=library,
        probe_error=image_error if targets else "the node has no GPU to probe",
        relay_required=node.access == Node.Access.GATEWAY,
    )
    return _verdict_store(node, judged_key, gate, facts, runs, row, library)


def _probe_image_error(node: Node, row: NodePolicy, pool: ssh.SSHPool) -> str:
    """Why the probe image cannot run on the node ("" when it can). It is checked like any
    image before it starts (CVE-2025-23266 needs only an ENV in it), and pulled once here
    rather than by each probe's `docker run`."""
    if not row.probe_image:
        return NO_PROBE_IMAGE
    try:
        return image_env_refusal(image_inspect(node=node, reference=row.probe_image, pool=pool))
    except (ContainerError, ssh.SSHError) as exc:
        return f"the probe image {row.probe_image} is not usable on the node: {exc}"


def _verdict_store(
    node: Node,
    judged_key: str,
    gate: preflight.Gate,
    facts: dict[str, str],
    runs: list[preflight.ProbeRun],
    row: NodePolicy,
    library: str,
) -> Node:
    """The verdict and its evidence on the node, which opens or closes it to placements;
    nothing when the node's host key changed meanwhile."""
    now = timezone.now()
    with transaction.atomic():
        node = node_lock(node.pk)
        if node.host_key != judged_key:
            # the key changed while the probes ran: this verdict is about the machine that
            # answered before, and the change queued the judgement of the one there now
            return node
        node.gate_status = GateStatus.PASSED if gate.passed else GateStatus.FAILED
        node.gate_reason = gate.reason[:1000]
        node.gate_checked_at = now
        node.preflight = {
            "facts": {k: facts.get(k, "") for k in preflight.ALL_FACT_KEYS},
            "driver_version": node.driver_version,
            "checks": [c.as_dict() for c in gate.checks],
            "quota": dict(gate.quota),
            "quota_library": library,
            "probes": [r.as_dict() for r in runs],
            "policy": {
                "min_toolkit_version": row.min_toolkit_version,
                "min_runc_version": row.min_runc_version,
                "require_userns_remap": row.require_userns_remap,
            },
            "checked_at": now.isoformat(),
        }
        node.save(update_fields=["gate_status", "gate_reason", "gate_checked_at", "preflight"])
        gpus_set_whole_card(node=node, quota=gate.quota)
    return node


def node_preflight_request(*, node: Node) -> Node:
    """Judge the node now (a discovery, in the background, after this transaction)."""
    if not node.host_key:
        raise Conflict("Approve the node's host key first.", code="pending_host_key")
    enqueue("telemetry.discover_node", node.pk)
    return node

"""How a slice's run ended when its container stopped without the platform asking: from
what `docker inspect` says of the container and the last lines it printed. Completed
(exit 0 by itself) or failed, why in words, when (docker's `State.FinishedAt`), and who
ended it: the job itself, or not (the platform, its node or a neighbour), which is what
the KPIs hold against the platform. Reads nothing and writes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from nodes import runtime
from nodes.docker_messages import container_exit_reason

from .models import Slice

JOB = Slice.EndedBy.JOB
PLATFORM = Slice.EndedBy.PLATFORM
# What PyTorch, JAX and the quota library print when a CUDA allocation is refused.
GPU_OOM_MARKS = ("CUDA out of memory", "OutOfMemoryError")
# A GPU out-of-memory with a measured peak at this share of the quota or more ran out
# inside its own quota (the next allocation would have passed it). Below it the card
# itself may have been full: a neighbour's doing, which the KPIs then look for.
OWN_QUOTA_SHARE = 0.9
# Exit codes of a kill from outside (SIGKILL, SIGTERM) that the kernel's OOM killer did
# not send: docker, its daemon's restart or someone on the node ended the job.
KILLED_FROM_OUTSIDE = (137, 143)


@dataclass(frozen=True)
class RunEnd:
    completed: bool
    reason: str
    ended_by: str
    exit_code: int | None
    exited_at: datetime | None  # docker's FinishedAt; None when it does not say
    started_at: datetime | None  # docker's StartedAt


def _exited_by_itself_ok(info: runtime.ContainerInfo) -> bool:
    """The container ran and its job ended with code 0, not killed or refused by docker
    (a container that was only created says code 0 too)."""
    return (
        info.status == "exited" and info.exit_code == 0 and not info.oom_killed and not info.error
    )


def run_end_of(
    info: runtime.ContainerInfo | None, *, logs: str, quota_mb: int, peak_mb: int | None
) -> RunEnd:
    """How the run whose container `info` describes (None: gone from the node) ended."""
    if info is None:
        return RunEnd(False, "The container is gone from the node.", PLATFORM, None, None, None)
    exited_at = runtime.docker_time(info.finished_at)
    started_at = runtime.docker_time(info.started_at)
    tail = " | ".join(logs.strip().splitlines()[-3:])
    last = f" Last output: {tail}" if tail else ""
    if _exited_by_itself_ok(info):
        reason = "The job finished: its container exited with code 0." + last
        return RunEnd(True, reason, JOB, 0, exited_at, started_at)
    reason = container_exit_reason(info).capitalize() + "."
    gpu_oom = any(mark in logs for mark in GPU_OOM_MARKS)
    if gpu_oom:
        reason += (
            " It ran out of GPU memory: lower the batch or context, quantize, or buy a bigger tier."
        )
    else:
        reason += last
    ended_by = _ended_by(info, gpu_oom=gpu_oom, quota_mb=quota_mb, peak_mb=peak_mb)
    return RunEnd(False, reason, ended_by, info.exit_code, exited_at, started_at)


def _ended_by(
    info: runtime.ContainerInfo, *, gpu_oom: bool, quota_mb: int, peak_mb: int | None
) -> str:
    if info.oom_killed:
        return JOB  # the kernel's OOM killer, over the host RAM its own tier gives it
    if info.error or info.status != "exited" or info.exit_code is None:
        return PLATFORM  # docker could not run it, or it is in a state nobody asked for
    if info.exit_code in KILLED_FROM_OUTSIDE:
        return PLATFORM
    if gpu_oom:
        own = peak_mb is not None and peak_mb >= quota_mb * OWN_QUOTA_SHARE
        return JOB if own else PLATFORM
    return JOB  # its own exit code


def within_run(moment: datetime | None, *, began: datetime, now: datetime) -> datetime:
    """`moment` (a node's clock, which may be off) held between the run's start and
    `now`, in the platform's time; `now` when there is no moment."""
    if moment is None:
        return now
    return min(max(moment, began), now)

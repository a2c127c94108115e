"""GPU memory accounting: `refresh()` brings containers and GPU processes up to the clock
(time-determined exits, each device's memory first come first served, CUDA OOMs), and the
GPU readings that follow from it (memory used, utilisation, temperature, power)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .containers import Container
from .gpus import GpuProcess, GpuState

if TYPE_CHECKING:
    from .clock import Clock

# What an uncaught torch.OutOfMemoryError exits with (a Python exception, not a signal).
CUDA_OOM_EXIT = 1

Device = tuple[int, int | None]  # (GPU index, MIG device index; None: the whole card)


class _FreeMemory:
    """What is still free on each device while refresh hands memory out."""

    def __init__(self, gpus: list[GpuState]) -> None:
        self.remaining: dict[Device, float] = {}
        for gpu in gpus:
            if gpu.mig_enabled:
                for k, mig in enumerate(gpu.mig_devices):
                    self.remaining[(gpu.index, k)] = float(mig.profile.memory_mb)
            self.remaining[(gpu.index, None)] = float(gpu.model.memory_mb - gpu.held_mb)

    def free_for(self, dev: Device) -> float:
        if dev[1] is None:
            return self.remaining[dev]
        return min(self.remaining[dev], self.remaining[(dev[0], None)])

    def take(self, dev: Device, mb: float) -> None:
        self.remaining[dev] -= mb
        if dev[1] is not None:  # a MIG device's memory also comes out of the card
            self.remaining[(dev[0], None)] -= mb


class VramAccounting:
    """NodeState's memory accounting and GPU readings (mixed in by emulator.state, whose
    __init__ sets the attributes declared here)."""

    lock: threading.RLock
    clock: Clock
    gpus: list[GpuState]
    containers: dict[str, Container]
    host_processes: dict[int, GpuProcess]
    processes: list[GpuProcess]

    def __init__(self) -> None:
        super().__init__()
        self._agg: dict[tuple[int, int | None], list[int]] = {}
        self._agg_for: list[GpuProcess] | None = None

    if TYPE_CHECKING:

        def container_exit(
            self,
            c: Container,
            at: float,
            code: int,
            *,
            oom_killed: bool = False,
            stream_text: str = "",
        ) -> None: ...  # emulator.containers.ContainerOps

    def _cuda_oom_text(self, c: Container, gpu: GpuState, want: float, free: float) -> str:
        total = (
            gpu.mig_devices[c.device[1]].profile.memory_mb
            if c.device and c.device[1] is not None
            else gpu.model.memory_mb
        )
        step = max(want - c.used_mb, 512.0)
        return (
            "Traceback (most recent call last):\n"
            '  File "/app/main.py", line 42, in <module>\n'
            "    block = torch.empty(n, dtype=torch.uint8, device='cuda')\n"
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {step:.2f} MiB. "
            f"GPU 0 has a total capacity of {total / 1024:.2f} GiB of which "
            f"{max(free, 0) / 1024:.2f} GiB is free. Process {c.pid} has "
            f"{c.used_mb / 1024:.2f} GiB memory in use. Of the allocated memory "
            f"{c.used_mb * 0.93 / 1024:.2f} GiB is allocated by PyTorch, and "
            f"{c.used_mb * 0.07:.2f} MiB is reserved by PyTorch but unallocated."
        )

    def _cuda_oom(self, c: Container, at: float, held: float, want: float, free: float) -> None:
        """The workload's allocation failed: torch raises OutOfMemoryError, uncaught.
        The "oom" profile keeps its historical exit 137; any other exits 1, as Python
        does on an uncaught exception."""
        assert c.device is not None  # only a container on a device allocates
        gpu = self.gpus[c.device[0]]
        c.used_mb = int(held)
        w = c.workload
        code = 137 if w is not None and w.profile == "oom" else CUDA_OOM_EXIT
        text = self._cuda_oom_text(c, gpu, want, free)
        limit = c.library.limit_mb
        if c.library.enforcing and limit is not None and held >= limit - 0.5:
            # the quota library refused it inside the container, and says so first
            text = (
                f"[vramquota] refused {max(want - held, 1.0):.0f} MiB: {held:.0f} of "
                f"{limit:.0f} MiB in use (device memory limit)\n" + text
            )
        self.container_exit(c, at, code, stream_text=text)

    def cap_for(self, c: Container) -> float | None:
        """The limit a workload's allocations run into before the card's own size: every
        cap for a cooperative workload, only the hard one for the others."""
        w = c.workload
        if w is not None and not w.cooperative:
            return c.hard_limit_mb
        return c.limit_mb

    def refresh(self) -> None:
        """Bring containers and GPU processes up to the clock's now.

        Memory already held stays held: a container's growth comes out of what is free
        on its device, first come first served, and never out of a neighbour. A workload
        that cannot get what it wants dies with a CUDA OOM (or, when it is cooperative,
        holds at its cap)."""
        with self.lock:
            now = self.clock.now()
            running = sorted(
                (c for c in self.containers.values() if c.running and c.workload is not None),
                key=lambda c: (c.started or 0.0, c.id),
            )
            # 1. time-determined exits (exit-after; OOM when the demand crosses the cap)
            for c in running:
                self._timed_exit(c, now)
            # 2. memory on each device: host processes first, then what each container
            # already holds (up to what it still wants), then growth in start order
            free = _FreeMemory(self.gpus)
            procs = self._host_processes(free)
            live = [c for c in running if c.running]
            wants, held = self._keep_held(live, now, free)
            for c in live:
                proc = self._grow(c, now, wants[c.id], held[c.id], free)
                if proc is not None:
                    procs.append(proc)
            self.processes = procs
            # 3. `docker run --rm`: exited containers go away
            for c in [
                c for c in self.containers.values() if c.auto_remove and c.status == "exited"
            ]:
                del self.containers[c.id]

    def _timed_exit(self, c: Container, now: float) -> None:
        """The container's exit if its time has come: its exit-after, or the moment its
        demand crossed its cap (a CUDA OOM)."""
        w = c.workload
        assert w is not None and c.started is not None
        if c.paused:
            return  # frozen: its clock does not move
        candidates: list[tuple[float, str]] = []
        if w.exit_after_s is not None:
            candidates.append((c.wall_time(w.exit_after_s / w.speed), "exit"))
        cap = self.cap_for(c)
        if cap is not None and (w.profile == "oom" or not w.cooperative):
            t = w.crossing(cap)
            if t is not None:
                candidates.append((c.wall_time(t / w.speed), "oom"))
        due = [x for x in candidates if x[0] <= now]
        if not due:
            return
        at, why = min(due)
        if why == "exit":
            c.log(at, "stdout", "gpu-workload: finished")
            self.container_exit(c, at, w.exit_code)
        else:
            assert cap is not None
            self._cuda_oom(c, at, cap, cap + 1, 0)

    def _host_processes(self, free: _FreeMemory) -> list[GpuProcess]:
        """Processes outside containers keep what they hold, as far as the card has it."""
        procs: list[GpuProcess] = []
        for hp in self.host_processes.values():
            key = (hp.gpu_index, None)
            hp.used_mb = int(max(0.0, min(hp.used_mb, free.free_for(key))))
            free.take(key, hp.used_mb)
            procs.append(hp)
        return procs

    def _keep_held(
        self, live: list[Container], now: float, free: _FreeMemory
    ) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
        """Each container's (workload time, demand), and what it keeps of what it already
        holds: no more than it still wants, taken first, so growth never takes it."""
        wants: dict[str, tuple[float, float]] = {}
        held: dict[str, float] = {}
        for c in live:
            w = c.workload
            assert w is not None and c.device is not None
            t = c.run_s(now) * w.speed
            want = w.demand(t)
            wants[c.id] = (t, want)
            keep = max(0.0, min(want, float(c.used_mb), free.free_for(c.device)))
            held[c.id] = keep
            free.take(c.device, keep)
        return wants, held

    def _grow(
        self,
        c: Container,
        now: float,
        t_want: tuple[float, float],
        held: float,
        free: _FreeMemory,
    ) -> GpuProcess | None:
        """The container's growth out of what is free on its device, up to its cap; past
        the cap it dies of a CUDA OOM (None) or, cooperative, holds at the cap."""
        w = c.workload
        assert w is not None and c.device is not None and c.started is not None
        t, want = t_want
        dev_key = c.device
        physical = held + free.free_for(dev_key)
        limit = self.cap_for(c)
        cap = physical if limit is None else min(physical, limit)
        if want > cap:
            if w.profile == "oom" or not w.cooperative:
                free.take(dev_key, -held)  # its memory is freed at once
                at = now
                crossing = w.crossing(cap) if not c.paused else None
                if crossing is not None:
                    at = min(now, max(c.started, c.wall_time(crossing / w.speed)))
                self._cuda_oom(c, at, cap, want, physical - cap)
                return None
            if not c.quota_hit_logged:
                c.quota_hit_logged = True
                c.log(
                    now,
                    "stderr",
                    (
                        f"gpu-workload: allocation refused at {int(cap)} MiB "
                        f"(wanted {int(want)} MiB): "
                        + (
                            "VRAM quota"
                            if limit is not None and cap >= limit
                            else "device memory exhausted"
                        )
                        + ", holding"
                    ),
                )
            want = cap
        used = int(want)
        c.used_mb = used
        free.take(dev_key, used - held)
        return self._container_process(c, t, used)

    def _container_process(self, c: Container, t: float, used: int) -> GpuProcess:
        """The GPU process of a running container, as NVML lists it."""
        w = c.workload
        assert w is not None and c.device is not None
        gpu = self.gpus[c.device[0]]
        sm, mem = (0, 0) if c.paused else w.util(t)
        sm_v: int | None
        mem_v: int | None
        if gpu.mig_enabled:  # per-process utilisation is not reported in MIG mode
            sm_v, mem_v = None, None
        else:
            sm_v, mem_v = sm, mem
        name = _process_name(c.cmd)
        return GpuProcess(
            gpu.index, c.device[1], c.pid, used, name, _exe(c.cmd), c.id, sm_v, mem_v, sm, mem
        )

    # ------------------------------------------------------------------ GPU readings
    def _aggregates(self) -> dict[tuple[int, int | None], list[int]]:
        """{(gpu, None): [used, sm, mem], (gpu, mig): [used, 0, 0]} for the current processes."""
        if self._agg_for is not self.processes:
            agg: dict[tuple[int, int | None], list[int]] = {}
            for p in self.processes:
                a = agg.setdefault((p.gpu_index, None), [0, 0, 0])
                a[0] += p.used_mb
                a[1] += p.sm_raw
                a[2] += p.mem_raw
                if p.mig_index is not None:
                    agg.setdefault((p.gpu_index, p.mig_index), [0, 0, 0])[0] += p.used_mb
            self._agg, self._agg_for = agg, self.processes
        return self._agg

    def gpu_used_mb(self, gpu: GpuState) -> int:
        return self._aggregates().get((gpu.index, None), [0, 0, 0])[0] + gpu.held_mb

    def mig_used_mb(self, gpu: GpuState, k: int) -> int:
        return self._aggregates().get((gpu.index, k), [0, 0, 0])[0]

    def gpu_util(self, gpu: GpuState) -> tuple[int, int]:
        _, sm, mem = self._aggregates().get((gpu.index, None), [0, 0, 0])
        return min(sm, 100), min(mem, 100)

    def gpu_temperature(self, gpu: GpuState) -> int:
        return int(31 + 0.4 * self.gpu_util(gpu)[0] + (gpu.index % 3))

    def gpu_power(self, gpu: GpuState) -> float | None:
        if not gpu.power_supported:
            return None
        sm, _ = self.gpu_util(gpu)
        m = gpu.model
        return round(m.idle_w + (m.tdp_w - m.idle_w) * 0.85 * sm / 100.0 + 0.37 * gpu.index, 2)


def _process_name(cmd: list[str]) -> str:
    if not cmd:
        return "python3"
    base = cmd[0].rsplit("/", 1)[-1]
    if base in ("sh", "bash", "sleep", "tail", "true"):
        return "python3"
    return base[:15]


def _exe(cmd: list[str]) -> str:
    name = _process_name(cmd)
    if cmd and cmd[0].startswith("/") and cmd[0].rsplit("/", 1)[-1] == name:
        return cmd[0]
    if name.startswith("python"):
        return f"/usr/bin/{name}"
    return f"/usr/local/bin/{name}"

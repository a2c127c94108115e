"""Faults only silicon has, injected into a node's state: Xid events in the kernel log
(XID_MESSAGES, xid_raw) and ECC errors (the Faults part of NodeState)."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .gpus import GpuProcess, GpuState

if TYPE_CHECKING:
    from .clock import Clock


@dataclass
class XidRecord:
    seq: int
    at: float
    gpu_index: int
    code: int
    pid: int | None
    process_name: str | None
    message: str


XID_MESSAGES = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f12_34560000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008, engmask 00000101",
    45: "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x3c001",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
    "at partition 6, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap a row, reset gpu to activate.",
    74: "NVLink: fatal error detected on link 0(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error.",
    95: "Uncontained ECC error.",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
    "(GSP_RM_CONTROL) (0x20801702 0x4).",
}


class Faults:
    """NodeState's faults (mixed in by emulator.state, whose __init__ sets the attributes
    declared here)."""

    lock: threading.RLock
    clock: Clock
    gpus: list[GpuState]
    processes: list[GpuProcess]
    kernel_log: list[tuple[float, str]]
    xids: list[XidRecord]

    def __init__(self) -> None:
        super().__init__()
        self._xid_seq = itertools.count(1)

    if TYPE_CHECKING:

        def refresh(self) -> None: ...  # emulator.vram.VramAccounting

    def add_xid(
        self, gpu_index: int, code: int, pid: int | None = None, message: str | None = None
    ) -> XidRecord:
        with self.lock:
            gpu = self.gpus[gpu_index]
            name = None
            if pid is not None:
                self.refresh()
                name = next((p.name for p in self.processes if p.pid == pid), "python3")
            rec = XidRecord(
                next(self._xid_seq),
                self.clock.now(),
                gpu_index,
                int(code),
                pid,
                name,
                message or XID_MESSAGES.get(int(code), "Unknown error"),
            )
            self.xids.append(rec)
            self.kernel_log.append((rec.at, xid_raw(gpu, rec)))
            return rec

    def add_ecc(
        self,
        gpu_index: int,
        *,
        uncorrected: int = 1,
        retired_pages_pending: bool | None = None,
        remapped_rows_pending: bool | None = None,
        remapped_rows_failure: bool | None = None,
        xid: int | None = None,
    ) -> None:
        with self.lock:
            gpu = self.gpus[gpu_index]
            gpu.ecc_uncorrected += int(uncorrected)
            if retired_pages_pending is not None:
                gpu.retired_pages_pending = retired_pages_pending
            if remapped_rows_pending is not None:
                gpu.remapped_rows_pending = remapped_rows_pending
            if remapped_rows_failure is not None:
                gpu.remapped_rows_failure = remapped_rows_failure
        if xid:
            self.add_xid(gpu_index, xid)

    def clear_ecc(self, gpu_index: int) -> None:
        with self.lock:
            gpu = self.gpus[gpu_index]
            gpu.ecc_uncorrected = 0
            gpu.retired_pages_pending = gpu.remapped_rows_pending = False
            gpu.remapped_rows_failure = False


def xid_raw(gpu: GpuState, rec: XidRecord) -> str:
    who = f"pid={rec.pid}, name={rec.process_name}, " if rec.pid is not None else ""
    return f"NVRM: Xid (PCI:{gpu.kernel_pci}): {rec.code}, {who}{rec.message}"

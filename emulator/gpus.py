"""The emulated GPU hardware: a card (GpuState), its MIG devices (MigState) and the
processes that hold its memory (GpuProcess)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .catalog import GpuModel, MigProfile


@dataclass
class MigState:
    uuid: str
    profile: MigProfile
    gi_id: int
    ci_id: int = 0


@dataclass
class GpuState:
    index: int
    uuid: str
    model: GpuModel
    pci_bus: int
    mig_enabled: bool = False
    mig_devices: list[MigState] = field(default_factory=list)
    ecc_uncorrected: int = 0
    retired_pages_pending: bool = False
    remapped_rows_pending: bool = False
    remapped_rows_failure: bool = False
    power_supported: bool = True
    fallen_off: bool = False
    held_mb: int = 0  # used with no process: the driver did not release it

    @property
    def pci_bus_id(self) -> str:  # nvidia-smi / NVML form
        return f"00000000:{self.pci_bus:02X}:00.0"

    @property
    def kernel_pci(self) -> str:  # the form in NVRM kernel messages
        return f"0000:{self.pci_bus:02x}:00"


@dataclass
class GpuProcess:
    gpu_index: int
    mig_index: int | None
    pid: int
    used_mb: int
    name: str
    exe: str
    container_id: str | None
    sm: int | None
    mem: int | None
    sm_raw: int = 0  # utilisation that counts towards the GPU's totals (also in MIG mode)
    mem_raw: int = 0

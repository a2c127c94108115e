"""GPU models, MIG profiles and the default fleet layouts of the node emulator and the
node lab.

Names and memory sizes are what `nvidia-smi` / NVML report on real hosts (MiB).
MIG profile sizes are the `nvidia-smi mig -lgip` GiB figures times 1024, or the MIG
device sizes real `nvidia-smi` printed (H200). `reserved_mb` is the memory the driver
sets aside ("Reserved" in `nvidia-smi -q -d MEMORY`, counted as used by NVML's v1 memory
info), from the real captures in utkuozdemir/nvidia_gpu_exporter internal/captures/
where the model was captured, 0 where it was not.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

DEFAULT_DRIVER_VERSION = "550.54.15"
DEFAULT_CUDA_VERSION = "12.4"
DEFAULT_QUOTA_LIBRARY = "/usr/lib/gpuplatform/libvramquota.so"
# Where a node's quota library takes its limits from. "node": the toolkit hook writes the
# container's limits (from its configured environment, which only the platform sets)
# into a read-only /overrideEnv the library applies over the process's environment, and
# mounts a read-only /etc/ld.so.preload naming the library, so no process inside can
# switch it off, raise its limit or leave it out. "environment": HAMi-core upstream, which
# obeys whatever environment each process has (HAMi#723).
QUOTA_FROM_NODE = "node"
QUOTA_FROM_ENVIRONMENT = "environment"
QUOTA_CONFIGS = (QUOTA_FROM_NODE, QUOTA_FROM_ENVIRONMENT)


@dataclass(frozen=True)
class MigProfile:
    name: str  # "1g.6gb"
    memory_mb: int
    slices: int  # compute slices (g)
    gi_ids: tuple[int, ...]  # GPU-instance ids the driver hands out for this profile, in order


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_mb: int
    tdp_w: float
    idle_w: float
    mig_profiles: tuple[MigProfile, ...] = ()
    ecc: bool = True  # ECC reported (GeForce: off, nvidia-smi says [N/A])
    default_mig_layout: tuple[str, ...] = ()
    reserved_mb: int = 0

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def profile(self, name: str) -> MigProfile:
        for p in self.mig_profiles:
            if p.name == name:
                return p
        raise ValueError(f"{self.name} has no MIG profile {name!r}")


def _mib(gib: float) -> int:
    return int(round(gib * 1024))


_A30_MIG = (
    MigProfile("1g.6gb", _mib(5.8125), 1, (3, 4, 5, 6)),
    MigProfile("2g.12gb", _mib(11.75), 2, (1, 2)),
    MigProfile("4g.24gb", _mib(23.625), 4, (0,)),
)
_A100_80_MIG = (
    MigProfile("1g.10gb", _mib(9.5), 1, (9, 10, 11, 12, 13, 7, 8)),
    MigProfile("2g.20gb", _mib(19.5), 2, (3, 4, 5)),
    MigProfile("3g.40gb", _mib(39.25), 3, (2, 1)),
    MigProfile("4g.40gb", _mib(39.25), 4, (5,)),
    MigProfile("7g.80gb", _mib(79.25), 7, (0,)),
)
_A100_40_MIG = (
    MigProfile("1g.5gb", _mib(4.75), 1, (9, 10, 11, 12, 13, 7, 8)),
    MigProfile("2g.10gb", _mib(9.75), 2, (3, 4, 5)),
    MigProfile("3g.20gb", _mib(19.625), 3, (2, 1)),
    MigProfile("4g.20gb", _mib(19.625), 4, (5,)),
    MigProfile("7g.40gb", _mib(39.25), 7, (0,)),
)
_H100_80_MIG = (
    MigProfile("1g.10gb", _mib(9.75), 1, (9, 10, 11, 12, 13, 7, 8)),
    MigProfile("2g.20gb", _mib(19.75), 2, (3, 4, 5)),
    MigProfile("3g.40gb", _mib(39.5), 3, (2, 1)),
    MigProfile("4g.40gb", _mib(39.5), 4, (5,)),
    MigProfile("7g.80gb", _mib(79.0), 7, (0,)),
)

# H200 MIG device sizes as real nvidia-smi 590.48.01 printed them (captures, h200-mig).
_H200_MIG = (
    MigProfile("1g.18gb", 16384, 1, (9, 10, 11, 12, 13, 7, 8)),
    MigProfile("2g.35gb", 33280, 2, (3, 4, 5)),
    MigProfile("3g.71gb", 71424, 3, (2, 1)),
)

MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel(
            "NVIDIA A30",
            24576,
            165.0,
            31.0,
            _A30_MIG,
            default_mig_layout=("2g.12gb", "1g.6gb", "1g.6gb"),
        ),
        GpuModel("NVIDIA L4", 23034, 72.0, 16.0),
        GpuModel("NVIDIA A10", 23028, 150.0, 21.0),
        GpuModel("NVIDIA L40S", 46068, 350.0, 35.0, reserved_mb=609),
        GpuModel("Tesla T4", 15360, 70.0, 10.0),
        GpuModel("NVIDIA GeForce RTX 4090", 24564, 450.0, 21.0, ecc=False),
        GpuModel("NVIDIA GeForce RTX 3090", 24576, 350.0, 25.0, ecc=False),
        GpuModel("NVIDIA GeForce RTX 4080 SUPER", 16376, 320.0, 26.0, ecc=False, reserved_mb=434),
        GpuModel(
            "NVIDIA A100-SXM4-80GB",
            81920,
            400.0,
            62.0,
            _A100_80_MIG,
            default_mig_layout=("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"),
        ),
        GpuModel(
            "NVIDIA A100-SXM4-40GB",
            40960,
            400.0,
            55.0,
            _A100_40_MIG,
            default_mig_layout=("3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"),
        ),
        GpuModel(
            "NVIDIA H100 80GB HBM3",
            81559,
            700.0,
            72.0,
            _H100_80_MIG,
            default_mig_layout=("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"),
            reserved_mb=479,
        ),
        GpuModel(
            "NVIDIA H200",
            143771,
            700.0,
            78.0,
            _H200_MIG,
            default_mig_layout=("3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"),
            reserved_mb=614,
        ),
    )
}

# 8-GPU server PCI buses (Dell/Supermicro style), bus id of GPU i.
PCI_BUSES = (0x18, 0x2A, 0x3A, 0x3B, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB, 0xCA, 0x4F, 0x8E, 0x17, 0x1C)


def model(name: str) -> GpuModel:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown GPU model {name!r}; known: {sorted(MODELS)}") from None


def stable_uuid(*parts: object, prefix: str = "GPU") -> str:
    """A UUID-shaped id derived deterministically from the parts (node name, index, ...)."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU of a node. `mig`: None = MIG off; a tuple of profile names = MIG on with those
    devices (an empty tuple = MIG on, no instances created). `mig=True` takes the model's
    default layout."""

    model: str
    mig: tuple[str, ...] | bool | None = None

    def mig_layout(self) -> tuple[str, ...] | None:
        m = model(self.model)
        if self.mig is None or self.mig is False:
            return None
        if not m.mig_capable:
            raise ValueError(f"{self.model} is not MIG capable")
        layout = m.default_mig_layout if self.mig is True else tuple(self.mig)
        for name in layout:
            m.profile(name)
        if sum(m.profile(n).slices for n in layout) > 7:
            raise ValueError(f"MIG layout {layout} does not fit on {self.model}")
        return layout


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus: tuple[GpuSpec, ...]
    quota_library: str | None = DEFAULT_QUOTA_LIBRARY
    driver_version: str = DEFAULT_DRIVER_VERSION
    cuda_version: str = DEFAULT_CUDA_VERSION
    extra: dict = field(default_factory=dict)
    quota_library_config: str = QUOTA_FROM_NODE

    def __post_init__(self) -> None:
        if self.quota_library_config not in QUOTA_CONFIGS:
            raise ValueError(
                f"quota_library_config must be one of {QUOTA_CONFIGS}, "
                f"not {self.quota_library_config!r}"
            )


# The default mix: (gpus, quota library present)
DEFAULT_LAYOUTS: tuple[tuple[tuple[GpuSpec, ...], bool], ...] = (
    ((GpuSpec("NVIDIA A30"), GpuSpec("NVIDIA A30")), True),
    ((GpuSpec("NVIDIA L4"),), True),
    ((GpuSpec("NVIDIA A100-SXM4-80GB", mig=True), GpuSpec("NVIDIA A100-SXM4-80GB")), True),
    ((GpuSpec("NVIDIA GeForce RTX 4090"), GpuSpec("NVIDIA GeForce RTX 4090")), False),
    ((GpuSpec("NVIDIA A30", mig=True), GpuSpec("NVIDIA A30")), True),
    ((GpuSpec("NVIDIA H100 80GB HBM3"), GpuSpec("NVIDIA H100 80GB HBM3")), True),
)
# With gpus_per_node=G every node gets G GPUs of one model (MIG off), cycling through these.
UNIFORM_MODELS = (
    "NVIDIA A30",
    "NVIDIA L4",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA GeForce RTX 4090",
    "NVIDIA H100 80GB HBM3",
)


def node_names(count: int, prefix: str = "emu") -> list[str]:
    width = max(2, len(str(count)))
    return [f"{prefix}-{i:0{width}d}" for i in range(1, count + 1)]


def default_fleet(
    count: int, gpus_per_node: int | None = None, prefix: str = "emu"
) -> list[NodeSpec]:
    specs = []
    for i, name in enumerate(node_names(count, prefix)):
        if gpus_per_node:
            m = UNIFORM_MODELS[i % len(UNIFORM_MODELS)]
            gpus = tuple(GpuSpec(m) for _ in range(gpus_per_node))
            lib = m != "NVIDIA GeForce RTX 4090"
        else:
            gpus, lib = DEFAULT_LAYOUTS[i % len(DEFAULT_LAYOUTS)]
        specs.append(
            NodeSpec(name=name, gpus=gpus, quota_library=DEFAULT_QUOTA_LIBRARY if lib else None)
        )
    return specs

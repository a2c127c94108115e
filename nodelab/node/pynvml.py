"""A pynvml-compatible NVML for the lab node's emulated GPU (the bindings the platform's
sampler imports, `nvidia-ml-py`'s module name and calling conventions). It answers from
the node's GPU daemon instead of libnvidia-ml.so: handles, structs with the same field
names, NVMLError with the same codes, and the same "not supported" answers a real card
gives (utilisation in MIG mode, ECC on GeForce, page retirement on cards that remap
rows). Standard library only; it lives on the lab node's PYTHONPATH."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nodelab.node import gpuctl  # the same file, as the type checker finds it
else:
    import gpuctl  # beside this one on the lab node's PYTHONPATH

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_VALUE_NOT_AVAILABLE_ulonglong = 0xFFFFFFFFFFFFFFFF
_NO_INSTANCE = 0xFFFFFFFF

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"Unknown Error (code {self.value})")


def nvmlErrorString(value: int) -> str:
    return _MESSAGES.get(value, "Unknown Error")


class _Struct:
    def __init__(self, **fields: object):
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__dict__})"


class c_nvmlMemory_t(_Struct):
    pass


class c_nvmlUtilization_t(_Struct):
    pass


class c_nvmlPciInfo_t(_Struct):
    pass


class c_nvmlProcessInfo_t(_Struct):
    pass


class c_nvmlProcessUtilizationSample_t(_Struct):
    pass


class _Handle:
    def __init__(self, index: int, slot: int | None = None):
        self.index, self.slot = index, slot


_control: gpuctl.Control | None = None
_cache: tuple[float, dict] | None = None
_CACHE_S = 0.05  # one sampling pass reads one consistent state


def nvmlInit() -> None:
    global _control
    if _control is None:
        try:
            _control = gpuctl.Control()
        except (gpuctl.GpuUnavailable, OSError, KeyError, ValueError):
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED) from None


def nvmlShutdown() -> None:
    global _control, _cache
    if _control is None:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    _control.close()
    _control, _cache = None, None


def _state() -> dict:
    global _cache
    if _control is None:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    now = time.monotonic()
    if _cache is None or now - _cache[0] > _CACHE_S:
        try:
            _cache = (now, _control.request(op="state"))
        except (OSError, ValueError):
            raise NVMLError(NVML_ERROR_UNKNOWN) from None
    return _cache[1]


def _gpu(handle: _Handle) -> dict:
    gpus = _state()["gpus"]
    if not isinstance(handle, _Handle) or not 0 <= handle.index < len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    gpu = gpus[handle.index]
    if gpu["lost"]:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return gpu


def _mig(handle: _Handle) -> dict | None:
    if handle.slot is None:
        return None
    for mig in _gpu(handle)["migs"]:
        if mig["slot"] == handle.slot:
            return mig
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


# --- system


def nvmlSystemGetDriverVersion() -> str:
    return _state()["driver_version"]


def nvmlSystemGetCudaDriverVersion() -> int:
    return _state()["cuda_version"]


nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion


def nvmlDeviceGetCount() -> int:
    return len(_state()["gpus"])


# --- devices


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    handle = _Handle(int(index))
    _gpu(handle)  # a lost GPU has no handle (nvidia-smi: "Unable to determine the device handle")
    return handle


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> _Handle:
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    for gpu in _state()["gpus"]:
        if gpu["uuid"] == uuid:
            return nvmlDeviceGetHandleByIndex(gpu["index"])
        for mig in gpu["migs"]:
            if mig["uuid"] == uuid:
                return _Handle(gpu["index"], mig["slot"])
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    return _gpu(handle)["index"]


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    mig = _mig(handle)
    return mig["uuid"] if mig else _gpu(handle)["uuid"]


def nvmlDeviceGetName(handle: _Handle) -> str:
    mig = _mig(handle)
    name = _gpu(handle)["name"]
    return f"{name} MIG {mig['profile']}" if mig else name


def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> c_nvmlMemory_t:
    gpu, mig = _gpu(handle), _mig(handle)
    if mig:
        total, used = mig["total"], mig["used"]
        return c_nvmlMemory_t(total=total, used=used, free=total - used, reserved=0)
    total, used = gpu["total"], gpu["used"]
    if version:  # v2: the driver's reservation apart, as nvidia-smi shows it
        return c_nvmlMemory_t(
            total=total, reserved=gpu["reserved"], used=used - gpu["reserved"], free=total - used
        )
    # v1: used counts the reservation (NVML: "Sum of Reserved and Allocated device memory")
    return c_nvmlMemory_t(total=total, used=used, free=total - used)


def nvmlDeviceGetPciInfo(handle: _Handle) -> c_nvmlPciInfo_t:
    bus_id = _gpu(handle)["pci_bus_id"]
    return c_nvmlPciInfo_t(
        busId=bus_id.encode(), busIdLegacy=bus_id[4:].encode(), bus=int(bus_id[9:11], 16)
    )


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> c_nvmlUtilization_t:
    gpu = _gpu(handle)
    if handle.slot is not None or gpu["util"] is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # not in MIG mode
    return c_nvmlUtilization_t(gpu=gpu["util"]["gpu"], memory=gpu["util"]["memory"])


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    if handle.slot is not None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return _gpu(handle)["power_mw"]


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    if handle.slot is not None or sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return _gpu(handle)["temperature"]


def nvmlDeviceGetMigMode(handle: _Handle) -> list[int]:
    gpu = _gpu(handle)
    if not gpu["mig_capable"] or handle.slot is not None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    mode = NVML_DEVICE_MIG_ENABLE if gpu["mig_enabled"] else NVML_DEVICE_MIG_DISABLE
    return [mode, mode]


def nvmlDeviceGetMaxMigDeviceCount(handle: _Handle) -> int:
    gpu = _gpu(handle)
    if not gpu["mig_capable"]:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu["max_mig"]


def nvmlDeviceGetMigDeviceHandleByIndex(handle: _Handle, index: int) -> _Handle:
    gpu = _gpu(handle)
    if not gpu["mig_enabled"]:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if any(m["slot"] == index for m in gpu["migs"]):
        return _Handle(handle.index, int(index))
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetGpuInstanceId(handle: _Handle) -> int:
    mig = _mig(handle)
    if mig is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return mig["gi_id"]


def nvmlDeviceGetComputeInstanceId(handle: _Handle) -> int:
    mig = _mig(handle)
    if mig is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return mig["ci_id"]


def _ecc_gpu(handle: _Handle) -> dict:
    gpu = _gpu(handle)
    if not gpu["ecc"] or handle.slot is not None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu


def nvmlDeviceGetTotalEccErrors(handle: _Handle, error_type: int, counter_type: int) -> int:
    gpu = _ecc_gpu(handle)
    return gpu["ecc_uncorrected"] if error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 0


def nvmlDeviceGetRetiredPagesPendingStatus(handle: _Handle) -> int:
    gpu = _ecc_gpu(handle)
    if gpu["name"] != "Tesla T4":  # Ampere and later remap rows instead of retiring pages
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return NVML_FEATURE_ENABLED if gpu["retired_pages_pending"] else NVML_FEATURE_DISABLED


def nvmlDeviceGetRemappedRows(handle: _Handle) -> tuple[int, int, int, int]:
    gpu = _ecc_gpu(handle)
    if gpu["name"] == "Tesla T4" or gpu["mig_enabled"]:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    corrected, uncorrected, pending, failure = gpu["remapped_rows"]
    return corrected, uncorrected, pending, failure


def _processes(handle: _Handle) -> list[dict]:
    gpu, mig = _gpu(handle), _mig(handle)
    return [p for p in gpu["processes"] if mig is None or p["device"] == mig["uuid"]]


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[c_nvmlProcessInfo_t]:
    return [
        c_nvmlProcessInfo_t(
            pid=p["pid"],
            usedGpuMemory=p["used"],
            gpuInstanceId=_NO_INSTANCE if p["gi_id"] is None else p["gi_id"],
            computeInstanceId=_NO_INSTANCE if p["ci_id"] is None else p["ci_id"],
        )
        for p in _processes(handle)
    ]


nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses


def nvmlDeviceGetProcessUtilization(
    handle: _Handle, lastSeenTimeStamp: int
) -> list[c_nvmlProcessUtilizationSample_t]:
    """One sample per process that had some utilisation in the last sample period;
    NOT_FOUND when none had (NVML's documented behaviour); not supported under MIG."""
    gpu = _gpu(handle)
    if handle.slot is not None or gpu["mig_enabled"]:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    stamp = int(_state()["time"] * 1_000_000)
    samples = [
        c_nvmlProcessUtilizationSample_t(
            pid=p["pid"], timeStamp=stamp, smUtil=p["sm"], memUtil=p["mem"], encUtil=0, decUtil=0
        )
        for p in _processes(handle)
        if p["sm"] is not None and stamp > lastSeenTimeStamp
    ]
    if not samples:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return samples

"""What an emulated container's GPU program does over (emulated) time: the workload
profiles (steady, ramp, leak, burst, oom, idle), chosen by GPUPLATFORM_EMULATOR_* env."""

from __future__ import annotations

from dataclasses import dataclass

PROFILES = ("steady", "ramp", "leak", "burst", "oom", "idle")
# Profiles that size themselves to the framework cap (GPUPLATFORM_VRAM_LIMIT_MB, the XLA
# fraction...): a serving engine sizing its cache, PyTorch's per-process memory fraction.
# The others (a leak, a ramp, a burst) allocate regardless: only a hard limit (a MIG device,
# the quota library) or a full card stops them, with a CUDA OOM. GPUPLATFORM_EMULATOR_
# COOPERATIVE=0/1 overrides the profile's default.
COOPERATIVE_PROFILES = ("steady", "idle", "oom")
ENV_PREFIX = "GPUPLATFORM_EMULATOR_"

_PROFILE_DEFAULTS: dict[str, dict[str, float]] = {
    # base MiB, growth MiB/min, sm %, memory-bandwidth %
    "steady": {"mb": 2048, "rate": 0, "sm": 60, "mem": 25},
    "ramp": {"mb": 1024, "rate": 1024, "sm": 70, "mem": 30},
    "leak": {"mb": 1024, "rate": 256, "sm": 40, "mem": 15},
    "burst": {"mb": 2048, "rate": 0, "sm": 50, "mem": 20},
    "oom": {"mb": 1024, "rate": 2048, "sm": 80, "mem": 40},
    "idle": {"mb": 1024, "rate": 0, "sm": 0, "mem": 0},
}


# The tenant's own names for the workload: EMULATOR_*, or WORKLOAD_* as the node lab's
# workload program reads them (so one scenario runs against either far end).
TENANT_PREFIXES = ("EMULATOR_", "WORKLOAD_")


def _num(env: dict[str, str], key: str, default: float | None) -> float | None:
    raw = env.get(ENV_PREFIX + key)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        return default


@dataclass
class Workload:
    """What an emulated container does with its GPU (chosen by GPUPLATFORM_EMULATOR_* env)."""

    profile: str = "steady"
    base_mb: float = 2048
    rate_mb_per_min: float = 0
    peak_mb: float | None = None
    burst_mb: float = 4096
    period_s: float = 60
    burst_s: float = 10
    sm: int = 60
    mem: int = 25
    exit_after_s: float | None = None
    exit_code: int = 0
    idle_from_s: float | None = None  # no kernels between these (the lab workload's knobs)
    idle_until_s: float | None = None
    speed: float = 1.0
    unknown_profile: str | None = None
    cooperative: bool = True  # honours the framework cap (see COOPERATIVE_PROFILES)

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Workload:
        # The workload stands for the tenant's own program, so a tenant's launch may set it
        # with EMULATOR_* or WORKLOAD_* (the platform reserves GPUPLATFORM_* for itself).
        env = {
            **{
                ENV_PREFIX + k[len(prefix) :]: v
                for k, v in env.items()
                for prefix in TENANT_PREFIXES
                if k.startswith(prefix)
            },
            **env,
        }
        raw = env.get(ENV_PREFIX + "PROFILE", "steady").strip().lower() or "steady"
        profile = raw if raw in PROFILES else "steady"
        d = _PROFILE_DEFAULTS[profile]
        base = _num(env, "MB", d["mb"]) or 0.0
        peak = _num(env, "PEAK_MB", base * 4 if profile == "ramp" else None)
        coop_raw = env.get(ENV_PREFIX + "COOPERATIVE", "").strip().lower()
        cooperative = (
            coop_raw in ("1", "true", "yes", "on") if coop_raw else profile in COOPERATIVE_PROFILES
        )
        return cls(
            profile=profile,
            base_mb=max(0.0, base),
            rate_mb_per_min=_num(env, "RATE_MB_PER_MIN", d["rate"]) or 0.0,
            peak_mb=peak,
            burst_mb=_num(env, "BURST_MB", 4096) or 0.0,
            period_s=max(1.0, _num(env, "PERIOD_S", 60) or 60),
            burst_s=max(0.0, _num(env, "BURST_S", 10) or 0.0),
            sm=int(_num(env, "SM_UTIL", d["sm"]) or 0),
            mem=int(_num(env, "MEM_UTIL", d["mem"]) or 0),
            exit_after_s=_num(env, "EXIT_AFTER_S", None),
            exit_code=int(_num(env, "EXIT_CODE", 0) or 0),
            idle_from_s=_num(env, "IDLE_FROM_S", None),
            idle_until_s=_num(env, "IDLE_UNTIL_S", None),
            speed=_num(env, "SPEED", 1.0) or 1.0,
            unknown_profile=None if raw in PROFILES else raw,
            cooperative=cooperative,
        )

    def in_burst(self, t: float) -> bool:
        return self.profile == "burst" and (t % self.period_s) >= self.period_s - self.burst_s

    def demand(self, t: float) -> float:
        """MiB the workload wants after t emulated seconds."""
        p = self.profile
        if p in ("ramp", "leak", "oom"):
            d = self.base_mb + self.rate_mb_per_min * t / 60.0
            if self.peak_mb is not None and p == "ramp":
                d = min(d, max(self.peak_mb, self.base_mb))
            return d
        if p == "burst":
            return self.base_mb + (self.burst_mb if self.in_burst(t) else 0.0)
        return self.base_mb

    def crossing(self, limit: float) -> float | None:
        """Earliest t at which demand(t) > limit, for monotonic profiles (else None)."""
        if self.base_mb > limit:
            return 0.0
        if self.profile in ("leak", "oom", "ramp") and self.rate_mb_per_min > 0:
            if self.profile == "ramp" and self.peak_mb is not None and self.peak_mb <= limit:
                return None
            return (limit - self.base_mb) * 60.0 / self.rate_mb_per_min
        return None

    def util(self, t: float) -> tuple[int, int]:
        idle_over = self.idle_until_s is not None and t >= self.idle_until_s
        if self.idle_from_s is not None and t >= self.idle_from_s and not idle_over:
            return 0, 0
        if self.in_burst(t):
            return min(100, max(self.sm, 95)), min(100, max(self.mem, 60))
        return self.sm, self.mem

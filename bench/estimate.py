"""Pre-launch VRAM estimates: how many per second for the whole catalog across all
settings (each estimate includes its suggestions, each itself an estimate), and the
catalog table for a default inference setting (bf16, batch 1, 4k context or the
model's positions if fewer).

Baseline: the same estimates without their suggestions (one pass each), measured in the
same run, so the ratio says what the suggestions cost.

``estimator_families``: the model families (transformers' model_type) of the truth table
(bench/estimator_truth.py) whose every entry the estimator reads exactly, in parameters and
in KV bytes per token; baseline: the families in the table.

    .venv/bin/python bench/estimate.py [--seconds 3]
"""

import argparse
import itertools
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import estimator  # noqa: E402  (after the path set-up)

TIERS = (4096, 8192, 12288, 24576)


def requests() -> list:
    out = []
    settings = itertools.product(
        ("inference", "training"),
        ("bf16", "int8", "nf4"),
        (1, 8),
        (2048, 32768),
        ("transformers", "vllm"),
    )
    for (workload, dtype, batch, context, engine), name in itertools.product(
        list(settings), sorted(estimator.CATALOG)
    ):
        mapping = {
            "model": {"catalog": name},
            "workload": workload,
            "weights_dtype": dtype,
            "batch": batch,
            "context_tokens": context,
            "tier_mib": 24576,
        }
        if workload == "inference":
            mapping["engine"] = engine
        else:
            mapping.update(
                method="qlora" if dtype == "nf4" else "lora", seq_len=context, micro_batch=batch
            )
        try:
            out.append(estimator.EstimateRequest.from_mapping(mapping))
        except estimator.EstimatorError:
            continue  # e.g. 32k context on GPT-2 (1024 positions): refused, not estimated
    return out


def families_exact() -> tuple[int, int]:
    """(families read exactly, families in the truth table)."""
    import json  # noqa: PLC0415 - only this figure reads the fixture

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import estimator_truth  # noqa: PLC0415 - the truth table's own comparison

    entries = json.loads(estimator_truth.TRUTH.read_text())["entries"]
    wrong = {e["model_type"] for e in entries if estimator_truth.compare(e)}
    families = {e["model_type"] for e in entries}
    return len(families - wrong), len(families)


def rate(fn, items, seconds: float) -> float:
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for item in items:
            fn(item)
        done += len(items)
    return done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    items = requests()

    header = f"{'model':40} {'params':>16} {'weights GiB':>11} {'KV B/token':>10}  " + "  ".join(
        f"{t // 1024:>2} GB" for t in TIERS
    )
    print(header)
    for name in sorted(estimator.CATALOG):
        spec = estimator.CATALOG[name]
        base = estimator.EstimateRequest.from_mapping(
            {
                "model": {"catalog": name},
                "workload": "inference",
                "weights_dtype": "bf16",
                "batch": 1,  # context: min(4096, the model's learned positions)
            }
        )
        verdicts = []
        for tier in TIERS:
            result = estimator.estimate(replace(base, tier_mib=tier)).to_dict()
            verdicts.append(" fits" if result["fits"] else "  no ")
        d = estimator.estimate(base).to_dict()
        print(
            f"{name:40} {estimator.param_count(spec):>16,} "
            f"{d['weights_bytes'] / 2**30:>11.2f} {d['kv_bytes_per_token']:>10,}  "
            + "  ".join(verdicts)
        )

    full = rate(estimator.estimate, items, args.seconds)
    core = rate(lambda r: estimator.estimate(r, suggestions=False), items, args.seconds)
    print(f"{len(items)} distinct requests ({len(estimator.CATALOG)} models x settings)")
    print(
        f"RESULT estimates_per_s={full:.0f} estimates/s baseline={core:.0f} ratio={full / core:.2f}"
    )
    print(f"RESULT estimate_ms={1000 / full:.3f} ms")
    exact, families = families_exact()
    print(
        f"RESULT estimator_families={exact} families baseline={families} "
        f"ratio={exact / families:.2f}"
    )


if __name__ == "__main__":
    main()

"""Telemetry ingest: sample rows per second through the pipeline (`samples_ingest`:
bulk inserts of a batch of node samples) against one ORM `save()` per row (baseline),
measured in the same run. Target: at least 20x.

    .venv/bin/python bench/ingest.py [--nodes 200] [--gpus 8] [--rounds 3]
"""

import argparse
import time
from datetime import UTC, datetime

# bench/ is on sys.path; importing _db sets Django up, so it comes before the platform's
# imports below
from _db import throwaway_database

# isort: split
from django.utils import timezone

from nodes import services
from nodes.models import Gpu, GpuSample, Node, ProcessSample
from nodes.services.sampling import PIPELINE_CHUNK
from nodes.telemetry import GpuReading, NodeSample, ProcessReading


def make_samples(nodes, gpus_by_node, *, procs_per_gpu: int):
    results = []
    for node in nodes:
        readings, procs = [], []
        for gpu in gpus_by_node[node.pk]:
            readings.append(
                GpuReading(
                    index=gpu.index,
                    uuid=gpu.uuid,
                    name=gpu.model,
                    memory_total_mb=gpu.vram_total_mb,
                    memory_used_mb=gpu.index * 1000 + 512,
                    utilization_gpu=40,
                    utilization_memory=20,
                    temperature_c=55,
                    power_w=180.0,
                )
            )
            for p in range(procs_per_gpu):
                procs.append(
                    ProcessReading(
                        gpu_uuid=gpu.uuid,
                        pid=1000 + gpu.index * 10 + p,
                        used_memory_mb=256,
                        container_id="c" * 64,
                        sm_utilization=30,
                        memory_utilization=10,
                    )
                )
        results.append(
            (
                node,
                NodeSample(
                    source="nvml",
                    taken_at=datetime.now(UTC),
                    gpus=tuple(readings),
                    processes=tuple(procs),
                ),
            )
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--procs", type=int, default=1, help="processes per GPU")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with throwaway_database("ingest") as connection:
        nodes = [
            Node.objects.create(
                name=f"bench-{i:04d}",
                address=f"10.1.{i // 250}.{i % 250}",
                host_key="ssh-ed25519 AAAA",
                status="active",
            )
            for i in range(args.nodes)
        ]
        gpus_by_node = {}
        for node in nodes:
            gpus_by_node[node.pk] = Gpu.objects.bulk_create(
                [
                    Gpu(
                        node=node,
                        uuid=f"GPU-{node.pk:06d}-{i}",
                        index=i,
                        model="NVIDIA A100",
                        vram_total_mb=81920,
                    )
                    for i in range(args.gpus)
                ]
            )
        rows_per_round = args.nodes * args.gpus * (1 + args.procs)

        pipeline = []
        for _ in range(args.rounds):
            batch = make_samples(nodes, gpus_by_node, procs_per_gpu=args.procs)
            start = time.perf_counter()
            # what the sampling pipeline writes per call
            for offset in range(0, len(batch), PIPELINE_CHUNK):
                services.samples_ingest(results=batch[offset : offset + PIPELINE_CHUNK])
            pipeline.append(rows_per_round / (time.perf_counter() - start))

        # Baseline: the same rows, one ORM save() each (autocommit), for a slice of nodes.
        base_nodes = nodes[: max(1, args.nodes // 10)]
        base_rows = len(base_nodes) * args.gpus * (1 + args.procs)
        baseline = []
        for _ in range(args.rounds):
            batch = make_samples(base_nodes, gpus_by_node, procs_per_gpu=args.procs)
            start = time.perf_counter()
            now = timezone.now()
            for node, sample in batch:
                by_uuid = {g.uuid: g for g in gpus_by_node[node.pk]}
                for r in sample.gpus:
                    GpuSample(
                        gpu=by_uuid[r.uuid],
                        taken_at=now,
                        memory_used_mb=r.memory_used_mb,
                        memory_total_mb=r.memory_total_mb,
                        utilization_gpu=r.utilization_gpu,
                        utilization_memory=r.utilization_memory,
                        temperature_c=r.temperature_c,
                        power_w=r.power_w,
                    ).save()
                for p in sample.processes:
                    ProcessSample(
                        gpu=by_uuid[p.gpu_uuid],
                        taken_at=now,
                        pid=p.pid,
                        used_memory_mb=p.used_memory_mb,
                        container_id=p.container_id or "",
                    ).save()
            baseline.append(base_rows / (time.perf_counter() - start))

        best_pipeline, best_baseline = max(pipeline), max(baseline)
        print(
            f"database={connection.vendor} nodes={args.nodes} gpus/node={args.gpus} "
            f"processes/gpu={args.procs} rows/round={rows_per_round} rounds={args.rounds}"
        )
        print(f"pipeline rows/s per round: {', '.join(f'{r:,.0f}' for r in pipeline)}")
        print(f"baseline rows/s per round: {', '.join(f'{r:,.0f}' for r in baseline)}")
        print(
            f"RESULT ingest_rows_per_s={best_pipeline:.0f} rows/s "
            f"baseline={best_baseline:.0f} ratio={best_pipeline / best_baseline:.1f}"
        )


if __name__ == "__main__":
    main()

"""Fleet sampling end to end: N emulated nodes with 8 GPUs each, sampled by one worker
process (SSH round trip with the sampler on stdin, parsing, storing the rows), with
pooled SSH sessions against a new SSH connection per sample (the cron-and-ssh
baseline), in the same run. Targets: >= 300 node-samples/s, >= 5x the baseline.

The emulator runs in its own process, as the far end would.

    .venv/bin/python bench/sampling.py [--nodes 200] [--gpus 8] [--rounds 3]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _db import ROOT, throwaway_database  # noqa: I001 (bench/ on sys.path)


def start_emulator(state_dir: Path, public_key: str, nodes: int, gpus: int):  # type: ignore[no-untyped-def]
    proc = subprocess.Popen(  # noqa: S603 (fixed argv)
        [
            sys.executable,
            "-m",
            "nodes.emulator",
            "--count",
            str(nodes),
            "--gpus-per-node",
            str(gpus),
            "--base-port",
            "0",
            "--control-port",
            "-1",
            "--state-dir",
            str(state_dir),
            "--authorized-key",
            public_key,
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    fleet_file = state_dir / "fleet.json"
    deadline = time.monotonic() + 60
    while not fleet_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the emulator did not start")
        time.sleep(0.2)
    return proc, json.loads(fleet_file.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--baseline-nodes",
        type=int,
        default=60,
        help="nodes per baseline round (new connections are slow)",
    )
    args = parser.parse_args()

    with throwaway_database("sampling"), tempfile.TemporaryDirectory() as tmp:
        from nodes import services, ssh, telemetry
        from nodes.models import Node
        from nodes.tasks import SAMPLE_BATCH_SIZE

        key = ssh.load_or_create_platform_key(Path(tmp) / "id_ed25519")
        emulator, described = start_emulator(
            Path(tmp) / "emu", ssh.public_key_line(key), args.nodes, args.gpus
        )
        try:
            nodes = [
                Node.objects.create(
                    name=n["name"],
                    address=n["address"],
                    port=n["port"],
                    host_key=ssh.normalise_host_key(n["host_key"]),
                    status="active",
                )
                for n in described["nodes"]
            ]
            pool = ssh.SSHPool(private_key=key)
            for node in nodes:
                services.node_discover(node_id=node.pk, pool=pool)
            ids = [n.pk for n in nodes]
            gpu_rows = 0

            def sample_all(ids, pool):  # type: ignore[no-untyped-def]
                nonlocal gpu_rows
                done = 0
                for start in range(0, len(ids), SAMPLE_BATCH_SIZE):
                    result = services.nodes_sample(
                        node_ids=ids[start : start + SAMPLE_BATCH_SIZE], pool=pool
                    )
                    assert result["failed"] == 0, result
                    done += result["sampled"]
                    gpu_rows += result["gpu_rows"]
                return done

            sample_all(ids, pool)  # warm: every node has an open session now
            pooled = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                done = sample_all(ids, pool)
                pooled.append(done / (time.perf_counter() - start))
            pool.close()

            class FreshConnectionPool(ssh.SSHPool):
                """cron + ssh: a new SSH connection per sample, running the one-shot
                sampler (`python3 -` with its source on stdin), then hanging up."""

                def request(self, endpoint, argv, *, preamble, request, timeout=None):  # type: ignore[no-untyped-def]
                    one_shot = ["python3", "-"]
                    if request == telemetry.SERVE_REQUEST_DISCOVER:
                        one_shot.append("--discover")
                    try:
                        result = self.run(
                            endpoint, one_shot, stdin=telemetry.sampler_source().encode()
                        )
                        return result.stdout.split(b"\n", 1)[0]
                    finally:
                        self.drop(endpoint)

                def request_many(self, items, *, timeout=None, connect_threads=8):  # type: ignore[no-untyped-def]
                    # cron + `xargs -P 8 ssh`: new connections, eight at a time
                    def one(item):  # type: ignore[no-untyped-def]
                        endpoint, argv, preamble, request = item
                        try:
                            return self.request(endpoint, argv, preamble=preamble, request=request)
                        except ssh.SSHError as exc:
                            return exc

                    with ThreadPoolExecutor(max_workers=connect_threads) as executor:
                        return list(executor.map(one, items))

            fresh = FreshConnectionPool(private_key=key)
            base_ids = ids[: args.baseline_nodes]
            baseline = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                done = sample_all(base_ids, fresh)
                baseline.append(done / (time.perf_counter() - start))
            fresh.close()
        finally:
            emulator.terminate()
            emulator.wait(timeout=20)

        best, base = max(pooled), max(baseline)
        print(
            f"nodes={args.nodes} gpus/node={args.gpus} batch={SAMPLE_BATCH_SIZE} "
            f"cpus={os.cpu_count()}"
        )
        print(f"pooled node-samples/s per round: {', '.join(f'{r:.0f}' for r in pooled)}")
        print(
            f"fresh-connection node-samples/s per round: {', '.join(f'{r:.0f}' for r in baseline)}"
        )
        print(f"interval capacity at 30 s: {best * 30:,.0f} nodes per worker process")
        print(
            f"RESULT node_samples_per_s={best:.0f} samples/s baseline={base:.0f} "
            f"ratio={best / base:.1f}"
        )


if __name__ == "__main__":
    main()

"""Fleet sampling end to end: N emulated nodes with 8 GPUs each, sampled by one worker
process (SSH round trip with the sampler on stdin, parsing, storing the rows), with
pooled SSH sessions against a new SSH connection per sample (the cron-and-ssh
baseline), in the same run. Targets: >= 300 node-samples/s, >= 5x the baseline.

The emulator runs in its own process, as the far end would. Then the same against the
node lab (where it can start: root, Docker Engine, OpenSSH): real sshd per node, the
platform's sampler in the node's own python3 reading the lab's NVML, so each figure
includes a real OpenSSH handshake (baseline) or a real channel round trip (pooled).

    .venv/bin/python bench/sampling.py [--nodes 200] [--gpus 8] [--rounds 3] [--lab-nodes 8]
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

# bench/ is on sys.path; importing _db sets Django up, so it comes before the platform's
# imports below
from _db import ROOT, throwaway_database

# isort: split
from emulator.catalog import GpuSpec
from nodelab import Lab, LabNodeSpec, LabUnavailable
from nodes import services, ssh, telemetry
from nodes.models import Node
from nodes.tasks import SAMPLE_BATCH_SIZE


def start_emulator(state_dir: Path, public_key: str, nodes: int, gpus: int):
    proc = subprocess.Popen(  # noqa: S603 (fixed argv)
        [
            sys.executable,
            "-m",
            "emulator",
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


class Measured:
    def __init__(self, pooled: list[float], baseline: list[float]):
        self.pooled, self.baseline = pooled, baseline


def measure(described: dict, key, rounds: int, baseline_nodes: int) -> Measured:
    """Register the described nodes, then sample them pooled and with a new connection
    per sample, `rounds` times each."""
    nodes = [
        Node.objects.create(
            name=n["name"],
            address=n["address"],
            port=n["port"],
            ssh_user=n.get("ssh_user", "gpuplatform"),
            container_network=n.get("container_network", "bridge"),
            host_key=ssh.normalise_host_key(n["host_key"]),
            status="active",
        )
        for n in described["nodes"]
    ]
    pool = ssh.SSHPool(private_key=key)
    for node in nodes:
        services.node_discover(node_id=node.pk, pool=pool)
    ids = [n.pk for n in nodes]

    def sample_all(ids, pool):
        done = 0
        for start in range(0, len(ids), SAMPLE_BATCH_SIZE):
            result = services.nodes_sample(
                node_ids=ids[start : start + SAMPLE_BATCH_SIZE], pool=pool
            )
            assert result["failed"] == 0, result
            done += result["sampled"]
        return done

    sample_all(ids, pool)  # warm: every node has an open session now
    pooled = []
    for _ in range(rounds):
        start = time.perf_counter()
        done = sample_all(ids, pool)
        pooled.append(done / (time.perf_counter() - start))
    pool.close()

    class FreshConnectionPool(ssh.SSHPool):
        """cron + ssh: a new SSH connection per sample, running the one-shot
        sampler (`python3 -` with its source on stdin), then hanging up."""

        def request(self, endpoint, argv, *, preamble, request, timeout=None):
            one_shot = ["python3", "-"]
            if request == telemetry.SERVE_REQUEST_DISCOVER:
                one_shot.append("--discover")
            try:
                result = self.run(endpoint, one_shot, stdin=telemetry.sampler_source().encode())
                return result.stdout.split(b"\n", 1)[0]
            finally:
                self.drop(endpoint)

        def request_many(self, items, *, timeout=None, connect_threads=8):
            # cron + `xargs -P 8 ssh`: new connections, eight at a time
            def one(item):
                endpoint, argv, preamble, request = item
                try:
                    return self.request(endpoint, argv, preamble=preamble, request=request)
                except ssh.SSHError as exc:
                    return exc

            with ThreadPoolExecutor(max_workers=connect_threads) as executor:
                return list(executor.map(one, items))

    fresh = FreshConnectionPool(private_key=key)
    base_ids = ids[:baseline_nodes]
    baseline = []
    for _ in range(rounds):
        start = time.perf_counter()
        done = sample_all(base_ids, fresh)
        baseline.append(done / (time.perf_counter() - start))
    fresh.close()
    Node.objects.filter(pk__in=ids).delete()
    return Measured(pooled, baseline)


def report(label: str, m: Measured) -> tuple[float, float]:
    best, base = max(m.pooled), max(m.baseline)
    print(f"{label} pooled node-samples/s per round: {', '.join(f'{r:.0f}' for r in m.pooled)}")
    print(
        f"{label} fresh-connection node-samples/s per round: "
        f"{', '.join(f'{r:.0f}' for r in m.baseline)}"
    )
    return best, base


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
    parser.add_argument("--lab-nodes", type=int, default=8, help="lab nodes (0: no lab run)")
    args = parser.parse_args()

    with throwaway_database("sampling"), tempfile.TemporaryDirectory() as tmp:
        key = ssh.load_or_create_platform_key(Path(tmp) / "id_ed25519")
        emulator, described = start_emulator(
            Path(tmp) / "emu", ssh.public_key_line(key), args.nodes, args.gpus
        )
        try:
            emulated = measure(described, key, args.rounds, args.baseline_nodes)
        finally:
            emulator.terminate()
            emulator.wait(timeout=20)
        lab_result, lab_reason = None, ""
        if args.lab_nodes > 0:
            specs = [
                LabNodeSpec(f"lab-{i:02d}", tuple(GpuSpec("NVIDIA A30") for _ in range(args.gpus)))
                for i in range(1, args.lab_nodes + 1)
            ]
            try:
                lab = Lab.start(specs, authorized_keys=[ssh.public_key_line(key)])
            except LabUnavailable as exc:
                lab_reason = str(exc)
            else:
                try:
                    lab_result = measure(lab.describe(), key, args.rounds, args.lab_nodes)
                finally:
                    lab.stop()

        print(
            f"nodes={args.nodes} gpus/node={args.gpus} batch={SAMPLE_BATCH_SIZE} "
            f"cpus={os.cpu_count()}"
        )
        best, base = report("emulator", emulated)
        print(f"interval capacity at 30 s: {best * 30:,.0f} nodes per worker process")
        if lab_result is not None:
            print(f"lab: {args.lab_nodes} nodes x {args.gpus} GPUs, real sshd and dockerd each")
            lab_best, lab_base = report("lab", lab_result)
        elif args.lab_nodes > 0:
            print(f"no lab run: {lab_reason}")
        print(
            f"RESULT node_samples_per_s={best:.0f} samples/s baseline={base:.0f} "
            f"ratio={best / base:.1f}"
        )
        if lab_result is not None:
            print(
                f"RESULT lab_node_samples_per_s={lab_best:.0f} samples/s "
                f"baseline={lab_base:.0f} ratio={lab_best / lab_base:.1f}"
            )


if __name__ == "__main__":
    main()

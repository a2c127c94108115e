"""`python -m nodelab --count 4 --state-dir var/lab --authorized-key "<key>"`: start lab
nodes, write `<state-dir>/fleet.json` (what `manage.py register_fleet` reads), keep them
until SIGTERM or Ctrl-C, then stop them and remove everything they made. No Django."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from emulator.catalog import DEFAULT_LAYOUTS

from .lab import Lab
from .labnode import LabNodeSpec
from .prereqs import LabUnavailable

# The demo's mix: a quota library on most nodes, MIG on one, none on the GeForce node.
# the emulator's first four layouts: the demo looks the same on either far end
DEMO_LAYOUT = DEFAULT_LAYOUTS[:4]


def demo_specs(count: int, prefix: str = "lab", base_port: int = 0) -> list[LabNodeSpec]:
    width = max(2, len(str(count)))
    return [
        LabNodeSpec(
            f"{prefix}-{i + 1:0{width}d}",
            DEMO_LAYOUT[i % len(DEMO_LAYOUT)][0],
            quota_library=DEMO_LAYOUT[i % len(DEMO_LAYOUT)][1],
            port=base_port + i if base_port else 0,
            jupyter=True,  # the demo's Jupyter template may be placed on any node
        )
        for i in range(count)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--state-dir", type=Path, default=Path("var/lab"))
    parser.add_argument("--authorized-key", action="append", default=[], required=True)
    parser.add_argument("--name-prefix", default="lab")
    parser.add_argument(
        "--base-port", type=int, default=0, help="node i's sshd on base+i (0: any free port)"
    )
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        specs = demo_specs(args.count, args.name_prefix, args.base_port)
        lab = Lab.start(specs, authorized_keys=args.authorized_key)
    except LabUnavailable as exc:
        print(f"the node lab cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    args.state_dir.mkdir(parents=True, exist_ok=True)
    fleet_file = args.state_dir / "fleet.json"
    tmp = fleet_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(lab.describe(), indent=2) + "\n")
    tmp.replace(fleet_file)
    for node in lab.nodes:
        print(
            f"lab node {node.name}: sshd on 127.0.0.1:{node.port}, "
            f"{', '.join(g.model for g in node.spec.gpus)}, docker at {node.socket}",
            flush=True,
        )
    try:
        stop.wait()
    finally:
        fleet_file.unlink(missing_ok=True)
        left = lab.stop()
        for line in left:
            print(f"not cleaned up: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

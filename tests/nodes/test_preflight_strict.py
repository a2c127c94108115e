"""The stricter preflight: every probe's readings judged, the past-quota probe refused with
the out-of-memory error and nothing else, the script's own lines unforgeable by the
allocation command, a quota library a process can switch off from its own environment
found, runc read from the binary dockerd runs, and user namespaces required by policy."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

from emulator.catalog import QUOTA_FROM_ENVIRONMENT
from nodes import preflight, selectors
from nodes import services as node_services
from nodes.models import GateStatus, Gpu, NodePolicyChange
from tests.nodes.test_preflight import GOOD_FACTS, HARDENED, OOM_LINE, judge, runs
from tests.nodes.test_telemetry import FakeNode

NONCE = "0123456789abcdef" * 2
SHELLS = [s for s in ("/bin/sh", shutil.which("dash"), shutil.which("busybox")) if s]


def quota_check(gate: preflight.Gate, model: str = "NVIDIA A30") -> preflight.Check:
    return next(c for c in gate.checks if c.name == f"quota:{model}")


def with_probe(probes: list[preflight.ProbeRun], kind: str, **changes) -> list:
    """The probes with `kind`'s replaced: readings merged in, other fields set."""
    out = []
    for run in probes:
        if run.kind == kind:
            readings = {**run.readings, **changes.pop("readings", {})}
            run = preflight.ProbeRun(
                run.gpu_model,
                run.device,
                run.kind,
                error=changes.get("error", run.error),
                readings=readings,
                output=changes.get("output", run.output),
            )
        out.append(run)
    return out


# --- every probe's readings ------------------------------------------------------------------


@pytest.mark.parametrize("kind", preflight.PROBE_KINDS)
@pytest.mark.parametrize(
    ("reading", "words"),
    [
        ({"CapEff": "00000000a80425fb"}, "capabilities 00000000a80425fb (asked: none)"),
        ({"NoNewPrivs": "0"}, "NoNewPrivs 0 (asked: 1)"),
        ({"memory.max": "max"}, "cgroup memory.max max"),
        ({"pids.max": "max"}, "cgroup pids.max max"),
        ({"cpu.max": "max 100000"}, "cgroup cpu.max max 100000"),
    ],
)
def test_any_probe_that_saw_less_hardening_fails_the_gate_naming_it(kind, reading, words) -> None:
    gate = judge(probe_runs=with_probe(runs(), kind, readings=reading))
    assert not gate.passed
    assert f"the {kind} probe on NVIDIA A30 (GPU-1) saw {words}" in gate.reason
    # only that probe is named
    others = [k for k in preflight.PROBE_KINDS if k != kind]
    assert not any(f"the {k} probe" in gate.reason for k in others)


def test_a_probe_on_another_model_is_judged_too() -> None:
    probes = runs() + [
        preflight.ProbeRun(
            "NVIDIA L4", "GPU-2", kind, readings={**r.readings, "pids.max": "max"}, output=r.output
        )
        for kind, r in zip(preflight.PROBE_KINDS, runs(), strict=True)
    ]
    gate = preflight.evaluate(
        facts=GOOD_FACTS,
        driver_version="550.54.15",
        policy=preflight.Policy(),
        runs=probes,
        software_models=["NVIDIA A30", "NVIDIA L4"],
        quota_library="/lib/q.so",
    )
    assert not gate.passed
    assert "the within probe on NVIDIA L4 (GPU-2) saw cgroup pids.max max" in gate.reason
    assert "NVIDIA A30" not in gate.reason


def test_a_probe_that_did_not_report_leaves_the_others_judged_and_the_quota_unproven() -> None:
    gone = preflight.ProbeRun(
        "NVIDIA A30", "GPU-1", "env-unset", error="the probe container disappeared"
    )
    probes = [p if p.kind != "env-unset" else gone for p in runs()]
    gate = judge(probe_runs=probes)
    assert gate.passed  # the hardening of the three that reported is what was asked
    hardening = next(c for c in gate.checks if c.name == "hardening")
    assert "in each of 3 probe containers (1 did not report" in hardening.detail
    assert gate.quota == {"NVIDIA A30": "unproven"}
    assert "the probe container disappeared" in quota_check(gate).detail


# --- refused with the out-of-memory error, nothing else -----------------------------------------


@pytest.mark.parametrize(
    ("code", "output", "state", "words"),
    [
        ("1", (OOM_LINE,), "proven", "refused 512 MiB past a 256 MiB quota"),
        ("1", ("[vramquota] refused", "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY"), "proven", ""),
        ("0", (), "ineffective", "is not enforcing"),
        (
            "1",
            ("RuntimeError: CUDA error: unspecified launch failure (999)",),
            "unproven",
            "failed (exit 1) but not with the CUDA out-of-memory error: RuntimeError",
        ),
        ("1", (), "unproven", "failed (exit 1) but not with the CUDA out-of-memory error"),
        # argparse's usage error is exit 2: the number alone is not CUDA's result 2
        ("2", ("usage: alloc [-h] MB",), "unproven", "not with the CUDA out-of-memory error"),
        (
            "127",
            ("probe: line 11: /usr/bin/gpu-workload: not found",),
            "unproven",
            "could not be run (exit 127: probe: line 11: /usr/bin/gpu-workload: not found)",
        ),
        ("126", ("Permission denied",), "unproven", "could not be run (exit 126"),
        ("139", ("Segmentation fault",), "unproven", "killed by signal 11: Segmentation fault"),
        ("unreadable", (), "unproven", "reported no exit status"),
    ],
)
def test_the_past_quota_probe_proves_the_quota_only_by_the_out_of_memory_error(
    code, output, state, words
) -> None:
    probes = with_probe(runs(), "past", readings={"alloc_exit": code}, output=output)
    gate = judge(probe_runs=probes)
    assert gate.passed  # the quota limits sales; it never closes the node
    assert gate.quota == {"NVIDIA A30": state}
    assert words in quota_check(gate).detail
    assert (preflight.proven_models(gate.quota) == ["NVIDIA A30"]) is (state == "proven")


def test_an_out_of_memory_line_of_a_crash_that_died_of_a_signal_proves_nothing() -> None:
    probes = with_probe(runs(), "past", readings={"alloc_exit": "134"}, output=(OOM_LINE,))
    assert judge(probe_runs=probes).quota == {"NVIDIA A30": "unproven"}


# --- a library a process can configure from its own environment ---------------------------------


@pytest.mark.parametrize(
    ("env_set", "env_unset", "words"),
    [
        ("0", "1", ["sets CUDA_DISABLE_CONTROL=true and CUDA_DEVICE_MEMORY_LIMIT=81920m"]),
        ("1", "0", ["unsets LD_PRELOAD"]),
        ("0", "0", ["sets CUDA_DISABLE_CONTROL=true", "or one that unsets LD_PRELOAD"]),
    ],
)
def test_a_library_a_process_can_switch_off_or_leave_out_is_sold_whole(
    env_set, env_unset, words
) -> None:
    gate = judge(probe_runs=runs(env_set=env_set, env_unset=env_unset))
    assert gate.passed
    assert gate.quota == {"NVIDIA A30": "environment"}
    assert preflight.proven_models(gate.quota) == []
    detail = quota_check(gate).detail
    assert "the quota library (/lib/q.so) can only be configured by environment" in detail
    assert "allocated 512 MiB past its 256 MiB quota: sold whole" in detail
    for word in words:
        assert word in detail


def test_a_bypass_probe_that_crashed_or_never_ran_proves_nothing() -> None:
    crashed = with_probe(runs(), "env-set", readings={"alloc_exit": "127"}, output=("not found",))
    gate = judge(probe_runs=crashed)
    assert gate.quota == {"NVIDIA A30": "unproven"}
    assert "not proven against a process that sets CUDA_DISABLE_CONTROL" in quota_check(gate).detail
    only_two = [r for r in runs() if r.kind in ("within", "past")]
    gate = judge(probe_runs=only_two)
    assert gate.quota == {"NVIDIA A30": "unproven"}
    assert "no env-set probe ran" in quota_check(gate).detail


def test_the_bypass_probes_set_and_unset_what_a_tenant_would() -> None:
    allocation = ["/usr/bin/gpu-workload"]
    assert preflight.probe_command(NONCE, "env-set", allocation)[3:] == (
        "probe",
        "env",
        "CUDA_DISABLE_CONTROL=true",
        "CUDA_DEVICE_MEMORY_LIMIT=81920m",
        "CUDA_DEVICE_MEMORY_LIMIT_0=81920m",
        "/usr/bin/gpu-workload",
    )
    assert preflight.probe_command(NONCE, "env-unset", allocation)[3:] == (
        "probe",
        "env",
        "-u",
        "LD_PRELOAD",
        "/usr/bin/gpu-workload",
    )
    assert preflight.probe_command(NONCE, "within", allocation)[3:] == (
        "probe",
        "/usr/bin/gpu-workload",
    )
    assert [preflight.probe_alloc_mb(k) for k in preflight.PROBE_KINDS] == [128, 512, 512, 512]
    with pytest.raises(ValueError, match="nonce"):
        preflight.probe_script("not-hex; rm -rf /")


# --- the frame ----------------------------------------------------------------------------------


def frame(*middle: str, end: bool = True) -> str:
    head = "".join(f"{NONCE} {k}\t{v}\n" for k, v in HARDENED.items())
    tail = f"{NONCE} alloc_exit\t1\n" + (f"{NONCE} end\tdone\n" if end else "")
    return head + "".join(line + "\n" for line in middle) + tail


def test_the_allocation_commands_lines_never_count_as_the_scripts() -> None:
    seen = preflight.parse_probe_output(
        frame(
            "| alloc_exit:\t2",  # the old format's line
            f"| {NONCE} alloc_exit\t2",  # even knowing the nonce, it is behind the prefix
            f"| made up\r{NONCE} alloc_exit\t2",  # a carriage return is no new line
            f"| x\u2028{NONCE} alloc_exit\t2",
        ),
        NONCE,
    )
    assert seen.problem == ""
    assert seen.readings["alloc_exit"] == "1"
    assert len(seen.output) == 4


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (frame(f"{NONCE} alloc_exit\t2"), "the probe's alloc_exit line appears twice"),
        (frame(f"{NONCE} CapEff\t0000000000000000"), "the probe's CapEff line appears twice"),
        (frame() + f"{NONCE} alloc_exit\t2\n", "output after the probe's end line"),
        (frame() + "| late\n", "output after the probe's end line"),
        (frame(f"{NONCE} verdict\tproven"), "unknown line 'verdict'"),
    ],
)
def test_output_that_is_not_the_scripts_own_is_not_read_at_all(text, words) -> None:
    seen = preflight.parse_probe_output(text, NONCE)
    assert words in seen.problem and "not trusted" in seen.problem
    assert seen.readings == {}


def test_lines_of_another_nonce_are_the_commands() -> None:
    other = "f" * 32
    seen = preflight.parse_probe_output(frame(f"{other} alloc_exit\t0"), NONCE)
    assert seen.problem == "" and seen.readings["alloc_exit"] == "1"
    assert seen.output == (f"{other} alloc_exit\t0",)


FORGER = textwrap.dedent(
    """
    import os, sys
    nonce = sys.argv[1]
    print("alloc_exit:\\t2")
    print(f"{nonce} alloc_exit\\t2")
    sys.stdout.write(f"x\\r{nonce} alloc_exit\\t2\\n")
    sys.stdout.flush()
    if sys.argv[2] == "proc":
        # past the pipe: straight into the script's own output, through /proc
        pid, top = os.getppid(), None
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"gpuplatform-probe" not in fh.read():
                    break
            top = pid
            with open(f"/proc/{pid}/status") as fh:
                pid = int(next(l for l in fh if l.startswith("PPid:")).split()[1])
        with open(f"/proc/{top}/fd/1", "w") as out:
            out.write(f"{nonce} alloc_exit\\t2\\n")
    sys.exit(1)
    """
)


def run_probe(shell: str, *allocation: str) -> subprocess.CompletedProcess[str]:
    argv = list(preflight.probe_command(NONCE, "past", allocation))
    argv[0] = shell
    if shell.endswith("busybox"):
        argv.insert(1, "sh")
    done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    # decoded as the gate decodes `docker logs`: no newline translation (a "\r" stays)
    return subprocess.CompletedProcess(
        argv, done.returncode, done.stdout.decode("utf-8", "replace"), done.stderr.decode()
    )


@pytest.mark.parametrize("shell", SHELLS)
def test_a_forged_alloc_exit_2_in_the_commands_output_does_not_pass(shell: str) -> None:
    done = run_probe(shell, sys.executable, "-c", FORGER, NONCE, "print")
    assert done.returncode == 0, done.stderr
    seen = preflight.parse_probe_output(done.stdout, NONCE)
    assert seen.problem == ""
    assert seen.readings["alloc_exit"] == "1"  # the script's own reading, not the forgery
    assert set(seen.readings) == {*preflight.HARDENING_KEYS, "alloc_exit"}
    assert f"{NONCE} alloc_exit\t2" in seen.output
    run = preflight.ProbeRun("NVIDIA A30", "GPU-1", "past", readings=seen.readings,
                             output=seen.output)  # fmt: skip
    assert preflight.refusal(run)[0] is None  # exit 1 without the OOM error: not proven
    gate = judge(probe_runs=[r if r.kind != "past" else run for r in runs()])
    assert gate.quota == {"NVIDIA A30": "unproven"}


@pytest.mark.parametrize("shell", SHELLS)
def test_a_forgery_written_past_the_pipe_spoils_the_reading_instead_of_passing(shell: str) -> None:
    done = run_probe(shell, sys.executable, "-c", FORGER, NONCE, "proc")
    assert done.returncode == 0, done.stderr
    seen = preflight.parse_probe_output(done.stdout, NONCE)
    assert "alloc_exit line appears twice" in seen.problem
    assert seen.readings == {}


@pytest.mark.parametrize("shell", SHELLS)
def test_the_script_reports_a_missing_program_and_a_crash_by_their_exit(shell: str) -> None:
    missing = preflight.parse_probe_output(run_probe(shell, "/nonexistent/alloc").stdout, NONCE)
    assert missing.readings["alloc_exit"] == "127"
    assert any("not found" in line for line in missing.output)
    crash = preflight.parse_probe_output(
        run_probe(shell, "/bin/sh", "-c", "kill -SEGV $$").stdout, NONCE
    )
    assert crash.readings["alloc_exit"] == "139"
    oom = preflight.parse_probe_output(
        run_probe(shell, "/bin/sh", "-c", f"echo '{OOM_LINE}' >&2; exit 1").stdout, NONCE
    )
    run = preflight.ProbeRun("m", "GPU-1", "past", readings=oom.readings, output=oom.output)
    assert oom.output == (OOM_LINE,) and preflight.refusal(run) == (True, "")


# --- the gate on emulated nodes -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_every_probe_kind_runs_and_is_kept_with_its_readings_and_output(worker_fleet):
    row = worker_fleet().registered[0]
    assert row.gate_status == GateStatus.PASSED, row.gate_reason
    probes = row.preflight["probes"]
    assert [p["kind"] for p in probes] == list(preflight.PROBE_KINDS)
    for probe in probes:
        assert probe["error"] == ""
        assert {k: probe["readings"][k] for k in HARDENED} == HARDENED
    exits = {p["kind"]: p["readings"]["alloc_exit"] for p in probes}
    assert exits == {"within": "0", "past": "1", "env-set": "1", "env-unset": "1"}
    past = next(p for p in probes if p["kind"] == "past")
    assert any("CUDA out of memory" in line for line in past["output"])
    assert row.preflight["quota"] == {"NVIDIA GeForce RTX 4090": "proven"}


@pytest.mark.django_db(transaction=True)
def test_a_node_whose_library_obeys_the_process_environment_is_sold_whole(worker_fleet):
    fleet = worker_fleet()
    fleet.nodes[0].state.quota_library_config = QUOTA_FROM_ENVIRONMENT
    node = node_services.node_discover(node_id=fleet.registered[0].pk)
    assert node.gate_status == GateStatus.PASSED
    assert node.preflight["quota"] == {"NVIDIA GeForce RTX 4090": "environment"}
    check = next(c for c in node.preflight["checks"] if c["name"].startswith("quota:"))
    assert "can only be configured by environment" in check["detail"]
    assert "unsets LD_PRELOAD" in check["detail"]
    assert Gpu.objects.get(node=node).whole_card_only
    exits = {p["kind"]: p["readings"]["alloc_exit"] for p in node.preflight["probes"]}
    assert exits == {"within": "0", "past": "1", "env-set": "0", "env-unset": "0"}


# --- user namespaces ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_policy_can_require_userns_remap_and_a_node_without_it_fails(
    worker_fleet, ops_user, api_ops, client
):
    fleet = worker_fleet()
    row, state = fleet.registered[0], fleet.nodes[0].state
    assert row.preflight["facts"]["userns_remap"] == "false"
    assert row.gate_status == GateStatus.PASSED  # not required by default
    assert "userns" not in {c["name"] for c in row.preflight["checks"]}

    response = api_ops.patch(
        "/api/v1/node-policy/",
        {"require_userns_remap": True, "reason": "tenants' root is not the node's"},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["require_userns_remap"] is True
    change = NodePolicyChange.objects.get(field="require_userns_remap")
    assert (change.old_value, change.new_value) == (False, True)
    bad = api_ops.patch(
        "/api/v1/node-policy/", {"require_userns_remap": "maybe", "reason": "x"}, format="json"
    )
    assert bad.status_code == 400

    node = node_services.node_discover(node_id=row.pk)
    assert node.gate_status == GateStatus.FAILED
    assert "dockerd does not remap user namespaces (userns-remap)" in node.gate_reason
    assert node.preflight["policy"]["require_userns_remap"] is True
    assert node_services.allocation_reserve(owner_key="slice-1", vram_mb=4096) is None

    state.userns_remap = True
    node = node_services.node_discover(node_id=row.pk)
    assert node.gate_status == GateStatus.PASSED, node.gate_reason
    assert node.preflight["facts"]["userns_remap"] == "true"
    userns = next(c for c in node.preflight["checks"] if c["name"] == "userns")
    assert userns["ok"] and "remaps user namespaces" in userns["detail"]
    client.force_login(ops_user)
    page = client.get(f"/ops/nodes/{row.pk}/").content.decode()
    assert "user namespaces remapped (userns-remap)" in page
    assert "at <code>/usr/sbin/runc</code>" in page


def test_userns_unknown_fails_only_where_required() -> None:
    required = preflight.Policy(require_userns_remap=True)
    assert not judge({"userns_remap": ""}, required).passed
    assert "could not be read" in judge({"userns_remap": ""}, required).reason
    assert judge({"userns_remap": "true"}, required).passed
    assert judge({"userns_remap": ""}).passed


@pytest.mark.django_db
def test_the_policy_page_edits_the_userns_requirement(client, ops_user) -> None:
    client.force_login(ops_user)
    page = client.get("/ops/fleet/node-policy/").content.decode()
    assert "Require user-namespace remapping" in page
    policy = selectors.preflight_policy()
    form = {
        "min_toolkit_version": policy.min_toolkit_version,
        "min_runc_version": policy.min_runc_version,
        "driver_branches": ", ".join(policy.driver_branches),
        "known_fixed_builds": "\n".join(
            f"{k['component']} {k['build']} {k['reason']}" for k in policy.known_fixed_builds
        ),
        "probe_image": policy.probe_image,
        "probe_command": "\n".join(policy.probe_command),
        "probe_environment": "\n".join(f"{k}={v}" for k, v in policy.probe_environment.items()),
        "require_userns_remap": "on",
        "reason": "remapped nodes only",
    }
    saved = client.post("/ops/fleet/node-policy/", form)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    assert selectors.preflight_policy().require_userns_remap is True
    assert set(NodePolicyChange.objects.values_list("field", flat=True)) == {"require_userns_remap"}


# --- runc from the binary dockerd runs --------------------------------------------------------


@pytest.fixture
def fake_node(tmp_path):
    return FakeNode(tmp_path, sys.executable)


def docker_answers(node, *, version: str, info: str) -> None:
    (node.bin.parent / "version.json").write_text(version, encoding="utf-8")
    (node.bin.parent / "info.json").write_text(info, encoding="utf-8")
    root = node.bin.parent
    node.script(
        "docker",
        f'case "$1" in version) /bin/cat "{root}/version.json";; '
        f'info) /bin/cat "{root}/info.json";; *) exit 1;; esac',
    )


def runc_binary(node, path, lines: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nprintf '{lines}'\n", encoding="utf-8")
    path.chmod(0o755)


def dpkg_owns(node, owned: dict[str, tuple[str, str]]) -> None:
    """A fake dpkg-query: -S PATH names the owner of each path in `owned`, -W its build."""
    search = " ".join(f'"{p}") echo "{pkg}: {p}";;' for p, (pkg, _) in owned.items())
    builds = " ".join(f'"{pkg}") printf "{b}";;' for pkg, b in owned.values())
    node.script(
        "dpkg-query",
        f'if [ "$1" = -S ]; then case "$2" in {search} *) exit 1;; esac; exit 0; fi\n'
        f'case "$3" in {builds} *) exit 1;; esac',
    )


def facts_of(node) -> tuple[dict, list]:
    raw, _ = node.sample("--discover")
    return raw["capabilities"]["preflight"], raw["errors"]


SERVER = (
    '{"Version":"26.1.4","Components":[{"Name":"runc","Version":"%s",'
    '"Details":{"GitCommit":"%s"}}]}'
)
INFO = (
    '{"CgroupVersion":"2","DefaultRuntime":"runc","Runtimes":{"runc":{"path":"%s"},'
    '"nvidia":{"path":"nvidia-container-runtime"}},"RuncCommit":{"ID":"%s"},'
    '"SecurityOptions":["name=apparmor","name=seccomp,profile=builtin"%s,"name=cgroupns"]}'
)


def test_runc_is_read_from_dockerds_runtime_path_and_built_by_the_package_that_owns_it(
    fake_node, tmp_path
) -> None:
    dockerds = tmp_path / "opt" / "runc" / "runc"
    runc_binary(fake_node, dockerds, "runc version 1.1.12\\ncommit: v1.1.12-0-g51d5e94\\n")
    # another, older runc on PATH, from another package: never paired with dockerd's
    runc_binary(fake_node, fake_node.bin / "runc", "runc version 1.1.5\\ncommit: 1.1.5+ds1\\n")
    dpkg_owns(
        fake_node,
        {str(dockerds): ("runc-custom", "1.1.12-3"), str(fake_node.bin / "runc"): ("runc", "9")},
    )
    docker_answers(
        fake_node,
        version=SERVER % ("1.1.12", "v1.1.12-0-g51d5e94"),
        info=INFO % (dockerds, "v1.1.12-0-g51d5e94", ',"name=userns"'),
    )
    facts, errors = facts_of(fake_node)
    assert facts["runc_path"] == str(dockerds)
    assert (facts["runc_version"], facts["runc_commit"]) == ("1.1.12", "v1.1.12-0-g51d5e94")
    assert (facts["runc_package"], facts["runc_build"]) == ("runc-custom", "1.1.12-3")
    assert facts["userns_remap"] == "true" and facts["cgroup_version"] == "2"
    assert not [e for e in errors if "runc" in e]


def test_a_bare_runtime_name_is_found_on_path_and_a_file_no_package_owns_has_no_build(
    fake_node,
) -> None:
    runc_binary(fake_node, fake_node.bin / "runc", "runc version 1.1.12\\ncommit: v1.1.12\\n")
    dpkg_owns(fake_node, {"/usr/sbin/runc": ("runc", "1.1.12-0ubuntu2~22.04.1")})
    docker_answers(
        fake_node, version=SERVER % ("1.1.12", "v1.1.12"), info=INFO % ("runc", "v1.1.12", "")
    )
    facts, _ = facts_of(fake_node)
    assert facts["runc_path"] == str(fake_node.bin / "runc")
    assert facts["runc_version"] == "1.1.12"
    assert facts["runc_build"] == facts["runc_package"] == ""  # dpkg owns another file
    assert facts["userns_remap"] == "false"


def test_a_binary_that_is_not_the_one_dockerd_runs_gives_dockerds_version_and_no_build(
    fake_node,
) -> None:
    runc_binary(
        fake_node, fake_node.bin / "runc", "runc version 1.1.5+ds1\\ncommit: 1.1.5+ds1-1+deb12u1\\n"
    )
    dpkg_owns(fake_node, {str(fake_node.bin / "runc"): ("runc", "1.1.5+ds1-1+deb12u1")})
    docker_answers(
        fake_node,
        version=SERVER % ("1.1.4", "v1.1.4-0-g5fd4c4d"),
        info=INFO % ("runc", "v1.1.4-0-g5fd4c4d", ""),
    )
    facts, errors = facts_of(fake_node)
    # the patched build on PATH is not what dockerd runs: its build must not pass for it
    assert facts["runc_version"] == "1.1.4" and facts["runc_build"] == ""
    assert facts["runc_path"] == ""
    assert any("but dockerd runs 1.1.4" in e for e in errors)
    runc = {k: v for k, v in facts.items() if k.startswith("runc_")}
    gate = judge(runc, preflight.Policy(known_fixed=(preflight.KnownBuild(
        "runc", "1.1.5+ds1-1+deb12u1", "DSA-5615-1"),)))  # fmt: skip
    assert not gate.passed and "runc 1.1.4 is older than 1.1.12" in gate.reason


def test_a_wrapper_default_runtime_gives_the_runc_inside_it_and_no_package_build(
    fake_node,
) -> None:
    runc_binary(
        fake_node,
        fake_node.bin / "nvidia-container-runtime",
        "NVIDIA Container Runtime version 1.17.8\\ncommit: abc\\nspec: 1.2.0\\n\\n"
        "runc version 1.1.12\\ncommit: v1.1.12-0-g51d5e94\\nspec: 1.0.2-dev\\n",
    )
    dpkg_owns(
        fake_node,
        {str(fake_node.bin / "nvidia-container-runtime"): ("nvidia-container-toolkit", "1.17.8")},
    )
    info = INFO % ("runc", "v1.1.12-0-g51d5e94", "")
    docker_answers(
        fake_node,
        version=SERVER % ("1.1.12", "v1.1.12-0-g51d5e94"),
        info=info.replace('"DefaultRuntime":"runc"', '"DefaultRuntime":"nvidia"'),
    )
    facts, _ = facts_of(fake_node)
    assert facts["runc_path"] == str(fake_node.bin / "nvidia-container-runtime")
    assert (facts["runc_version"], facts["runc_commit"]) == ("1.1.12", "v1.1.12-0-g51d5e94")
    assert facts["runc_build"] == ""  # the toolkit's package is not runc's build


def test_without_docker_answering_nothing_about_runc_or_userns_is_guessed(fake_node) -> None:
    runc_binary(fake_node, fake_node.bin / "runc", "runc version 1.1.12\\n")
    fake_node.script("docker", "exit 1")
    facts, _ = facts_of(fake_node)
    assert facts["userns_remap"] == ""
    # a runc on PATH is not known to be dockerd's
    assert facts["runc_version"] == facts["runc_path"] == facts["runc_build"] == ""
    assert set(facts) == set(preflight.FACT_KEYS)

"""`gpp` driving a slice's life against the live test server and an emulated GPU node:
launch from a TOML or YAML file with --wait, ps, show, logs (and logs -f until the slice
stops), stop, resume, usage; a launch that does not fit refused with the smallest tier;
volumes; `gpp ssh` and `gpp forward` running OpenSSH with the API's gateway details."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from gateway.models import GatewayStream
from nodes import ssh
from tenants import services
from tenants.models import Slice, Volume
from tests.cli.support import LosingProxy
from tests.conftest import SSH_KEY
from tests.gateway.support import client_key

pytestmark = pytest.mark.django_db(transaction=True)


def _launch(gpp, *extra: str) -> dict:
    done = gpp("launch", "--image", "CUDA base", "--model", "Qwen/Qwen2.5-1.5B",
               "--context", "2048", "--ssh-key", SSH_KEY, "--wait", "--json", *extra)  # fmt: skip
    assert done.code == 0, done.stderr
    return done.json()


def test_launch_wait_ps_show_logs_stop_resume_and_usage(gpp, owner, fleet, credit, tmp_path):
    bought = gpp("buy", "4", "--hours", "1", "--yes", "--json").json()
    spec = tmp_path / "job.toml"
    spec.write_text(
        'image = "CUDA base"\ntier = "4GB"\nmodel = "Qwen/Qwen2.5-1.5B"\n'
        f'ssh_key = "{SSH_KEY}"\ncommand = "python3 train.py --epochs 2"\n'
        'environment = {RUN = "cli"}\n\n[job]\ncontext_tokens = 2048\n'
    )
    launched = gpp("launch", str(spec), "--wait")
    assert launched.code == 0, launched.stderr
    # live progress on stderr: each transition up to running
    assert "provisioning -> running" in launched.stderr
    [row] = gpp("ps", "--json").json()
    assert (row["state"], row["purchase"], row["tier_name"]) == ("running", bought["id"], "4 GB")
    ident = row["id"]
    assert f"Slice {ident} is running." in launched.stdout
    assert f"gpp ssh {ident}" in launched.stdout

    slice = Slice.objects.get(pk=ident)
    assert slice.command == ["python3", "train.py", "--epochs", "2"]
    assert slice.environment == {"RUN": "cli"} and slice.model_request["context_tokens"] == 2048

    shown = gpp("show", str(ident))
    assert shown.code == 0, shown.stderr
    assert "running" in shown.stdout and "4 GB (purchase" in shown.stdout
    assert "provisioning" in shown.stdout  # the transitions table

    emu = fleet.nodes[0]
    emu.container_print(slice.container_id, "epoch 1 loss 0.9\nepoch 2 loss 0.7")
    services.slice_logs_collect(slice_id=ident)
    logs = gpp("logs", f"slice-{ident}")
    assert logs.code == 0, logs.stderr
    assert logs.stdout.index("epoch 1 loss 0.9") < logs.stdout.index("epoch 2 loss 0.7")
    as_lines = [json.loads(line) for line in gpp("logs", str(ident), "--json").stdout.splitlines()]
    assert [line["text"] for line in as_lines][-2:] == ["epoch 1 loss 0.9", "epoch 2 loss 0.7"]
    after = as_lines[-2]["seq"]
    assert [json.loads(x)["text"] for x in gpp("logs", str(ident), "--after", str(after),
                                               "--json").stdout.splitlines()] == [
        "epoch 2 loss 0.7"
    ]  # fmt: skip

    services.running_slices_meter(now=timezone.now() + timedelta(minutes=5))
    stopped = gpp("stop", str(ident), "--yes", "--json", "--wait")
    assert stopped.code == 0, stopped.stderr
    assert stopped.json()["state"] == "stopped"
    assert gpp("ps", "--json").json() == []  # stopped is not live
    assert [r["id"] for r in gpp("ps", "--all", "--json").json()] == [ident]

    resumed = gpp("resume", str(ident), "--wait", "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json()["state"] == "running" and resumed.json()["purchase"] == bought["id"]
    again = gpp("resume", str(ident), "--json")  # a running slice cannot be resumed
    assert again.code == 1 and again.error()["code"] == "invalid_transition"
    runs = gpp("show", str(ident))  # a resumed slice lists its runs
    assert runs.code == 0, runs.stderr
    rows = runs.stdout.split("Runs", 1)[1].splitlines()
    assert any(row.split()[:1] == ["1"] and "stopped" in row for row in rows)
    assert any(row.split()[:1] == ["2"] and "running" in row for row in rows)

    usage = gpp("usage", "--json")
    assert usage.code == 0, usage.stderr
    summary = usage.json()
    owner.tenant.refresh_from_db()
    assert Decimal(summary["balance"]) == owner.tenant.credit_balance
    assert summary["ledger_totals"] == {"grant": "50.00", "purchase": f"-{bought['price_paid']}"}
    assert summary["minutes_used"] >= 5 and str(ident) in summary["minutes_by_slice"]
    assert [p["id"] for p in summary["purchases_with_minutes_left"]] == [bought["id"]]
    assert summary["spend_this_month"] == bought["price_paid"] and summary["spend_limit"] is None
    text = gpp("usage")
    assert "Kestrel Compute" in text.stdout and "Latest ledger entries" in text.stdout
    export = tmp_path / "usage.csv"
    written = gpp("usage", "--csv", str(export), "--json")
    assert written.code == 0, written.stderr
    rows = export.read_text().splitlines()
    assert rows[0].startswith("section") and any(str(ident) in r for r in rows[1:]), rows[:5]
    bad = gpp("usage", "--csv", str(tmp_path / "x.csv"), "--since", "2031-05-02",
              "--until", "2031-05-01", "--json")  # fmt: skip
    assert bad.code == 1 and "to" in bad.error()["fields"], bad.stdout

    ended = gpp("terminate", str(ident), "--yes", "--json")
    assert ended.code == 0 and ended.json()["state"] == "stopped"
    after_end = gpp("resume", str(ident), "--json")
    assert after_end.code == 1 and after_end.error()["code"] == "slice_terminated"


def test_logs_follow_prints_new_lines_until_the_slice_stops(gpp, owner, fleet, credit, tmp_path):
    gpp("buy", "4", "--hours", "1", "--yes")
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "image: CUDA base\ntier: 4\nmodel: Qwen/Qwen2.5-1.5B\n"
        f"job: {{context_tokens: 2048}}\nssh_key: '{SSH_KEY}'\n"
    )
    launched = gpp("launch", str(spec), "--wait", "--json")
    assert launched.code == 0, launched.stderr
    ident = launched.json()["id"]
    container = Slice.objects.get(pk=ident).container_id

    follower = gpp.popen("logs", "-f", str(ident))
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(follower.stdout), daemon=True)
    reader.start()
    emu = fleet.nodes[0]
    emu.container_print(container, "step 1")
    deadline = time.monotonic() + 30
    while "step 1\n" not in seen and time.monotonic() < deadline:
        time.sleep(0.3)
    assert "step 1\n" in seen, seen
    emu.container_print(container, "step 2")
    time.sleep(2.5)  # past the API's debounce of reads from the node
    stop = gpp("stop", str(ident), "--yes", "--wait")  # the stop reads the last lines
    assert stop.code == 0, stop.stderr
    assert follower.wait(timeout=30) == 0  # it ends by itself once the slice stopped
    reader.join(10)
    assert seen.index("step 1\n") < seen.index("step 2\n")
    assert seen.count("step 1\n") == 1


def test_a_launch_that_does_not_fit_is_refused_with_exit_1_and_the_tier_that_would(
    gpp, owner, credit, image_ssh
):
    bought = gpp("buy", "4", "--hours", "1", "--yes", "--json").json()
    done = gpp("launch", "--image", "CUDA base", "--purchase", str(bought["id"]),
               "--model", "meta-llama/Llama-3.1-8B", "--ssh-key", SSH_KEY)  # fmt: skip
    assert done.code == 1
    assert "estimate_exceeds_tier" in done.stderr and "24 GB" in done.stderr
    refused = Slice.objects.get()
    assert refused.state == Slice.State.REFUSED
    as_json = gpp("launch", "--image", "CUDA base", "--purchase", str(bought["id"]),
                  "--model", "meta-llama/Llama-3.1-8B", "--ssh-key", SSH_KEY, "--json")  # fmt: skip
    assert as_json.code == 1 and as_json.error()["code"] == "estimate_exceeds_tier"
    unknown = gpp("launch", "--image", "no-such-image", "--tier", "4", "--model", "x", "--json")
    assert unknown.code == 1 and unknown.error()["code"] == "unknown_image"


def test_volumes_create_list_show_delete(gpp, owner, fleet):
    made = gpp("volumes", "create", "ckpt", "--size", "10", "--wait", "--json")
    assert made.code == 0, made.stderr
    assert (made.json()["name"], made.json()["state"]) == ("ckpt", "ready")
    assert [v["name"] for v in gpp("volumes", "--json").json()] == ["ckpt"]
    assert "10 GB" in gpp("volumes", "show", "ckpt").stdout
    twice = gpp("volumes", "create", "ckpt", "--size", "10", "--json")
    assert twice.code == 1 and twice.error()["code"] == "volume_exists"
    gone = gpp("volumes", "delete", "ckpt", "--yes", "--json")
    assert gone.code == 0, gone.stderr
    assert gone.json()["state"] in ("deleting", "deleted")
    assert gpp("volumes", "list", "--json").json() in ([], [gone.json()])
    assert Volume.objects.get().state in ("deleting", "deleted")


def test_a_volume_create_whose_answer_is_lost_is_not_sent_again(gpp, owner, fleet, live_server):
    # a create without an idempotency key might be done twice by a retry: gpp says the
    # connection failed (exit 3) and leaves it to the user to look
    with LosingProxy(live_server.url, "POST", "/api/v1/volumes/") as proxy:
        done = gpp("volumes", "create", "data", "--size", "5", "--json", GPP_URL=proxy.url)
    assert done.code == 3 and done.error()["code"] == "connection_failed"
    assert [m for m, *_ in proxy.seen].count("POST") == 1
    assert Volume.objects.filter(name="data").count() == 1


def _stub_ssh(tmp_path, code: int = 0):
    """An `ssh` that records its argv and exits `code`."""
    record = tmp_path / "ssh-argv.json"
    stub = tmp_path / "bin" / "ssh"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text(
        "#!/bin/sh\n"
        f'python3 -c \'import json,sys; json.dump(sys.argv[1:], open("{record}", "w"))\' "$@"\n'
        f"exit {code}\n"
    )
    stub.chmod(0o755)
    return stub, record


def test_ssh_and_forward_run_openssh_with_the_gateway_details(
    gpp, owner, fleet, credit, tmp_path, settings
):
    settings.GATEWAY_ADDRESS = "127.0.0.1:2299"
    gpp("buy", "4", "--hours", "1", "--yes")
    ident = _launch(gpp, "--tier", "4")["id"]
    stub, record = _stub_ssh(tmp_path, code=7)

    logged_in = gpp("ssh", str(ident), "-i", "/keys/id", "--", "nvidia-smi", GPP_SSH=str(stub))
    assert logged_in.code == 7  # ssh's own status
    assert "no SSH key registered" in logged_in.stderr  # the gateway would refuse this user
    argv = json.loads(record.read_text())
    assert argv[-2:] == [f"root@slice-{ident}", "nvidia-smi"]
    assert argv[:2] == ["-i", "/keys/id"]
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    # the gateway hop gets the same key: OpenSSH gives -J hops none of the command line's
    assert proxy.endswith("-i /keys/id -p 2299 -W %h:%p gpp@127.0.0.1")
    # the slice's own host key is pinned: a resumed slice asks nothing, another key fails
    assert f"HostKeyAlias=slice-{ident}" in argv
    pin = next(a for a in argv if a.startswith("KnownHostsCommand="))
    assert pin.startswith(f"KnownHostsCommand=/bin/echo slice-{ident} ssh-ed25519 AAAA")
    assert "slice's own host key is SHA256:" in logged_in.stderr
    assert "slice host key" in gpp("show", str(ident)).stdout

    shown = gpp("forward", str(ident), "22", "--local-port", "2200", GPP_SSH=str(stub))
    assert shown.code == 7
    argv = json.loads(record.read_text())
    assert argv[argv.index("-L") + 1] == f"127.0.0.1:2200:slice-{ident}:22"
    assert argv[-3:] == ["-p", "2299", "gpp@127.0.0.1"] and "-N" in argv
    assert argv[argv.index("-N") + 1 : argv.index("-N") + 3] == ["-o", "ExitOnForwardFailure=yes"]
    printed = gpp("forward", str(ident), "22", "--json", GPP_SSH=str(stub)).json()
    # the slice page's port, 10000 above: on 127.0.0.1 only, clear of root's ports
    assert printed["argv"][printed["argv"].index("-L") + 1] == f"127.0.0.1:10022:slice-{ident}:22"

    undeclared = gpp("forward", str(ident), "8888", "--json", GPP_SSH=str(stub))
    assert undeclared.code == 1 and undeclared.error()["code"] == "port_not_declared"
    gpp("stop", str(ident), "--yes")
    stopped = gpp("ssh", str(ident), "--json", GPP_SSH=str(stub))
    assert stopped.code == 1 and stopped.error()["code"] == "slice_not_running"


def test_gpp_ssh_reaches_the_real_gateway_with_the_users_key(
    gpp, owner, fleet, credit, gateway, tmp_path, settings
):
    # The real OpenSSH client and the real gateway: the key and the pinned host key given
    # to gpp reach the gateway hop, which records the user's stream to the slice's sshd
    # (the emulated node cannot relay into a container, so the stream goes no further).
    key, line = client_key(tmp_path)
    services.ssh_key_add(user=owner.user, name="laptop", public_key=line)
    gpp("buy", "4", "--hours", "1", "--yes")
    ident = _launch(gpp, "--tier", "4")["id"]
    known = tmp_path / "known_hosts"
    host_key = ssh.load_or_create_platform_key(Path(settings.GATEWAY_HOST_KEY_PATH))
    known.write_text(f"[127.0.0.1]:{gateway.port} {ssh.public_key_line(host_key)}\n")
    done = gpp("ssh", str(ident), "-i", str(key), "-o", f"UserKnownHostsFile={known}",
               "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
               "-o", "IdentitiesOnly=yes", "--", "true", timeout=60)  # fmt: skip
    assert done.code == 255  # ssh's status: the hop past the gateway cannot open
    assert "Permission denied" not in done.stderr, done.stderr
    assert "no SSH key registered" not in done.stderr
    stream = GatewayStream.objects.get(destination=f"slice-{ident}")
    assert (stream.user_id, stream.port, stream.slice_id) == (owner.user.pk, 22, ident)

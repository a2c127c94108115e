"""A preemption notice against the node lab (a real sshd and Docker Engine, only the GPU
emulated): the platform's `docker kill --signal TERM` over the node's SSH reaches the job in
a real container, which checkpoints and ends itself within its notice; its room then goes
to the full-price launch that asked for it."""

from __future__ import annotations

import pytest

from incidents import tasks as incident_tasks
from nodes import services as node_services
from tenants import services
from tenants.models import Slice, Tier
from tests.conftest import launch
from tests.worker_harness import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

# A job that checkpoints on SIGTERM: says so and exits 0 (sh as PID 1 runs its trap).
CHECKPOINTING_JOB = [
    "sh",
    "-c",
    "trap 'echo checkpointed-on-term; exit 0' TERM; echo started; while :; do sleep 1; done",
]


def test_the_preemption_notice_sigterm_reaches_the_job_in_a_real_container(
    eager, lab_fleet, owner_a, owner_b, funded, ops_user, lab_image, monkeypatch
):
    fleet = lab_fleet()  # one A30, 24 GB, sold at its memory
    node = fleet.nodes[0]
    monkeypatch.setattr(incident_tasks.dispose, "apply_async", lambda *a, **k: None)
    monkeypatch.setattr(incident_tasks.deliver_webhook, "delay_on_commit", lambda *a: None)
    services.credit_grant(tenant=owner_a.tenant, amount="50.00", actor=ops_user, memo="t")
    cheap, _ = services.purchase_create(
        membership=owner_a, tier=Tier.objects.get(vram_mb=24576), hours=1, interruptible=True
    )
    spare = launch(owner_a, cheap, lab_image, command=CHECKPOINTING_JOB)
    assert spare.state == Slice.State.RUNNING, spare.state_reason

    full = launch(owner_b, funded(owner_b, vram_gb=8), lab_image)

    assert full.state == Slice.State.QUEUED
    spare.refresh_from_db()
    assert spare.preempt_deadline is not None
    db_node = spare.allocation.gpu.node
    # the job got the signal: it checkpointed and ended itself, well within the notice
    ended = wait_for(
        lambda: (
            (i := node_services.container_inspect(node=db_node, container=spare.container_id))
            and not i.running
            and i
        ),
        timeout=10,
    )
    assert ended and ended.exit_code == 0
    assert "checkpointed-on-term" in node.docker("logs", spare.container_id).stdout
    notes = spare.log_lines.filter(text__startswith="[gpuplatform] Preemption notice")
    assert notes.count() == 1  # `gpp logs` and the page show the notice in the output
    # reconcile finds it ended (completed, billed to its exit); the room goes to the launch
    services.slices_reconcile()
    spare.refresh_from_db()
    full.refresh_from_db()
    assert spare.state == Slice.State.COMPLETED
    assert full.state == Slice.State.RUNNING, full.state_reason
    assert full.provision_started_at <= spare.preempt_deadline

"""A real Celery worker process on Redis runs what is dispatched after commit, and
nothing dispatched inside a transaction that rolls back."""

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from celery.signals import before_task_publish
from django.conf import settings
from django.db import connection, transaction

from gpuplatform.celery import app
from gpuplatform.workers import worker_argv
from tenants import services
from tenants.models import Invitation, Role
from tests.ci import missing
from tests.factories import MembershipFactory

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def _wait_for(predicate, timeout: float = 30.0, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


@pytest.fixture
def worker(tmp_path, django_db_blocker):
    if not settings.CELERY_BROKER_URL.startswith("redis"):
        missing("set REDIS_URL (make test does) to run the worker on Redis")
    db = settings.DATABASES["default"]
    database_url = (
        f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        if db["ENGINE"].endswith("postgresql")
        else f"sqlite:///{db['NAME']}"
    )
    mail_dir = tmp_path / "mail"
    mail_dir.mkdir()
    log = tmp_path / "worker.log"
    app.control.purge()  # leftovers of earlier runs must not run against this database
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": settings.REDIS_URL,
        "EMAIL_URL": f"filemail:///{mail_dir}",
        "DJANGO_SETTINGS_MODULE": "gpuplatform.settings",
    }
    proc = subprocess.Popen(  # noqa: S603
        worker_argv(
            queues=",".join(settings.CELERY_QUEUE_NAMES),
            hostname=f"test-{uuid.uuid4().hex[:8]}@%h",
            pool="solo",
            without_peers=True,
            logfile=log,
        ),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        ready = _wait_for(lambda: log.exists() and "ready." in log.read_text(), timeout=60)
        assert ready, log.read_text() if log.exists() else "worker wrote no log"
        yield {"mail_dir": mail_dir, "log": log, "proc": proc}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def published():
    """Every task message this process publishes: (task name, args, in a transaction?)."""
    seen: list[tuple[str, tuple, bool]] = []

    def record(sender=None, headers=None, body=None, **kwargs):
        seen.append((sender, tuple(body[0]) if body else (), connection.in_atomic_block))

    before_task_publish.connect(record, weak=False)
    yield seen
    before_task_publish.disconnect(record)


def _mails(mail_dir: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(mail_dir.glob("*.log")))


def test_worker_runs_task_dispatched_after_commit(worker, published):
    owner = MembershipFactory(tenant__name="Worker Lab")
    invitation = services.invitation_create(
        actor_membership=owner, email="committed@worker.test", role=Role.MEMBER
    )
    assert published == [("tenants.send_invitation", (invitation.pk,), False)]
    sent = _wait_for(lambda: Invitation.objects.get(pk=invitation.pk).sent_at)
    assert sent, worker["log"].read_text()
    assert "committed@worker.test" in _mails(worker["mail_dir"])
    assert "tenants.send_invitation" in worker["log"].read_text()


def test_task_dispatched_in_rolled_back_transaction_never_runs(worker, published):
    owner = MembershipFactory(tenant__name="Rollback Lab")

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        ghost = services.invitation_create(
            actor_membership=owner, email="ghost@worker.test", role=Role.MEMBER
        )
        raise Abort
    assert not Invitation.objects.filter(pk=ghost.pk).exists()
    assert published == []  # nothing reached the broker

    # A later committed dispatch is processed; the worker never saw the ghost.
    later = services.invitation_create(
        actor_membership=owner, email="later@worker.test", role=Role.MEMBER
    )
    assert _wait_for(lambda: Invitation.objects.get(pk=later.pk).sent_at)
    mails = _mails(worker["mail_dir"])
    assert "later@worker.test" in mails
    assert "ghost@worker.test" not in mails
    assert [name for name, _, _ in published] == ["tenants.send_invitation"]
    assert f"[{ghost.pk}]" not in worker["log"].read_text().replace(f"[{later.pk}]", "")

"""Work queued by the task's name (gpuplatform.dispatch): after commit, never before, with
the task's own options; an unknown name fails in the caller; a process that never
imported a tasks module still finds the task."""

import subprocess
import sys
from pathlib import Path

import pytest
from django.core import mail
from django.db import transaction

from gpuplatform.dispatch import enqueue, task_named
from incidents import tasks as incident_tasks
from tenants import tasks as tenant_tasks

ROOT = Path(__file__).resolve().parent.parent


def test_a_task_is_found_by_the_name_it_is_registered_under():
    assert task_named("provision.slice") is tenant_tasks.provision_slice._get_current_object()
    assert task_named("incidents.idle_due").name == "incidents.idle_due"


def test_an_unknown_name_fails_in_the_caller_and_queues_nothing(
    db, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks, pytest.raises(KeyError):
        enqueue("provision.no_such_task", 1)
    assert callbacks == []


def test_nothing_leaves_before_commit(db, owner_a, eager, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        with transaction.atomic():
            enqueue("tenants.notify_members", owner_a.tenant.pk, "Subject", "Body")
        assert mail.outbox == []  # committed only in the test's own transaction
    assert len(callbacks) == 1
    callbacks[0]()  # what the commit runs: the task itself (eager here)
    assert [m.subject for m in mail.outbox] == ["[gpuplatform] Subject"]
    assert mail.outbox[0].to == [owner_a.user.email]


def test_a_countdown_reaches_the_task_with_its_arguments(
    db, monkeypatch, django_capture_on_commit_callbacks
):
    sent = []
    monkeypatch.setattr(
        incident_tasks.idle_due,
        "apply_async",
        lambda args, countdown: sent.append((args, countdown)),
    )
    with django_capture_on_commit_callbacks(execute=True):
        enqueue("incidents.idle_due", 42, countdown=900)
        assert sent == []
    assert sent == [((42,), 900)]


def test_a_process_that_imported_no_tasks_module_finds_the_task(tmp_path):
    # A web process imports views and services only: the first lookup runs autodiscovery.
    code = (
        "import django, sys; django.setup(); "
        "from gpuplatform.dispatch import task_named; "
        "ours = ('tenants.tasks', 'nodes.tasks', 'incidents.tasks'); "
        "assert not any(m in sys.modules for m in ours), 'a tasks module was imported'; "
        "print(task_named('provision.slice').name)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"DJANGO_SETTINGS_MODULE": "gpuplatform.settings", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "provision.slice"

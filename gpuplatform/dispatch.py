"""Queue Celery work by the task's registered name, once the surrounding transaction commits.

Services name the task they want ("provision.slice") instead of importing its function, so
a tasks module may import its services at the top and no import cycle runs through it
(Zulip queues events by name the same way). The message leaves after commit (docs/domain.md:
a worker must never run before the rows it reads are visible); outside a transaction it
leaves at once. A name no task is registered under raises KeyError in the caller.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, cast

from django.db import transaction

from .celery import app

if TYPE_CHECKING:
    from celery.contrib.django.task import DjangoTask


def task_named(name: str) -> DjangoTask[..., Any]:
    """The task registered as `name`. Tasks modules are imported by Celery's autodiscovery,
    which a web process never triggers on its own: the first lookup there runs it."""
    try:
        task = app.tasks[name]
    except KeyError:
        app.loader.import_default_modules()  # autodiscover_tasks: every app's tasks.py
        task = app.tasks[name]
    # Every task here is a DjangoTask (the app's task class, celery.py); the registry's
    # type says only Task.
    return cast("DjangoTask[..., Any]", task)


def enqueue(name: str, *args: Any, countdown: float | None = None) -> None:
    """Send the task `name` with `args` after the current transaction commits; with
    `countdown`, it runs that many seconds later."""
    task = task_named(name)  # an unknown name fails here, in the service, not after commit
    if countdown is None:
        task.delay_on_commit(*args)
    else:
        transaction.on_commit(functools.partial(task.apply_async, args, countdown=countdown))

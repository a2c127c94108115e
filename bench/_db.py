"""Shared set-up for benchmarks: Django on a throwaway database on the configured server.

Importing this module sets Django up (with the environment as it is then), so a benchmark
imports it first and the platform's models and services after it."""

import contextlib
import os
import sys
from pathlib import Path

import django
from django.apps import apps
from django.conf import settings
from django.db import connection
from django.test.utils import setup_test_environment, teardown_test_environment

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
if not apps.ready:  # a test that loads a benchmark has Django set up already
    django.setup()


def sql(statement: str, params: list | None = None) -> int:
    """Run one statement on the benchmark's database; the rows it touched."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])
        return cursor.rowcount


@contextlib.contextmanager
def throwaway_database(name: str):
    """Create `bench_<name>` next to the configured database, yield, drop it."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.ALLOWED_HOSTS = ["testserver"]
    connection.settings_dict.setdefault("TEST", {})["NAME"] = (
        None if connection.vendor == "sqlite" else f"bench_{name}"
    )
    setup_test_environment()
    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        yield connection
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
        teardown_test_environment()  # so that a second throwaway database can follow

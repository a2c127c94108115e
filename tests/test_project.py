"""The project as a whole: layout, settings, migrations, lint, Celery configuration."""

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from gpuplatform.celery import app as celery_app
from gpuplatform.gunicorn_logging import redact
from gpuplatform.settings import DEV_SECRET_KEY
from tests.ci import missing

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _run(args, env=None, **kwargs):
    return subprocess.run(
        args,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        **kwargs,
    )


def test_import_uuid_works_at_repository_root():
    result = _run([PY, "-c", "import uuid, platform; print(platform.__file__)"])
    assert result.returncode == 0, result.stderr
    assert str(ROOT) not in result.stdout  # the stdlib module, not a local folder
    assert not (ROOT / "platform").exists() and not (ROOT / "platform.py").exists()


def test_layout_of_design_md():
    for name in [
        "manage.py",
        "pyproject.toml",
        "Makefile",
        "README.md",
        "docker-compose.yml",
        ".ci/run",
        "gpuplatform",
        "tenants",
        "nodes",
        "incidents",
        "estimator",
        "emulator",
        "nodelab",
        "templates",
        "static",
        "tests",
        "bench",
    ]:
        assert (ROOT / name).exists(), name
    for app in ["tenants", "nodes", "incidents"]:
        for room in ["models", "admin", "apps", "services", "selectors", "tasks", "locks"]:
            # a room that grew is a package of the same name (tenants/models/, ...)
            module, package = ROOT / app / f"{room}.py", ROOT / app / room / "__init__.py"
            assert module.exists() or package.exists(), f"{app}/{room}"


def test_makemigrations_check_is_clean():
    result = _run([PY, "manage.py", "makemigrations", "--check", "--dry-run"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_check_is_clean():
    result = _run([PY, "-m", "ruff", "check", "."])
    assert result.returncode == 0, result.stdout


def test_openapi_schema_is_valid_without_warnings(tmp_path):
    out = tmp_path / "schema.yml"
    result = _run(
        [PY, "manage.py", "spectacular", "--validate", "--fail-on-warn", "--file", str(out)]
    )
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    for path in ["/api/v1/me/", "/api/v1/tiers/", "/api/v1/tokens/"]:
        assert path in text


def _prod_env(**extra):
    return {
        "DJANGO_DEBUG": "false",
        "DJANGO_SECRET_KEY": "s3cr3t-" + "k" * 60 + "-not-the-dev-one",
        "DJANGO_ALLOWED_HOSTS": "gpu.example.com",
        **extra,
    }


def test_production_refuses_the_development_secret():
    # An unset secret falls back to the development one, which production refuses.
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SECRET_KEY"}
    env.update(_prod_env())
    env.pop("DJANGO_SECRET_KEY")
    result = subprocess.run(
        [PY, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY must be set" in result.stderr

    result = _run([PY, "manage.py", "check"], env=_prod_env(DJANGO_SECRET_KEY=DEV_SECRET_KEY))
    assert result.returncode != 0


def test_check_deploy_is_clean_in_production_mode():
    result = _run(
        [PY, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], env=_prod_env()
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_embedded_defaults_need_no_server(tmp_path):
    code = (
        "from django.conf import settings as s; "
        "print(s.DATABASES['default']['ENGINE']); print(s.CELERY_BROKER_URL)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["GPUPLATFORM_VAR_DIR"] = str(tmp_path)
    result = subprocess.run(
        [PY, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**env, "DJANGO_SETTINGS_MODULE": "gpuplatform.settings"},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    engine, broker = result.stdout.split()
    assert engine == "django.db.backends.sqlite3"
    assert broker == "filesystem://"
    assert (tmp_path / "celery" / "broker").is_dir()


def test_redis_url_makes_redis_the_broker():
    if not os.environ.get("REDIS_URL"):
        missing("make test sets REDIS_URL")
    assert os.environ["REDIS_URL"] == settings.CELERY_BROKER_URL
    assert settings.CACHES["default"]["BACKEND"].endswith("RedisCache")


def test_celery_is_json_only_acks_late_with_time_limits_and_queues():
    conf = celery_app.conf
    assert conf.task_serializer == "json" and conf.result_serializer == "json"
    assert list(conf.accept_content) == ["json"]
    assert conf.task_acks_late is True and conf.task_reject_on_worker_lost is True
    assert conf.task_time_limit and conf.task_soft_time_limit < conf.task_time_limit
    assert {q.name for q in conf.task_queues} >= {"provision", "telemetry", "incidents"}
    assert celery_app.amqp.router.route({}, "telemetry.sample_nodes")["queue"].name == "telemetry"
    assert celery_app.amqp.router.route({}, "provision.start_slice")["queue"].name == "provision"


def test_beat_schedule_names_only_registered_tasks():
    celery_app.loader.import_default_modules()
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert entry["task"] in celery_app.tasks, entry["task"]


def test_tasks_are_thin_named_and_bounded():
    celery_app.loader.import_default_modules()
    ours = {n: t for n, t in celery_app.tasks.items() if not n.startswith("celery.")}
    assert ours
    for name, task in ours.items():
        # an explicit "<app or queue>.<what>" name, not the module path Celery would invent
        assert name.split(".")[0] in {"tenants", "telemetry", "provision", "incidents"}, name
        # each task states its own limits (soft first, so it can clean up)
        assert task.soft_time_limit and task.time_limit, name
        assert task.soft_time_limit < task.time_limit, name


def test_access_log_redacts_secret_links():
    assert redact("GET /invitations/Abc-123_xyz/ HTTP/1.1") == (
        "GET /invitations/[redacted]/ HTTP/1.1"
    )
    assert redact("GET /accounts/reset/MQ/set-password/ HTTP/1.1") == (
        "GET /accounts/reset/MQ/set-password/ HTTP/1.1"
    )
    assert redact("GET /accounts/reset/MQ/c8x-4f2a/ HTTP/1.1").endswith("[redacted]/ HTTP/1.1")
    assert redact("POST /invitations/accept/ HTTP/1.1") == "POST /invitations/accept/ HTTP/1.1"
    assert redact("GET /api/v1/me/ HTTP/1.1") == "GET /api/v1/me/ HTTP/1.1"

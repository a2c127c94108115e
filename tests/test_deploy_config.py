"""The production deployment (Dockerfile, docker-compose.yml, .env.example), checked
without a Docker engine: structure, the entry points the files name, and settings in
production mode fed with the variables the containers get.
"""

import importlib
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from celery import Celery
from celery.app.utils import find_app
from django.conf import settings as django_settings
from django.urls import resolve

from gpuplatform.celery import app
from tests.lab_support import unavailable

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"
SETTINGS_FILE = ROOT / "gpuplatform" / "settings.py"

# one Celery worker service per queue, each scaled on its own (docs/scale-out.md)
WORKERS = tuple(f"worker-{queue}" for queue in django_settings.CELERY_QUEUE_NAMES)
SERVICES = {"postgres", "redis", "migrate", "web", *WORKERS, "beat", "gateway", "edge"}
APP_SERVICES = ("web", *WORKERS, "beat", "gateway", "edge")

# "NAME=value" or, for a documented default, "# NAME=value".
_ENV_LINE = re.compile(r"^(#\s?)?([A-Z][A-Z0-9_]*)=(.*)$")
# env("X"), env.str("X", ...), env.db("X"), os.environ.get("X"), os.getenv("X"), ...
_SETTINGS_READ = re.compile(
    r"""(?:\benv(?:\.\w+)?\(|os\.environ\.get\(|os\.getenv\(|os\.environ\[)\s*["']([A-Z][A-Z0-9_]*)["']"""
)
# ${NAME}, ${NAME:-default}, ${NAME:?error} (and the forms without the colon).
_COMPOSE_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?([-?])([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def env_example() -> dict[str, str | None]:
    """Every variable .env.example names: its value, or None when shown commented out."""
    names: dict[str, str | None] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = _ENV_LINE.match(line.strip())
        if not match:
            continue
        commented, name, value = match.groups()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        names[name] = None if commented else value
    return names


def env_example_values() -> dict[str, str]:
    return {k: v for k, v in env_example().items() if v is not None}


def settings_variables() -> set[str]:
    return set(_SETTINGS_READ.findall(SETTINGS_FILE.read_text()))


def interpolate(text: str, values: dict[str, str]) -> str:
    """Compose's variable substitution, for the forms docker-compose.yml uses."""

    def substitute(match: re.Match) -> str:
        name, op, arg = match.groups()
        if values.get(name):
            return values[name]
        if op == "?":
            raise ValueError(f"compose refuses to start: {arg}")
        return arg if op == "-" else ""

    escaped = text.replace("$$", "\0")
    return _COMPOSE_VAR.sub(substitute, escaped).replace("\0", "$")


def command_argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else list(command)


def healthcheck_script(service: dict) -> str:
    """The shell line or python -c source a health check runs."""
    test = service["healthcheck"]["test"]
    if isinstance(test, str):
        return test
    if test[0] == "CMD-SHELL":
        return test[1]
    assert test[0] == "CMD", test
    return " ".join(test[1:])


def container_env(compose: dict, service: str, **secrets_: str) -> dict[str, str]:
    """What an app container's environment would be: env_file .env (a copy of
    .env.example with the secrets filled in), then the service's environment."""
    values = env_example_values() | secrets_
    env = dict(values)
    for name, value in compose["services"][service].get("environment", {}).items():
        env[name] = interpolate(str(value), values)
    return env


def filled_secrets() -> dict[str, str]:
    return {
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(64)[:50],
        "POSTGRES_PASSWORD": secrets.token_urlsafe(32),
    }


def run_manage(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    # Start from this process's environment minus anything settings read, so that only
    # the deployment's values count.
    base = {k: v for k, v in os.environ.items() if k not in settings_variables()}
    base["DJANGO_SETTINGS_MODULE"] = "gpuplatform.settings"
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=base | env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def production_env(compose: dict, tmp_path: Path) -> dict[str, str]:
    """The web container's environment, with the database on SQLite (no server here)
    and local state under tmp_path. REDIS_URL stays as compose sets it: importing the
    settings must not need a live server."""
    env = container_env(compose, "web", **filled_secrets())
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    env["GPUPLATFORM_VAR_DIR"] = str(tmp_path / "var")
    env["DJANGO_STATIC_ROOT"] = str(tmp_path / "staticfiles")
    return env


def dockerfile_cmd() -> list[str]:
    """The Dockerfile's CMD, in exec form (a JSON array, possibly over several lines)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    match = re.search(r"^CMD\s+(\[[^\]]*\])", text, re.M)
    assert match, "the Dockerfile needs a CMD in exec form"
    return json.loads(match.group(1))


# --- docker-compose.yml -------------------------------------------------------------------


def test_compose_defines_the_production_services(compose):
    assert set(compose["services"]) == SERVICES
    assert compose["services"]["postgres"]["image"].startswith("postgres:16")
    assert compose["services"]["redis"]["image"].startswith("redis:7")


def test_stores_keep_their_data_in_named_volumes(compose):
    postgres, redis = compose["services"]["postgres"], compose["services"]["redis"]
    assert any(v.endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])
    assert any(v.endswith(":/data") for v in redis["volumes"])
    argv = command_argv(redis["command"])
    assert argv[argv.index("--appendonly") + 1] == "yes"
    for volume in postgres["volumes"] + redis["volumes"]:
        assert volume.split(":")[0] in compose["volumes"]


def test_every_long_running_service_has_a_healthcheck_and_migrate_has_none(compose):
    for name in SERVICES - {"migrate"}:
        assert healthcheck_script(compose["services"][name]).strip(), name
    assert "healthcheck" not in compose["services"]["migrate"]
    assert "pg_isready" in healthcheck_script(compose["services"]["postgres"])
    assert "redis-cli ping" in healthcheck_script(compose["services"]["redis"])


def test_app_services_wait_for_healthy_stores_and_completed_migration(compose):
    for name in APP_SERVICES:
        depends_on = compose["services"][name]["depends_on"]
        assert depends_on["postgres"]["condition"] == "service_healthy", name
        assert depends_on["redis"]["condition"] == "service_healthy", name
        assert depends_on["migrate"]["condition"] == "service_completed_successfully", name


def test_migrate_runs_once_after_postgres_is_healthy(compose):
    migrate = compose["services"]["migrate"]
    assert command_argv(migrate["command"])[-3:] == ["manage.py", "migrate", "--noinput"]
    # A restart policy would rerun it forever and "completed" would never hold.
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_app_services_share_one_image_and_run_in_production_mode(compose):
    secrets_ = filled_secrets()
    for name in (*APP_SERVICES, "migrate"):
        service = compose["services"][name]
        assert service["build"] == ".", name
        assert service["env_file"] == ".env", name
        env = container_env(compose, name, **secrets_)
        assert env["DJANGO_DEBUG"] == "false", name
        assert env["DJANGO_SECRET_KEY"] == secrets_["DJANGO_SECRET_KEY"], name
        database = urlsplit(env["DATABASE_URL"])
        assert (database.scheme, database.hostname) == ("postgres", "postgres"), name
        assert database.password == secrets_["POSTGRES_PASSWORD"], name
        assert urlsplit(env["REDIS_URL"]).hostname == "redis", name
    for name in (*APP_SERVICES, "postgres", "redis"):
        assert compose["services"][name]["restart"] == "unless-stopped", name


def test_compose_refuses_to_start_until_the_secrets_are_set(compose):
    for secret in ("DJANGO_SECRET_KEY", "POSTGRES_PASSWORD"):
        assert env_example()[secret] == "", f"{secret} must be blank in .env.example"
        filled = filled_secrets()
        del filled[secret]
        with pytest.raises(ValueError, match=secret):
            container_env(compose, "web", **filled)


def test_every_queue_has_its_own_worker_service(compose):
    served = []
    for name in WORKERS:
        service = compose["services"][name]
        argv = command_argv(service["command"])
        assert argv[:4] == ["celery", "-A", "gpuplatform", "worker"], name
        queues = argv[argv.index("-Q") + 1].split(",")
        assert queues == [name.removeprefix("worker-")], name
        served += queues
        assert int(argv[argv.index("--concurrency") + 1]) >= 1, name
        # The health check pings celery@$HOSTNAME, the default node name: each replica
        # of a scaled service has its own container host name, so its own node name.
        assert "-n" not in argv and "--hostname" not in argv, name
        assert "celery@$$HOSTNAME" in healthcheck_script(service), name
        # made once, shared by every worker: the key the nodes authorize
        assert "platform-ssh:/app/var/ssh" in service["volumes"], name
    assert sorted(served) == sorted(django_settings.CELERY_QUEUE_NAMES)


def test_workers_may_finish_their_longest_task_before_they_are_killed(compose):
    longest = max(
        [django_settings.CELERY_TASK_TIME_LIMIT]
        + [t.time_limit for t in app.tasks.values() if getattr(t, "time_limit", None)]
    )
    for name in WORKERS:
        grace = compose["services"][name]["stop_grace_period"]
        match = re.fullmatch(r"(\d+)([sm])", grace)
        assert match, grace
        seconds = int(match.group(1)) * (60 if match.group(2) == "m" else 1)
        assert seconds >= longest, (name, grace, longest)


def test_scaled_services_neither_name_their_container_nor_publish_a_host_port(compose):
    # `docker compose up --scale worker-telemetry=3` starts three containers: a fixed
    # container_name or host port would make the second one fail to start
    for name, service in compose["services"].items():
        assert "container_name" not in service, name
    for name in WORKERS:
        assert "ports" not in compose["services"][name], name
    # the services that publish host ports run once per host, and no two share a port
    published = {
        name: [str(p).rsplit(":", 1)[0] for p in service["ports"]]
        for name, service in compose["services"].items()
        if service.get("ports")
    }
    assert set(published) == {"web", "gateway", "edge"}
    ports = [port for ports in published.values() for port in ports]
    assert len(ports) == len(set(ports)), published


def test_exactly_one_beat(compose):
    beats = [
        name
        for name, service in compose["services"].items()
        if "beat" in command_argv(service.get("command", []))[3:4]
    ]
    assert beats == ["beat"]
    argv = command_argv(compose["services"]["beat"]["command"])
    assert argv[:4] == ["celery", "-A", "gpuplatform", "beat"]
    assert (
        django_settings.CELERY_BEAT_SCHEDULER == "django_celery_beat.schedulers:DatabaseScheduler"
    )
    beat = compose["services"]["beat"]
    assert beat.get("deploy", {}).get("replicas", 1) == 1 and "scale" not in beat
    # a worker started with an embedded beat would be one more beat per replica
    for name in WORKERS:
        argv = command_argv(compose["services"][name]["command"])
        assert "-B" not in argv and "--beat" not in argv, name


def test_gateway_runs_with_its_host_key_kept_in_a_volume(compose):
    gateway = compose["services"]["gateway"]
    assert command_argv(gateway["command"]) == ["python", "manage.py", "run_gateway"]
    env = container_env(compose, "gateway", **filled_secrets())
    assert env["GPUPLATFORM_GATEWAY_ADDRESS"] == "0.0.0.0:2222"
    assert [str(p) for p in gateway["ports"]] == ["2222:2222"]
    # the host key renters pin: made at first start under /app/var/gateway (the default
    # path with the image's GPUPLATFORM_VAR_DIR) and kept in a named volume
    documented = [
        match.group(3)
        for line in ENV_EXAMPLE.read_text().splitlines()
        if (match := _ENV_LINE.match(line.strip()))
        and match.group(2) == "GPUPLATFORM_GATEWAY_HOST_KEY_PATH"
    ]
    assert documented == ["/app/var/gateway/ssh_host_ed25519_key"]
    volumes = dict(v.split(":", 1) for v in gateway["volumes"])
    assert volumes["gateway-key"] == "/app/var/gateway" and "gateway-key" in compose["volumes"]
    assert volumes["platform-ssh"] == "/app/var/ssh"


def test_celery_app_named_in_commands_is_the_project_celery_app(compose):
    names = set()
    for name in (*WORKERS, "beat"):
        argv = command_argv(compose["services"][name]["command"])
        names.add(argv[argv.index("-A") + 1])
        names.update(re.findall(r"-A (\S+)", healthcheck_script(compose["services"][name])))
    assert names == {"gpuplatform"}
    # The lookup the celery command itself performs for -A.
    found = find_app("gpuplatform")
    assert isinstance(found, Celery)
    assert found is app


# --- web and its health check --------------------------------------------------------------


def web_healthcheck_request(compose: dict) -> tuple[str, str]:
    """The URL path and Host header the web container's health check uses."""
    script = healthcheck_script(compose["services"]["web"])
    url = re.search(r"""['"](http://[^'"]+)['"]""", script).group(1)
    host = re.search(r"""['"]Host['"]\s*:\s*['"]([^'"]+)['"]""", script)
    return urlsplit(url).path, host.group(1) if host else urlsplit(url).hostname


def test_web_healthcheck_host_is_allowed_by_the_web_container(compose):
    _, host = web_healthcheck_request(compose)
    env = container_env(compose, "web", **filled_secrets())
    allowed = [h.strip() for h in env["DJANGO_ALLOWED_HOSTS"].split(",") if h.strip()]
    assert host.split(":")[0] in allowed
    # The public host names stay: the health check host is added, not substituted.
    assert set(env_example_values()["DJANGO_ALLOWED_HOSTS"].split(",")) <= set(allowed)


@pytest.mark.django_db
def test_web_healthcheck_path_answers_ok_even_with_https_redirect_on(compose, client, settings):
    path, _ = web_healthcheck_request(compose)
    assert resolve(path).url_name == "healthz"
    # The check runs over plain HTTP inside the container, where production redirects
    # everything else to https.
    settings.SECURE_SSL_REDIRECT = True
    response = client.get(path)
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert client.get("/").status_code == 301


def test_dockerfile_builds_a_non_root_gunicorn_image():
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"\bpip install \.(\s|$)", text)
    assert "collectstatic --noinput" in text
    assert re.search(r"^EXPOSE 8000\b", text, re.M)
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in {"root", "0"}

    cmd = dockerfile_cmd()
    assert cmd[0] == "gunicorn"
    assert cmd[cmd.index("--bind") + 1] == "0.0.0.0:8000"
    assert cmd[cmd.index("--access-logfile") + 1] == "-"
    targets = [arg for arg in cmd if arg.startswith("gpuplatform.wsgi")]
    assert targets in (["gpuplatform.wsgi:application"], ["gpuplatform.wsgi"])


def test_gunicorn_target_exposes_a_wsgi_application():
    cmd = dockerfile_cmd()
    module, _, attribute = next(a for a in cmd if a.startswith("gpuplatform.wsgi")).partition(":")
    attribute = attribute or "application"
    application = getattr(importlib.import_module(module), attribute)
    assert callable(application)
    assert ".".join((module, attribute)) == django_settings.WSGI_APPLICATION


# --- .env.example ------------------------------------------------------------------------


def test_env_example_names_only_variables_something_reads():
    read_by_settings = settings_variables()
    interpolated_by_compose = set(_COMPOSE_VAR.findall(COMPOSE_FILE.read_text()))
    interpolated_by_compose = {name for name, _, _ in interpolated_by_compose}
    unused = set(env_example()) - read_by_settings - interpolated_by_compose
    assert not unused, f".env.example names variables nothing reads: {sorted(unused)}"


def test_env_example_names_every_variable_settings_read():
    missing = settings_variables() - set(env_example())
    assert not missing, f"settings read variables .env.example does not show: {sorted(missing)}"


def test_settings_variable_scan_finds_the_core_variables():
    # Guards the scan itself: if it found nothing, the two tests above would pass vacuously.
    assert {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY", "DJANGO_DEBUG"} <= (
        settings_variables()
    )


# --- production settings in a fresh process ----------------------------------------------


def test_check_deploy_is_clean_with_the_containers_environment(compose, tmp_path):
    result = run_manage(["check", "--deploy"], production_env(compose, tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "no issues" in output, output


def test_collectstatic_succeeds_in_production_mode(compose, tmp_path):
    # The image build runs this (Dockerfile); the manifest storage refuses any static
    # file that references a file missing from static/.
    env = production_env(compose, tmp_path)
    result = run_manage(["collectstatic", "--noinput"], env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "staticfiles" / "staticfiles.json").is_file()


def compose_command() -> list[str] | None:
    """The Compose v2 plugin (`docker compose`), or Debian's docker-compose."""
    if shutil.which("docker") and (
        subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_docker_compose_accepts_the_file(tmp_path):
    command = compose_command()
    if command is None:
        unavailable("neither `docker compose` nor docker-compose is installed")
    # A copy, so that the .env written next to it is not the checkout's own.
    shutil.copy(COMPOSE_FILE, tmp_path / "docker-compose.yml")
    shutil.copy(DOCKERFILE, tmp_path / "Dockerfile")
    env_file = ENV_EXAMPLE.read_text()
    for name, value in filled_secrets().items():
        env_file = re.sub(rf"^{name}=$", f"{name}={value}", env_file, flags=re.M)
    (tmp_path / ".env").write_text(env_file)
    result = subprocess.run(
        [*command, "--project-directory", str(tmp_path), "config", "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr


def test_the_edge_runs_on_loopback_behind_the_tls_proxy_with_the_platform_key(compose):
    edge = compose["services"]["edge"]
    assert command_argv(edge["command"]) == ["python", "manage.py", "run_edge"]
    env = container_env(compose, "edge", **filled_secrets())
    assert env["GPUPLATFORM_EDGE_ADDRESS"] == "0.0.0.0:8001"
    # published on the host's loopback only: the TLS proxy in front terminates the
    # wildcard name of the proxy domain and passes WebSocket upgrades on
    assert [str(p) for p in edge["ports"]] == ["127.0.0.1:8001:8001"]
    assert "platform-ssh:/app/var/ssh" in edge["volumes"]

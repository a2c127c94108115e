"""Every signed-in page on SQLite, the embedded database `make run` starts with: the suite
runs on PostgreSQL, where a query only PostgreSQL understands (an array, a planner
setting) answers; here it would be a 500 for someone trying the platform on a laptop."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import json
from django.test import Client
from gpuplatform.celery import app
from tests.e2e.test_every_page import OPS, TENANT, build_scene, pages_of
from tests.factories import mark_two_factor_passed
app.conf.task_always_eager = True
scene = build_scene()
answers = {}
for role, user in ((TENANT, scene.owner.user), (OPS, scene.ops)):
    client = Client(raise_request_exception=False)
    client.force_login(user)
    mark_two_factor_passed(client, user)
    for page in pages_of(scene):
        if role in page.roles:
            answers[f"{role} {page.path}"] = client.get(page.path).status_code
print(json.dumps(answers))
"""


def test_every_signed_in_page_answers_on_sqlite(tmp_path):
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "REDIS_URL": "",
        "GPUPLATFORM_VAR_DIR": str(tmp_path / "var"),
        "DJANGO_ALLOWED_HOSTS": "testserver",
    }
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v0"], env=env, cwd=ROOT, check=True, timeout=300)
    out = subprocess.run(
        [*manage, "shell", "-c", SCRIPT],
        env=env,
        cwd=ROOT,
        check=True,
        timeout=300,
        capture_output=True,
        text=True,
    ).stdout
    answers = json.loads(out.strip().splitlines()[-1])
    assert len(answers) > 30  # both roles' pages, ledger and KPIs among them
    assert any(path.startswith("tenant /incidents/") for path in answers)
    assert any(path.startswith("ops /ops/incidents/kpis/") for path in answers)
    # 200, not "below 400": a session that lost its two-factor mark would be redirected
    # from every ops page, and a redirect renders none of them
    failed = {path: status for path, status in answers.items() if status != 200}
    assert not failed

"""The type checker on the production packages (`[tool.mypy]` in pyproject.toml, also run by
`make lint`): zero errors. Every function is typed and its body checked, the pure packages
strictly; an ignore must name its error code, and one that no longer silences anything is
itself an error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_error_in_the_production_packages():
    # the Django plugin loads the settings: whatever database the suite runs against
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gpuplatform.settings"}
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "Success: no issues found" in result.stdout

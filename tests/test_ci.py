"""CI is CI: any non-empty CI other than false/0 means a missing lab, Redis, chromium or
PostgreSQL fails the test with the reason; elsewhere the test skips with it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests import ci, lab_support

ROOT = Path(__file__).resolve().parent


@pytest.mark.parametrize("value", ["true", "TRUE", "True", "1", "yes", "github-actions", " 1 "])
def test_any_ci_value_but_false_or_0_is_ci(value):
    assert ci.in_ci({"CI": value})


@pytest.mark.parametrize("environ", [{}, {"CI": ""}, {"CI": "false"}, {"CI": "FALSE"}, {"CI": "0"}])
def test_no_ci_an_empty_one_false_or_0_is_not_ci(environ):
    assert not ci.in_ci(environ)


def test_in_ci_reads_the_process_environment_by_default(monkeypatch):
    monkeypatch.setenv("CI", "1")
    assert ci.in_ci()
    monkeypatch.setenv("CI", "false")
    assert not ci.in_ci()
    monkeypatch.delenv("CI")
    assert not ci.in_ci()


def test_a_missing_part_fails_under_ci_with_the_reason_and_skips_elsewhere():
    verdict, message = ci.missing_verdict("Redis is not there", {"CI": "1"})
    assert verdict == "fail"
    assert message.startswith("Redis is not there (CI=1:") and "never skips" in message
    assert ci.missing_verdict("Redis is not there", {}) == ("skip", "Redis is not there")
    assert ci.missing_verdict("x", {"CI": "0"}) == ("skip", "x")


@pytest.mark.parametrize(
    ("value", "outcome"), [("1", pytest.fail.Exception), ("0", pytest.skip.Exception)]
)
def test_missing_ends_the_test_as_the_verdict_says(monkeypatch, value, outcome):
    monkeypatch.setenv("CI", value)
    with pytest.raises(outcome, match="chromium is missing"):
        ci.missing("chromium is missing")


def test_a_lab_that_cannot_start_fails_under_ci_1(monkeypatch):
    # CI=1 used to skip the lab lane: only the exact text `true` failed it
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="the node lab cannot start here: no dockerd"):
        lab_support.unavailable("no dockerd")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="the node lab cannot start here"):
        lab_support.unavailable("no dockerd")


def test_no_test_skips_on_its_own_for_a_missing_part():
    """Every skip for a missing lab, Redis, chromium or PostgreSQL goes through tests.ci,
    so none can pass CI by skipping: a bare pytest.skip naming one of them is an error."""
    parts = ("lab", "redis", "chromium", "postgres", "docker", "sshd")
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in ("skip", "skipif", "importorskip"):
                continue
            said = ast.unparse(node).lower()
            if any(part in said for part in parts):
                wrong.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {said[:80]}")
    assert not wrong, "\n".join(wrong)

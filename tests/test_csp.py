"""The Content-Security-Policy (docs/security-headers.md): every page of every role answers
with it, nothing in it lets inline script or style through, and no template (nor any page
as served) carries what it would refuse: an inline event handler, an inline <script>, a
javascript: URL, htmx's hx-on, a style attribute or a <style> block."""

import json
import re
from pathlib import Path

import pytest
from csp.utils import build_policy
from django.conf import settings
from django.test import Client

from gpuplatform.celery import app
from tests.e2e.test_every_page import ANON, OPS, TENANT, build_scene, pages_of
from tests.factories import mark_two_factor_passed

TEMPLATES = Path(settings.BASE_DIR) / "templates"
UNSAFE = ("'unsafe-inline'", "'unsafe-hashes'", "'unsafe-eval'")

TAG = re.compile(r"<[a-zA-Z][^<>]*>", re.S)
# inside a tag: an event handler attribute (onclick=, onsubmit= ...), htmx's hx-on, a style
HANDLER = re.compile(r"\s(on[a-z]+|hx-on[-:a-z]*)\s*=", re.I)
STYLE_ATTR = re.compile(r"\sstyle\s*=", re.I)
SCRIPT_OPEN = re.compile(r"<script\b([^>]*)>", re.I)
# a <script> the browser runs without a src: no type, or a JavaScript one
DATA_BLOCK = re.compile(r"""\btype\s*=\s*["']?application/(ld\+)?json""", re.I)
# what a template says about itself is not markup
COMMENT = re.compile(r"\{#.*?#\}|\{% comment %\}.*?\{% endcomment %\}", re.S)


def policy_of(response) -> dict[str, list[str]]:
    header = response.headers.get("Content-Security-Policy")
    assert header, "no Content-Security-Policy header"
    directives = {}
    for part in header.split(";"):
        name, *values = part.split()
        directives[name] = values
    return directives


def inline_problems(html: str) -> list[str]:
    """What in this HTML the policy refuses to run or apply (each as it was found)."""
    problems = []
    for tag in TAG.findall(html):
        if HANDLER.search(tag):
            problems.append(f"event handler: {tag[:120]}")
        if STYLE_ATTR.search(tag):
            problems.append(f"style attribute: {tag[:120]}")
        if re.search(r"""=\s*["']?\s*javascript:""", tag, re.I):
            problems.append(f"javascript: URL: {tag[:120]}")
    for attrs in SCRIPT_OPEN.findall(html):
        if not re.search(r"\bsrc\s*=", attrs, re.I) and not DATA_BLOCK.search(attrs):
            problems.append(f"inline <script{attrs}>")
    if re.search(r"<style\b", html, re.I):
        problems.append("<style> block")
    return problems


def assert_strict(policy: dict[str, list[str]], where: str) -> None:
    assert policy.get("script-src") == ["'self'"], (where, policy)
    assert policy.get("style-src") == ["'self'"], (where, policy)
    assert policy.get("default-src") == ["'self'"], (where, policy)
    assert policy.get("object-src") == ["'none'"], (where, policy)
    assert policy.get("frame-ancestors") == ["'none'"], (where, policy)
    for name, values in policy.items():
        for unsafe in UNSAFE:
            assert unsafe not in values, f"{where}: {name} allows {unsafe}"


@pytest.fixture
def eager_celery():
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


def test_the_policy_in_settings_is_the_documented_one():
    directives = settings.CONTENT_SECURITY_POLICY["DIRECTIVES"]
    assert directives == {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        # the slice page's Open buttons post here, which redirects to a port's address
        "form-action": ["'self'", f"*.{settings.PROXY_DOMAIN}:*"],
        "frame-ancestors": ["'none'"],
    }
    assert "csp.middleware.CSPMiddleware" in settings.MIDDLEWARE
    doc = (Path(settings.BASE_DIR) / "docs/security-headers.md").read_text()
    for directive in build_policy().split("; "):  # the doc names the header as it is sent
        assert f"`{directive}`" in doc, directive


@pytest.mark.django_db
def test_every_page_answers_with_a_strict_policy_and_nothing_inline(eager_celery):
    scene = build_scene()
    users = {ANON: None, TENANT: scene.owner.user, OPS: scene.ops}
    failures: dict[str, list[str]] = {}
    seen = 0
    for role, user in users.items():
        client = Client(raise_request_exception=False)
        if user is not None:
            client.force_login(user)
            mark_two_factor_passed(client, user)
        for page in pages_of(scene):
            if role not in page.roles:
                continue
            where = f"{role} {page.path}"
            response = client.get(page.path)
            hops = 0
            while response.status_code in (301, 302) and hops < 3:  # each hop has it too
                assert_strict(policy_of(response), where)
                response = client.get(response["Location"])
                hops += 1
            seen += 1
            if response.status_code != 200:
                failures[where] = [f"HTTP {response.status_code}"]
                continue
            assert_strict(policy_of(response), where)
            if problems := inline_problems(response.content.decode()):
                failures[where] = problems
    assert seen > 40  # anonymous, tenant and ops pages alike
    assert not failures, failures


@pytest.mark.django_db
def test_the_api_docs_script_and_the_browsable_api_come_under_the_policy(eager_celery):
    scene = build_scene()
    client = Client()
    client.force_login(scene.owner.user)
    docs = client.get("/api/v1/docs/")
    html = docs.content.decode()
    assert_strict(policy_of(docs), "/api/v1/docs/")
    # Swagger UI starts from a script of this origin (drf-spectacular's split view)
    script = re.search(r'<script src="([^"]*\?script[^"]*)"', html).group(1)
    started = client.get(script)
    assert started.status_code == 200
    assert started["Content-Type"].startswith("application/javascript")
    assert "SwaggerUIBundle(" in started.content.decode()
    assert "css/swagger.css" in html and not inline_problems(html)
    browsable = client.get("/api/v1/me/", HTTP_ACCEPT="text/html")
    assert browsable.status_code == 200 and b"css/drf.css" in browsable.content
    assert_strict(policy_of(browsable), "/api/v1/me/ (browsable)")
    partial = client.get("/dashboard/", HTTP_HX_REQUEST="true")  # an htmx swap has it too
    assert_strict(policy_of(partial), "/dashboard/ (htmx)")


@pytest.mark.django_db
def test_htmx_is_configured_to_add_no_inline_style_and_eval_nothing(client):
    html = client.get("/tiers/").content.decode()
    config = re.search(r"<meta name=\"htmx-config\" content='([^']*)'>", html).group(1)
    htmx = json.loads(config)
    assert htmx["includeIndicatorStyles"] is False  # no <style> of its own
    assert htmx["allowEval"] is False
    assert "style" not in htmx["attributesToSettle"]  # no style attribute copied in a swap
    assert html.index('name="htmx-config"') < html.index("vendor/htmx/htmx.min.js")
    assert re.search(r'<script src="[^"]*js/confirm\.js" defer></script>', html)


def test_no_template_has_an_inline_handler_script_or_style():
    found = {}
    templates = sorted(TEMPLATES.rglob("*.html"))
    assert len(templates) > 50
    for path in templates:
        if problems := inline_problems(COMMENT.sub("", path.read_text())):
            found[str(path.relative_to(TEMPLATES))] = problems
    assert not found, found


def test_the_inline_checks_find_what_they_are_for():
    for html in (
        "<form onsubmit=\"return confirm('x')\">",
        "<button\n  onclick='go()'>",
        '<div hx-on:click="alert(1)">',
        '<a href="javascript:void(0)">',
        '<span style="--heat: 5">',
        "<script>alert(1)</script>",
        '<script type="module">import x from "/y"</script>',
        "<style>p { color: red }</style>",
    ):
        assert inline_problems(html), html
    for html in (
        '<script src="/static/js/confirm.js" defer></script>',
        '<script type="application/json" id="data">{"a": 1}</script>',
        '<form data-confirm="Drain n1? No new slices; running ones continue.">',
        "<p>Click on=the button</p>",
    ):
        assert not inline_problems(html), html

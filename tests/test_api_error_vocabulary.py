"""One error vocabulary across the API (issue 13, "API consistency"), proven on the wire.

- an unknown field is `unknown_field` at every depth, named by its dotted path;
- a value out of range is `min_value` / `max_value` on every endpoint, whoever checks it
  (a serializer, the estimator, a service);
- integer fields take JSON integers only: `"2"`, `true`, `2.5` are `invalid`; `2.0` is 2;
- a well-formed but unknown token is "invalid or expired", a malformed header is not;
- every code is in gpuplatform.errors.ERROR_CODES, and README.md's table is that registry.
"""

import ast
import importlib
import pkgutil
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import django_filters
import pytest
from django.core.cache import cache
from django.utils import timezone
from rest_framework import exceptions, serializers
from rest_framework.test import APIClient

from gpuplatform.api.serializers import (
    StrictFieldsMixin,
    StrictIntegerMixin,
    StrictPrimaryKeyMixin,
    StrictSerializer,
)
from gpuplatform.errors import ERROR_CODES, ServiceError, error_code_table
from incidents.models import Thresholds
from nodes.models import Gpu, Node
from tenants import services
from tenants.amounts import MAX_GRANT
from tenants.authentication import MALFORMED_HEADER, TOKEN_REFUSED
from tenants.models import ApiToken, Image, Purchase, Slice, Tier
from tests.factories import make_token

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"catalog": "Qwen/Qwen2.5-0.5B"}
JOB = {"model": SMALL, "weights_dtype": "bf16", "context_tokens": 2048, "batch": 1}
NUMBERS = {"num_layers": 24, "hidden_size": 896, "num_heads": 14, "params": 5 * 10**8}


@pytest.fixture(autouse=True)
def _fresh_throttles():
    cache.clear()  # failed token attempts are counted per address
    yield
    cache.clear()


# --- helpers ------------------------------------------------------------------------------------


def refused(response, status: int = 400) -> dict[str, Any]:
    """The error body, after checking its shape and that every code in it is registered."""
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) >= {"code", "message"}, body
    assert body["code"] in ERROR_CODES, body
    assert status in ERROR_CODES[body["code"]].statuses, body
    for name, problems in body.get("fields", {}).items():
        for problem in problems:
            assert problem["code"] in ERROR_CODES, (name, problem)
            if status == 400:  # the specific code, registered as one a 400 can carry
                assert 400 in ERROR_CODES[problem["code"]].statuses, (name, problem)
            else:  # a 403/409/422 names its field with its own code
                assert problem["code"] == body["code"], (name, problem)
    return body


def field_code(response, field: str, status: int = 400) -> str:
    """The code the answer gives `field`; a 400 is always `validation_error` at the top and
    its message names the field by its dotted path."""
    body = refused(response, status)
    if status == 400:
        assert body["code"] == "validation_error", body
    assert field in body.get("fields", {}), body
    assert body["message"].startswith(f"{field}: "), body
    return body["fields"][field][0]["code"]


def tier(gb: int = 4) -> Tier:
    return Tier.objects.get(vram_mb=gb * 1024)


@pytest.fixture
def funded(owner_a, ops_user):
    services.credit_grant(tenant=owner_a.tenant, amount="100.00", actor=ops_user, memo="test")
    return owner_a


@pytest.fixture
def purchase(funded):
    bought, _ = services.purchase_create(membership=funded, tier=tier(4), hours=2)
    return bought


@pytest.fixture
def image(ops_user):
    return services.image_create(
        actor=ops_user,
        name="vllm",
        reference="vllm/vllm-openai:v0.6.3",
        ports=[8000],
        connect="service",
    )


@pytest.fixture
def gpu(db):
    node = Node.objects.create(
        gate_status="passed", name="gpu-a", address="10.0.0.5", port=22, status="active"
    )
    return Gpu.objects.create(
        node=node, uuid="GPU-aaaa", index=0, model="NVIDIA H100 80GB HBM3", vram_total_mb=81559
    )


def launch_body(purchase, image, **changes):
    return {"purchase": purchase.pk, "image": image.pk, "model": JOB, **changes}


# --- 1. unknown fields: `unknown_field` at every depth --------------------------------------------


def test_unknown_field_reads_the_same_at_the_top_and_nested_in_estimates(api_a):
    top = api_a.post("/api/v1/estimates/", {"model": SMALL, "bogus": 1}, format="json")
    nested = api_a.post("/api/v1/estimates/", {"model": {**SMALL, "bogus": 1}}, format="json")
    numbers = NUMBERS
    in_numbers = api_a.post("/api/v1/estimates/", {"model": {**numbers, "bogus": 1}}, format="json")
    assert field_code(top, "bogus") == "unknown_field"
    assert field_code(nested, "model.bogus") == "unknown_field"
    assert field_code(in_numbers, "model.bogus") == "unknown_field"
    assert nested.json()["message"] == "model.bogus: Unknown field."
    # the check can fail: the same bodies without the stray key are estimated
    assert api_a.post("/api/v1/estimates/", {"model": SMALL}, format="json").status_code == 200
    assert api_a.post("/api/v1/estimates/", {"model": numbers}, format="json").status_code == 200


def test_unknown_field_nested_in_a_launch_reads_like_an_unknown_top_level_one(
    api_a, purchase, image
):
    top = api_a.post("/api/v1/slices/", launch_body(purchase, image, bogus=1), format="json")
    in_job = api_a.post(
        "/api/v1/slices/",
        launch_body(purchase, image, model={**JOB, "bogus": 1}),
        format="json",
    )
    in_model = api_a.post(
        "/api/v1/slices/",
        launch_body(purchase, image, model={**JOB, "model": {**SMALL, "bogus": 1}}),
        format="json",
    )
    own_tier = api_a.post(
        "/api/v1/slices/",
        launch_body(purchase, image, model={**JOB, "tier_mib": 81920}),
        format="json",
    )
    assert field_code(top, "bogus") == "unknown_field"
    assert field_code(in_job, "model.bogus") == "unknown_field"
    assert field_code(in_model, "model.model.bogus") == "unknown_field"
    assert field_code(own_tier, "model.tier_mib") == "unknown_field"
    # the same words as the serializer's, not the estimator's own
    assert top.json()["fields"]["bogus"] == in_model.json()["fields"]["model.model.bogus"]
    assert not Slice.objects.exists()


def test_unknown_field_in_a_nested_serializer_is_named_by_its_path(api_ops):
    build = {"component": "runc", "build": "1.1.12", "reason": "CVE fix"}
    response = api_ops.patch(
        "/api/v1/node-policy/",
        {"reason": "test", "known_fixed_builds": [build, {**build, "bogus": 1}]},
        format="json",
    )
    assert field_code(response, "known_fixed_builds.1.bogus") == "unknown_field"
    ok = api_ops.patch(
        "/api/v1/node-policy/", {"reason": "test", "known_fixed_builds": [build]}, format="json"
    )
    assert ok.status_code == 200, ok.content


def test_a_writable_nested_serializer_must_be_strict():
    class Loose(serializers.Serializer):
        n = serializers.IntegerField()

    class Outer(StrictSerializer):
        inner = Loose()

    with pytest.raises(TypeError, match="Outer.inner"):
        Outer(data={}).is_valid()


# --- 2. range errors: `min_value` / `max_value` everywhere ----------------------------------------

RANGE_CASES = [
    # (id, who checks it, the body, the field, the code)
    ("purchase hours 0 (serializer)", "purchase", {"hours": 0}, "hours", "min_value"),
    ("purchase hours 721 (serializer)", "purchase", {"hours": 721}, "hours", "max_value"),
    (
        "estimate context -5 (estimator)",
        "estimate",
        {"context_tokens": -5},
        "context_tokens",
        "min_value",
    ),
    (
        "estimate context huge (estimator)",
        "estimate",
        {"context_tokens": 10**9},
        "context_tokens",
        "max_value",
    ),
    (
        "estimate utilization (estimator)",
        "estimate",
        {"gpu_memory_utilization": 2},
        "gpu_memory_utilization",
        "max_value",
    ),
    (
        "estimate num_layers 0 (estimator)",
        "estimate",
        {"model": {**NUMBERS, "num_layers": 0}},
        "model.num_layers",
        "min_value",
    ),
    (
        "launch context -5 (estimator via service)",
        "launch",
        {"context_tokens": -5},
        "model.context_tokens",
        "min_value",
    ),
    (
        "launch batch huge (estimator via service)",
        "launch",
        {"batch": 10**9},
        "model.batch",
        "max_value",
    ),
    ("token days 0 (serializer)", "token", {"expires_in_days": 0}, "expires_in_days", "min_value"),
    ("grant of 0 (service)", "grant", {"amount": "0.00"}, "amount", "min_value"),
    ("grant over the limit (service)", "grant", {"amount": "100000.01"}, "amount", "max_value"),
    (
        "ratio below 1 (service)",
        "ratio",
        {"overcommit_ratio": "0.50"},
        "overcommit_ratio",
        "min_value",
    ),
    (
        "ratio above 4 (service)",
        "ratio",
        {"overcommit_ratio": "4.50"},
        "overcommit_ratio",
        "max_value",
    ),
    ("port 0 (serializer)", "node", {"port": 0}, "port", "min_value"),
    ("image port 70000 (serializer)", "image", {"ports": [70000]}, "ports.0", "max_value"),
    (
        "too many image ports (service)",
        "image",
        {"ports": list(range(8000, 8009))},
        "ports",
        "max_length",
    ),
    (
        "percent over 100 (model serializer)",
        "thresholds",
        {"vram_warning_pct": 101},
        "vram_warning_pct",
        "max_value",
    ),
    ("ack id 0 (list child)", "ack", {"ids": [0]}, "ids.0", "min_value"),
]


def _send(kind: str, changes: dict, *, api_a, api_ops, owner_a, purchase, image, gpu):
    if kind == "purchase":
        return api_a.post("/api/v1/purchases/", {"tier": tier().pk, "hours": 1, **changes})
    if kind == "estimate":
        return api_a.post("/api/v1/estimates/", {"model": SMALL, **changes})
    if kind == "launch":
        return api_a.post("/api/v1/slices/", launch_body(purchase, image, model={**JOB, **changes}))
    if kind == "token":
        return api_a.post("/api/v1/tokens/", {"name": "laptop", **changes})
    if kind == "grant":
        body = {"tenant": owner_a.tenant.pk, "amount": "5.00", "memo": "test", **changes}
        return api_ops.post("/api/v1/ops/credit-grants/", body)
    if kind == "ratio":
        return api_ops.post(f"/api/v1/gpus/{gpu.pk}/policy/", changes)
    if kind == "node":
        return api_ops.post("/api/v1/nodes/", {"name": "gpu-b", "address": "10.0.0.9", **changes})
    if kind == "image":
        body = {"name": "x", "reference": "a/b:1", "connect": "service", **changes}
        return api_ops.post("/api/v1/ops/images/", body)
    if kind == "thresholds":
        return api_ops.patch("/api/v1/watchdog/thresholds/", changes)
    if kind == "ack":
        return api_ops.post("/api/v1/incidents/acknowledge/", changes)
    raise AssertionError(kind)


@pytest.mark.parametrize(
    ("kind", "changes", "field", "code"),
    [case[1:] for case in RANGE_CASES],
    ids=[case[0] for case in RANGE_CASES],
)
def test_range_errors_have_one_code_on_every_endpoint(
    request, api_a, api_ops, owner_a, purchase, image, kind, changes, field, code
):
    # a GPU (on a node that passed the gate) only where one is needed: with one, allowlisting
    # an image would try to inspect it over SSH
    gpu = request.getfixturevalue("gpu") if kind == "ratio" else None
    before = (Purchase.objects.count(), Slice.objects.count(), Image.objects.count())
    response = _send(
        kind,
        changes,
        api_a=api_a,
        api_ops=api_ops,
        owner_a=owner_a,
        purchase=purchase,
        image=image,
        gpu=gpu,
    )
    assert field_code(response, field) == code
    assert (Purchase.objects.count(), Slice.objects.count(), Image.objects.count()) == before


def test_the_range_cases_can_pass(api_a, api_ops, owner_a, purchase, image):
    """In-range values go through on the same endpoints: the assertions above bite."""
    sent = {"api_a": api_a, "api_ops": api_ops, "owner_a": owner_a, "purchase": purchase}
    sent |= {"image": image, "gpu": None}
    assert _send("grant", {"amount": "100000.00"}, **sent).status_code == 201
    assert _send("purchase", {"hours": 720}, **sent).status_code == 201
    assert _send("estimate", {"context_tokens": 4096}, **sent).status_code == 200
    assert _send("token", {"expires_in_days": 1}, **sent).status_code == 201
    assert _send("thresholds", {"vram_warning_pct": 80}, **sent).status_code == 200
    assert _send("image", {"ports": list(range(8000, 8008))}, **sent).status_code == 201
    assert _send("launch", {"context_tokens": 4096}, **sent).status_code == 201


def test_a_time_outside_the_storable_years_is_a_range_error(api_ops, gpu):
    url = f"/api/v1/gpus/{gpu.pk}/samples/"
    early = api_ops.get(url, {"start": "1999-12-31T00:00:00Z"})
    late = api_ops.get(url, {"end": "9500-01-01T00:00:00Z"})
    assert field_code(early, "start") == "min_value"
    assert field_code(late, "end") == "max_value"
    assert api_ops.get(url, {"start": "2024-01-01T00:00:00Z"}).status_code == 200


def test_hand_written_range_checks_in_services_use_the_same_codes(owner_a):
    """Paths the pages reach without a serializer in front."""
    for days, code in ((0, "min_value"), (10**6, "max_value")):
        with pytest.raises(ServiceError) as err:
            services.api_token_create(user=owner_a.user, name="t", expires_in_days=days)
        assert (err.value.code, err.value.field) == (code, "expires_in_days")
    for hours, code in ((0, "min_value"), (721, "max_value"), ("2", "invalid")):
        with pytest.raises(ServiceError) as err:
            services.purchase_create(membership=owner_a, tier=tier(), hours=hours)
        assert (err.value.code, err.value.field) == (code, "hours")


# --- 3. integer fields take JSON integers ----------------------------------------------------

NOT_INTEGERS = [
    # (id, endpoint kind, body changes, field)
    ("hours as a string", "purchase", {"hours": "2"}, "hours"),
    ("hours as text with a fraction", "purchase", {"hours": "2.0"}, "hours"),
    ("hours true", "purchase", {"hours": True}, "hours"),
    ("hours 1.5", "purchase", {"hours": 1.5}, "hours"),
    ("tier id as a string", "purchase", {"tier": "TIER"}, "tier"),
    ("tier id 1.5", "purchase", {"tier": "TIER+0.5"}, "tier"),
    ("tier id true", "purchase", {"tier": True}, "tier"),
    ("token days as a string", "token", {"expires_in_days": "3"}, "expires_in_days"),
    ("node port as a string", "node", {"port": "22"}, "port"),
    ("image port as a string (list child)", "image", {"ports": ["8000"]}, "ports.0"),
    ("incident id as a string (list child)", "ack", {"ids": ["1"]}, "ids.0"),
    (
        "threshold as a string (model serializer)",
        "thresholds",
        {"process_jump_mb": "3072"},
        "process_jump_mb",
    ),
    ("estimate context as a string", "estimate", {"context_tokens": "4096"}, "context_tokens"),
    ("estimate batch true", "estimate", {"batch": True}, "batch"),
    (
        "estimate layers as a string",
        "estimate",
        {"model": {**NUMBERS, "num_layers": "24"}},
        "model.num_layers",
    ),
    ("launch context as a string", "launch", {"context_tokens": "4096"}, "model.context_tokens"),
]


@pytest.mark.parametrize(
    ("kind", "changes", "field"),
    [case[1:] for case in NOT_INTEGERS],
    ids=[case[0] for case in NOT_INTEGERS],
)
def test_integer_fields_refuse_strings_booleans_and_fractions(
    api_a, api_ops, owner_a, purchase, image, kind, changes, field
):
    if changes.get("tier") == "TIER":
        changes = {"tier": str(tier().pk)}
    elif changes.get("tier") == "TIER+0.5":
        changes = {"tier": tier().pk + 0.5}  # Django would look up int(1.5) == 1
    before = (Purchase.objects.count(), Slice.objects.count(), Image.objects.count())
    thresholds = Thresholds.objects.values().first()
    response = _send(
        kind,
        changes,
        api_a=api_a,
        api_ops=api_ops,
        owner_a=owner_a,
        purchase=purchase,
        image=image,
        gpu=None,
    )
    assert field_code(response, field) == "invalid"
    if kind not in ("estimate", "launch"):  # the estimator words it its own way
        assert response.json()["fields"][field][0]["message"] == "A valid integer is required."
    assert (Purchase.objects.count(), Slice.objects.count(), Image.objects.count()) == before
    assert Thresholds.objects.values().first() == thresholds


def test_a_launch_refuses_a_purchase_id_sent_as_text(api_a, purchase, image):
    response = api_a.post(
        "/api/v1/slices/", {**launch_body(purchase, image), "purchase": str(purchase.pk)}
    )
    assert field_code(response, "purchase") == "invalid"
    assert not Slice.objects.exists()
    ok = api_a.post("/api/v1/slices/", launch_body(purchase, image), format="json")
    assert ok.status_code == 201, ok.content


def test_a_number_with_a_zero_fraction_is_that_integer(api_a, funded):
    """JSON does not tell 2 from 2.0 (nor do many clients): both buy two hours."""
    response = api_a.post("/api/v1/purchases/", {"tier": float(tier().pk), "hours": 2.0})
    assert response.status_code == 201, response.content
    assert response.json()["hours"] == 2 and response.json()["tier"] == tier().pk
    estimate = api_a.post(
        "/api/v1/estimates/", {"model": SMALL, "context_tokens": 2048.0, "batch": 1.0}
    )
    assert estimate.status_code == 200, estimate.content
    assert estimate.json()["request"]["context_tokens"] == 2048


def test_query_string_numbers_are_still_read_from_text(api_a, api_ops, gpu):
    assert api_a.get("/api/v1/purchases/", {"page": "1", "page_size": "10"}).status_code == 200
    samples = api_ops.get(f"/api/v1/gpus/{gpu.pk}/samples/", {"max_points": "100"})
    assert samples.status_code == 200, samples.content
    too_few = api_ops.get(f"/api/v1/gpus/{gpu.pk}/samples/", {"max_points": "5"})
    assert field_code(too_few, "max_points") == "min_value"


# --- 4. tokens: unknown says invalid or expired; only a malformed header says "header" ---------


def _bearer(value: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=value)
    return client


def test_a_well_formed_unknown_token_is_invalid_or_expired(db):
    for token in ("gpp_" + "x" * 43, "A" * 48, "0123456789abcdef" * 4):
        response = _bearer(f"Bearer {token}").get("/api/v1/me/")
        body = refused(response, 401)
        assert body == {"code": "authentication_failed", "message": TOKEN_REFUSED}
        assert "invalid" in body["message"].lower() and "expired" in body["message"].lower()
        assert "header" not in body["message"].lower()
        assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_revoked_or_expired_token_reads_exactly_like_an_unknown_one(owner_a):
    revoked, revoked_value = make_token(owner_a.user)
    expired, expired_value = make_token(owner_a.user)
    live, live_value = make_token(owner_a.user)
    ApiToken.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now())
    for value in (revoked_value, expired_value):
        body = refused(_bearer(f"Bearer {value}").get("/api/v1/me/"), 401)
        assert body["message"] == TOKEN_REFUSED
    assert _bearer(f"Bearer {live_value}").get("/api/v1/me/").status_code == 200


@pytest.mark.parametrize(
    "header", ["Bearer", "Bearer a b", "Bearer \u00e9t\u00e9", "Token"], ids=repr
)
def test_only_a_malformed_header_says_invalid_authorization_header(db, header):
    body = refused(_bearer(header).get("/api/v1/me/"), 401)
    assert body == {"code": "authentication_failed", "message": MALFORMED_HEADER}
    assert MALFORMED_HEADER.startswith("Invalid Authorization header")


# --- 400s caught by a service read like a serializer's ------------------------------------------


def test_bad_input_a_service_catches_is_a_validation_error_with_the_code_in_fields(
    api_a, purchase, image
):
    response = api_a.post(
        "/api/v1/slices/",
        launch_body(purchase, image, environment={"LD_PRELOAD": "/x.so"}),
        format="json",
    )
    assert field_code(response, "environment") == "reserved_variable"


# --- 5. the codes, written down once --------------------------------------------------------------

README_TABLE = re.compile(
    r"<!-- error-codes:start -->\n(?P<table>.*?)\n<!-- error-codes:end -->", re.DOTALL
)
ROW = re.compile(r"^\| `(?P<code>[a-z_]+)` \| (?P<status>[0-9, ]+) \| (?P<where>top|field) \| ")


def test_the_readme_table_is_the_registry():
    match = README_TABLE.search((ROOT / "README.md").read_text())
    assert match, "README.md lost its error-code table markers"
    table = match.group("table")
    rows = [ROW.match(line) for line in table.splitlines()[2:]]
    assert all(rows), [
        line for line, row in zip(table.splitlines()[2:], rows, strict=True) if not row
    ]
    listed = {row["code"]: (row["status"], row["where"]) for row in rows if row}
    assert listed == {c: (e.status, e.where) for c, e in ERROR_CODES.items()}
    assert table == error_code_table(), "regenerate it: gpuplatform.errors.error_code_table()"


# What each raising class answers with; a 400 ServiceError's code goes under `fields`.
STATUS_OF = {"ServiceError": 400, "NotAllowed": 403, "Conflict": 409}
SOURCES = ("tenants", "nodes", "incidents", "gpuplatform")
SKIP = ("migrations", "emulator")  # the node emulator speaks its own protocol


def _constants(node: ast.AST) -> list[str]:
    """The string constants an expression can evaluate to (through `a if c else b`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _constants(node.body) + _constants(node.orelse)
    return []


def _raised_codes() -> dict[str, set[tuple[str, int | None]]]:
    """Every error code written in the code base: {code: {(where, status or None)}}."""
    found: dict[str, set[tuple[str, int | None]]] = {}

    def add(values: list[str], where: str, status: int | None = None) -> None:
        for value in values:
            found.setdefault(value, set()).add((where, status))

    for package in SOURCES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if any(part in SKIP for part in path.parts):
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.Call):
                    func = node.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    for keyword in node.keywords:
                        if keyword.arg == "code":
                            add(_constants(keyword.value), where, STATUS_OF.get(name))
                    if name == "error_body" and node.args:
                        add(_constants(node.args[0]), where)
                elif isinstance(node, ast.Dict):
                    for key, value in zip(node.keys, node.values, strict=True):
                        if isinstance(key, ast.Constant) and key.value == "code":
                            add(_constants(value), where)
                elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                    if node.targets[0].id == "default_code":
                        add(_constants(node.value), where)
                elif isinstance(node, ast.FunctionDef):
                    # a local `code` that ends up as the code: `code = ...; ...(code=code)`
                    passes_code = any(
                        isinstance(sub, ast.Call)
                        and (
                            any(
                                k.arg == "code" and isinstance(k.value, ast.Name)
                                for k in sub.keywords
                            )
                            or (
                                getattr(sub.func, "id", "") == "error_body"
                                and sub.args
                                and isinstance(sub.args[0], ast.Name)
                            )
                        )
                        for sub in ast.walk(node)
                    )
                    for sub in ast.walk(node):
                        if node.name.endswith("_code") and isinstance(sub, ast.Return):
                            add(_constants(sub.value), where)
                        if not passes_code or not isinstance(sub, ast.Assign):
                            continue
                        for target in sub.targets:
                            if isinstance(target, ast.Name) and target.id == "code":
                                add(_constants(sub.value), where)
                            if isinstance(target, ast.Tuple) and isinstance(sub.value, ast.Tuple):
                                for item, value in zip(target.elts, sub.value.elts, strict=True):
                                    if isinstance(item, ast.Name) and item.id == "code":
                                        add(_constants(value), where)
    return found


def test_every_code_the_code_base_raises_is_registered_with_its_status():
    found = _raised_codes()
    # the scan sees the codes this issue is about, so it can fail
    assert {"unknown_field", "min_value", "max_value", "validation_error", "throttled"} <= set(
        found
    )
    missing = {
        code: sorted(w for w, _ in places)
        for code, places in found.items()
        if code not in ERROR_CODES
    }
    assert not missing, f"add these to gpuplatform.errors.ERROR_CODES and README.md: {missing}"
    wrong = {
        code: (status, ERROR_CODES[code].statuses, sorted(w for w, s in places if s == status))
        for code, places in found.items()
        for status in {s for _, s in places if s is not None}
        if status not in ERROR_CODES[code].statuses
    }
    assert not wrong, wrong
    assert "out_of_range" not in found and "invalid_port" not in found  # the old range codes


def test_drf_exceptions_are_registered_with_their_status():
    def subclasses(cls: type) -> list[type]:
        return [sub for direct in cls.__subclasses__() for sub in [direct, *subclasses(direct)]]

    drf = [c for c in subclasses(exceptions.APIException) if c.__module__ == exceptions.__name__]
    assert len(drf) >= 9
    for cls in drf:
        if cls is exceptions.ValidationError:  # answered as validation_error
            continue
        assert cls.default_code in ERROR_CODES, cls
        assert cls.status_code in ERROR_CODES[cls.default_code].statuses, cls


def _input_serializers() -> list[type]:
    for app in ("tenants", "nodes", "incidents"):
        package = importlib.import_module(f"{app}.api")
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{app}.api.{module.name}")

    def subclasses(cls: type) -> list[type]:
        return [sub for direct in cls.__subclasses__() for sub in [direct, *subclasses(direct)]]

    return [
        cls
        for cls in dict.fromkeys(subclasses(StrictFieldsMixin))
        if cls.__module__.split(".")[0] in ("tenants", "nodes", "incidents")
    ]


def _field_codes(field: serializers.Field, out: dict[str, set[str]], where: str) -> None:
    for key in field.error_messages:
        if key == "incorrect_type" and isinstance(field, StrictPrimaryKeyMixin):
            continue  # integer ids answer `invalid` before DRF's type check
        out.setdefault(key, set()).add(where)
    for validator in getattr(field, "validators", []):
        if getattr(validator, "code", None):
            out.setdefault(validator.code, set()).add(where)
    if isinstance(field, serializers.ManyRelatedField):
        _field_codes(field.child_relation, out, where)
    elif isinstance(
        field, serializers.ListField | serializers.DictField | serializers.ListSerializer
    ):
        _field_codes(field.child, out, f"{where}.*")
    elif isinstance(field, serializers.Serializer):
        for name, child in field.fields.items():
            if not child.read_only:
                _field_codes(child, out, f"{where}.{name}")


def test_every_code_an_input_field_can_answer_is_registered_as_a_field_code(db):
    classes = _input_serializers()
    assert len(classes) > 20
    codes: dict[str, set[str]] = {}
    for cls in classes:
        _field_codes(cls(context={}), codes, cls.__name__)
    assert {"required", "invalid", "min_value", "max_value", "max_length"} <= set(codes)
    missing = {code: sorted(where)[:3] for code, where in codes.items() if code not in ERROR_CODES}
    assert not missing, f"add these to gpuplatform.errors.ERROR_CODES and README.md: {missing}"
    for code in codes:
        assert ERROR_CODES[code].where == "field" and 400 in ERROR_CODES[code].statuses, code


def test_every_integer_input_field_is_strict(db):
    loose: list[str] = []

    def walk(field: serializers.Field, where: str) -> None:
        if isinstance(field, serializers.IntegerField) and not isinstance(
            field, StrictIntegerMixin
        ):
            loose.append(where)
        if isinstance(field, serializers.PrimaryKeyRelatedField) and not isinstance(
            field, StrictPrimaryKeyMixin
        ):
            loose.append(where)
        if isinstance(
            field, serializers.ListField | serializers.DictField | serializers.ListSerializer
        ):
            walk(field.child, f"{where}.*")
        elif isinstance(field, serializers.ManyRelatedField):
            walk(field.child_relation, where)
        elif isinstance(field, serializers.Serializer):
            for name, child in field.fields.items():
                if not child.read_only:
                    walk(child, f"{where}.{name}")

    for cls in _input_serializers():
        walk(cls(context={}), cls.__name__)
    assert not loose, loose


def test_every_code_a_filter_can_answer_is_registered(db):
    for app in ("tenants", "nodes", "incidents"):
        importlib.import_module(f"{app}.api.views")

    def subclasses(cls: type) -> list[type]:
        return [sub for direct in cls.__subclasses__() for sub in [direct, *subclasses(direct)]]

    filtersets = [
        fs
        for fs in subclasses(django_filters.FilterSet)
        if fs.__module__.split(".")[0] in ("tenants", "nodes", "incidents")
    ]
    assert len(filtersets) > 5
    for filterset in filtersets:
        form = filterset(data={}, queryset=filterset._meta.model.objects.none()).form
        for name, field in form.fields.items():
            codes = set(field.error_messages)
            codes |= {v.code for v in field.validators if getattr(v, "code", None)}
            assert codes <= set(ERROR_CODES), (filterset.__name__, name, codes - set(ERROR_CODES))


def test_registry_entries_are_well_formed():
    for code, entry in ERROR_CODES.items():
        assert re.fullmatch(r"[a-z][a-z_]*", code) and entry.code == code
        assert all(100 <= s < 600 for s in entry.statuses) and entry.meaning.endswith(".")
        assert "|" not in entry.meaning  # it is a Markdown table cell
    assert Decimal("100000.00") == MAX_GRANT  # the limit the range cases probe

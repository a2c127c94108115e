"""Launch templates: ops write them on allowlisted images, tenants read them with the engine
flag each tier gets on each card, and a launch from one tells its engine the slice's budget
as a fraction of what the device reports (nodes/engines.py), against the node emulator."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from emulator import GpuSpec, NodeSpec
from nodes import engines
from tenants.models import LaunchTemplate, Role, Slice
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db(transaction=True)

VLLM = {
    "name": "vLLM (Qwen 0.5B)",
    "engine": "vllm",
    "command": ["vllm", "serve", "Qwen/Qwen2.5-0.5B", "--port", "8000"],
    "model": {
        "model": {"catalog": "Qwen/Qwen2.5-0.5B"},
        "engine": "vllm",
        "context_tokens": 2048,
    },
}


# --- the flags, pure


@pytest.mark.parametrize(
    ("budget", "total", "flag"),
    [
        (7372, 24576, "0.29"),  # 0.9 of an 8 GB slice, of a 24 GB card: 7,127 MiB
        (7372, 8192, "0.89"),  # the same slice where the quota library reports 8 GB
        (22118, 24576, "0.89"),  # a whole 24 GB card at 0.9 (22,118 MiB, rounded down)
        (10, 81920, "0.01"),  # never zero: the engine would refuse to start
    ],
)
def test_the_vllm_flag_is_the_budget_of_what_the_device_reports_rounded_down(
    budget: int, total: int, flag: str
) -> None:
    args = engines.engine_flags("vllm", budget_mb=budget, total_mb=total)
    assert args == ["--gpu-memory-utilization", flag]
    assert int(float(flag) * total) <= max(budget, total // 100)  # never past the budget
    assert engines.engine_flags("sglang", budget_mb=budget, total_mb=total)[0] == (
        "--mem-fraction-static"
    )
    assert engines.engine_flags("ollama", budget_mb=budget, total_mb=total) == []
    with pytest.raises(ValueError, match="unknown engine"):
        engines.engine_flags("tensorrt; rm -rf /", budget_mb=budget, total_mb=total)


def test_what_cuda_reports_is_the_mig_device_the_quota_limit_or_the_card() -> None:
    assert (
        engines.reported_total_mb(vram_mb=8192, device_mb=24576, quota_library=False, mig=False)
        == 24576
    )
    assert (
        engines.reported_total_mb(vram_mb=8192, device_mb=24576, quota_library=True, mig=False)
        == 8192
    )
    assert (
        engines.reported_total_mb(vram_mb=9728, device_mb=9856, quota_library=True, mig=True)
        == 9856
    )


# --- ops write, tenants read


def _image(api_ops) -> int:
    from tenants.models import Image  # noqa: PLC0415 - beside the one test helper that needs it

    return Image.objects.create(name="vLLM", reference="vllm/vllm-openai:v0.11.0", ports=[8000],
                                connect="service").pk  # fmt: skip


def test_only_ops_write_templates_and_bad_ones_are_refused_naming_the_field(
    api_ops, api_a, owner_a
):
    image = _image(api_ops)
    refused = api_a.post("/api/v1/ops/templates/", {**VLLM, "image": image}, format="json")
    assert refused.status_code == 403 and not LaunchTemplate.objects.exists()
    for bad, field in (
        ({"command": []}, "command"),  # vLLM without its command: nothing to add the flag to
        ({"engine": "tensorrt"}, "engine"),
        ({"model": {"model": {"catalog": "no/such-model"}}}, "model"),
        ({"command": ["sh", "-c", "x"], "environment": {"LD_PRELOAD": "/x.so"}}, "environment"),
        ({"image": 424242}, "image"),
    ):
        answer = api_ops.post(
            "/api/v1/ops/templates/", {**VLLM, "image": image, **bad}, format="json"
        )
        assert answer.status_code == 400, (bad, answer.json())
        body = answer.json()
        named = {body.get("field") or ""} | set(body.get("fields") or {})
        assert any(n.split(".")[0] == field for n in named), (bad, body)
    assert not LaunchTemplate.objects.exists()
    made = api_ops.post("/api/v1/ops/templates/", {**VLLM, "image": image}, format="json")
    assert made.status_code == 201, made.json()
    again = api_ops.post("/api/v1/ops/templates/", {**VLLM, "image": image}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "template_exists"

    listed = api_a.get("/api/v1/templates/").json()
    assert [t["name"] for t in listed["results"]] == [VLLM["name"]]
    gone = api_ops.delete(f"/api/v1/ops/templates/{made.json()['id']}/")
    assert gone.status_code == 204
    assert api_a.get("/api/v1/templates/").json()["results"] == []
    assert LaunchTemplate.objects.get().is_active is False  # kept on record


def test_a_launch_from_a_vllm_template_tells_the_engine_the_slice_not_the_card(
    eager, worker_fleet, api_ops, api_a, owner_a, funded
):
    fleet = worker_fleet()  # one RTX 4090 (24 GB) whose quota library reports the slice
    image = _image(api_ops)
    template = api_ops.post(
        "/api/v1/ops/templates/", {**VLLM, "image": image}, format="json"
    ).json()
    sizing = {
        (row["tier_mb"], row["device"]): row["args"]
        for row in api_a.get(f"/api/v1/templates/{template['id']}/").json()["sizing"]
    }
    card_mb = fleet.registered[0].gpus.get().vram_total_mb
    on_card = sizing[(8192, f"NVIDIA GeForce RTX 4090 ({card_mb:,} MiB)")]
    assert on_card == ["--gpu-memory-utilization", engines.fraction(int(0.9 * 8192), card_mb)]
    assert float(on_card[1]) * card_mb <= 0.9 * 8192 < (float(on_card[1]) + 0.01) * card_mb
    assert sizing[(8192, "a node whose quota library reports the slice")] == [
        "--gpu-memory-utilization",
        "0.89",
    ]
    purchase = funded(owner_a, vram_gb=8, hours=1)
    answer = api_a.post(
        "/api/v1/slices/", {"purchase": purchase.pk, "template": template["id"]}, format="json"
    )
    assert answer.status_code == 201, answer.json()
    s = Slice.objects.get(pk=answer.json()["id"])
    assert s.state == "running", s.state_reason
    assert (s.engine, s.engine_budget_mb) == ("vllm", int(0.9 * 8192))
    container = fleet.nodes[0].container(s.container_id)
    # the template's command, then the platform's flag, sized to what the device reports
    assert list(container.cmd) == [*VLLM["command"], "--gpu-memory-utilization", "0.89"]
    assert s.engine_args == ["--gpu-memory-utilization", "0.89"]
    # what vLLM may take is inside the slice, and the estimate fits inside that
    assert s.vram_mb >= 0.89 * 8192 and s.estimate_mb <= 0.89 * 8192
    detail = api_a.get(f"/api/v1/slices/{s.pk}/").json()
    assert detail["template"] == template["id"] and detail["engine_args"] == s.engine_args


def test_a_template_launch_with_its_own_command_keeps_it_and_still_gets_the_flag(
    eager, worker_fleet, api_ops, api_a, owner_a, funded
):
    fleet = worker_fleet([NodeSpec("gpu-a", (GpuSpec("NVIDIA GeForce RTX 4090"),))])
    image = _image(api_ops)
    template = api_ops.post(
        "/api/v1/ops/templates/", {**VLLM, "image": image}, format="json"
    ).json()
    purchase = funded(owner_a, vram_gb=8, hours=1)
    mine = ["vllm", "serve", "Qwen/Qwen2.5-0.5B", "--gpu-memory-utilization", "0.95"]
    answer = api_a.post(
        "/api/v1/slices/",
        {"purchase": purchase.pk, "template": template["id"], "command": mine},
        format="json",
    )
    assert answer.status_code == 201, answer.json()
    s = Slice.objects.get(pk=answer.json()["id"])
    cmd = list(fleet.nodes[0].container(s.container_id).cmd)
    assert cmd[: len(mine)] == mine and cmd[-2:] == [
        "--gpu-memory-utilization",
        "0.89",
    ]  # last wins

    other = _other_image()
    wrong = api_a.post(
        "/api/v1/slices/",
        {
            "purchase": funded(owner_a, vram_gb=8, hours=1).pk,
            "template": template["id"],
            "image": other,
        },
        format="json",
    )
    assert wrong.status_code == 400 and "image" in wrong.json()["fields"], wrong.json()


def _other_image() -> int:
    from tenants.models import Image  # noqa: PLC0415 - beside the one test helper that needs it

    return Image.objects.create(name="Other", reference="x/other:1", connect="service").pk


def test_a_viewer_reads_the_templates(api_ops, owner_a, token_client):
    image = _image(api_ops)
    api_ops.post("/api/v1/ops/templates/", {**VLLM, "image": image}, format="json")
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER, user__email="v@a.test")
    client = token_client(viewer.user)
    assert client.get("/api/v1/templates/").status_code == 200


def test_the_launch_page_starts_from_a_template_and_shows_the_command_before_launch(
    eager, worker_fleet, api_ops, client, owner_a, funded
):
    from tests.tenants.test_lifecycle_pages import SSH_KEY  # noqa: PLC0415 - its form data

    fleet = worker_fleet()
    image = _image(api_ops)
    template = api_ops.post(
        "/api/v1/ops/templates/", {**VLLM, "image": image}, format="json"
    ).json()
    purchase = funded(owner_a, vram_gb=8, hours=1)
    client.force_login(owner_a.user)
    with CaptureQueriesContext(connection) as read:
        page = client.get(f"/launch/?template={template['id']}").content.decode()
    tier_reads = [q["sql"] for q in read.captured_queries if 'FROM "tenants_tier"' in q["sql"]]
    assert len(tier_reads) == 1, tier_reads  # the page's own list, not again for the sizing
    assert 'id="template-chosen">vLLM (Qwen 0.5B)<' in page
    assert "vllm\nserve\nQwen/Qwen2.5-0.5B" in page  # the command field, one argument per line
    assert f'name="template" value="{template["id"]}"' in page
    shown = " ".join(VLLM["command"]) + " --gpu-memory-utilization 0.89"
    assert f'<code class="template-argv">{shown}</code>' in page  # before launch
    form = {
        "purchase": purchase.pk, "image": image, "template": template["id"],
        "command": "\n".join(VLLM["command"]), "ssh_public_key": SSH_KEY,
        "guaranteed": "on", "idempotency_token": "t-tpl", "model": "Qwen/Qwen2.5-0.5B",
        "workload": "inference", "weights_dtype": "bf16", "kv_cache_dtype": "bf16",
        "engine": "vllm", "batch": "1", "context_tokens": "2048",
    }  # fmt: skip
    launched = client.post("/launch/", form)
    assert launched.status_code == 302, launched.content.decode()[-3000:]
    s = Slice.objects.get()
    assert s.template_id == template["id"] and s.engine_args == ["--gpu-memory-utilization", "0.89"]
    assert list(fleet.nodes[0].container(s.container_id).cmd)[-2:] == s.engine_args

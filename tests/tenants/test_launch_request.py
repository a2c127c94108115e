"""A launch and a resume are one typed request with one typed result, the same for the API
view and the page (and `gpp`, which speaks the API): a template's defaults are merged by
the service alone, the image and the job are required by it without a template, and a
refusal comes back one way, now or on a replay of the same key. No node: the slices wait
in the queue, which is all these rules need."""

import pytest

from tenants import services
from tenants.launch_request import LaunchRequest, ResumeRequest
from tenants.models import LaunchTemplate, Purchase, Slice, Tier
from tests.tenants.page_support import launch_data

pytestmark = pytest.mark.django_db

HUGE = {"model": {"catalog": "meta-llama/Llama-3.1-70B"}, "context_tokens": 32768}


@pytest.fixture
def image(ops_user):
    return services.image_create(
        actor=ops_user, name="server", reference="lab/http:1", ports=[8000], connect="service"
    )


@pytest.fixture
def template(image):
    return LaunchTemplate.objects.create(
        name="Batch job",
        image=image,
        command=["python", "serve.py"],
        environment={"MODE": "batch", "LOG": "info"},
        model_request={"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 2048,
                       "gpu_memory_utilization": 0.8},
    )  # fmt: skip


def _purchase(membership, ops_user, vram_gb: int = 8) -> Purchase:
    services.credit_grant(tenant=membership.tenant, amount="100.00", actor=ops_user, memo="t")
    tier = Tier.objects.get(vram_mb=vram_gb * 1024)
    return services.purchase_create(membership=membership, tier=tier, hours=2)[0]


def test_a_templates_defaults_go_under_what_the_request_gives(owner_a, ops_user, template):
    result = services.slice_launch_request(
        membership=owner_a,
        request=LaunchRequest(
            purchase=_purchase(owner_a, ops_user),
            template=template,
            model_request={"context_tokens": 1024},
            environment={"LOG": "debug"},
        ),
    )
    s = result.slice
    assert result.created and result.refusal is None
    assert s.image_entry == template.image and s.command == ["python", "serve.py"]
    assert s.environment == {"MODE": "batch", "LOG": "debug"}
    assert s.model_request == {
        "model": {"catalog": "Qwen/Qwen2.5-0.5B"},
        "context_tokens": 1024,
        "gpu_memory_utilization": 0.8,
    }


def test_the_api_and_the_page_launch_a_template_alike(
    client, api_a, owner_a, ops_user, template, image
):
    """Both keep what the template's job sets that they do not give (vLLM's share)."""
    purchase = _purchase(owner_a, ops_user)
    api = api_a.post(
        "/api/v1/slices/",
        {"purchase": purchase.pk, "template": template.pk,
         "model": {"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 1024}},
        format="json",
    )  # fmt: skip
    assert api.status_code == 201, api.content
    from_api = Slice.objects.get(pk=api.json()["id"])
    client.force_login(owner_a.user)
    page = client.post(
        "/launch/",
        launch_data(_purchase(owner_a, ops_user), image, template=template.pk,
                    command="python\nserve.py", environment="", context_tokens="1024"),
    )  # fmt: skip
    assert page.status_code == 302, page.content.decode()[:2000]
    from_page = Slice.objects.exclude(pk=from_api.pk).get()
    for s in (from_api, from_page):
        assert s.model_request["gpu_memory_utilization"] == 0.8
        assert s.model_request["context_tokens"] == 1024
        assert s.environment == {"MODE": "batch", "LOG": "info"}
        assert s.command == ["python", "serve.py"]


def test_without_a_template_the_service_asks_for_the_image_and_the_job(api_a, owner_a, ops_user):
    purchase = _purchase(owner_a, ops_user)
    no_image = api_a.post(
        "/api/v1/slices/", {"purchase": purchase.pk, "model": HUGE}, format="json"
    )
    assert no_image.status_code == 400 and "image" in no_image.json()["fields"]
    assert not Slice.objects.exists()


def test_a_refusal_is_answered_one_way_now_and_on_a_replay(client, api_a, owner_a, ops_user, image):
    purchase = _purchase(owner_a, ops_user, vram_gb=4)
    body = {"purchase": purchase.pk, "image": image.pk, "model": HUGE}
    first = api_a.post("/api/v1/slices/", body, format="json", HTTP_IDEMPOTENCY_KEY="big-1")
    again = api_a.post("/api/v1/slices/", body, format="json", HTTP_IDEMPOTENCY_KEY="big-1")
    assert first.status_code == again.status_code == 422
    assert first.json() == again.json() and first.json()["code"] == "estimate_exceeds_tier"
    assert Slice.objects.filter(state="refused").count() == 1
    # the page: the same panel for the first submit and for the same form sent again
    client.force_login(owner_a.user)
    form = launch_data(purchase, image, model="meta-llama/Llama-3.1-70B", context_tokens="32768",
                       idempotency_token="page-big-1")  # fmt: skip
    answers = [client.post("/launch/", form) for _ in range(2)]
    assert [a.status_code for a in answers] == [422, 422]
    assert all('id="refusal-message"' in a.content.decode() for a in answers)
    assert Slice.objects.filter(state="refused").count() == 2


def test_a_resume_without_a_purchase_takes_the_default_on_the_api_and_the_service(
    api_a, owner_a, ops_user, image
):
    """Its own purchase first, as the resume page preselects it."""
    purchase = _purchase(owner_a, ops_user)
    launched = services.slice_launch_request(
        membership=owner_a,
        request=LaunchRequest(purchase=purchase, image=image, model_request=HUGE | {
            "model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 2048}),
    ).slice  # fmt: skip
    services.slice_stop(slice=launched, actor=owner_a.user)  # queued: cancelled, stopped
    launched.refresh_from_db()
    assert launched.state == Slice.State.STOPPED
    result = services.slice_resume_request(
        membership=owner_a, slice=launched, request=ResumeRequest()
    )
    assert result.created and result.refusal is None and result.slice.purchase == purchase
    services.slice_stop(slice=result.slice, actor=owner_a.user)
    answer = api_a.post(f"/api/v1/slices/{launched.pk}/resume/", {}, format="json")
    assert answer.status_code == 202, answer.content
    assert answer.json()["runs"] == 3

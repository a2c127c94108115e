"""The /fit/ page's "Hugging Face model id" field (tests/estimator/hub_standin.py)."""

import pytest

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}
JOB = {"workload": "inference", "weights_dtype": "bf16", "kv_cache_dtype": "bf16",
       "engine": "transformers", "batch": "1", "context_tokens": "4096", "tier_mib": "24576",
       "model": "meta-llama/Llama-3.1-8B"}  # fmt: skip


def test_fit_reads_a_model_id_from_the_hub(client, hub):
    html = client.get("/fit/", {**JOB, "hub_model": "Qwen/Qwen3-30B-A3B"}, **HX).content.decode()
    assert "Does not fit the 24 GB tier" in html  # 61 GB of bf16 weights
    assert "safetensors headers on the Hub (16 files)" in html
    assert hub.requests


def test_fit_puts_a_missing_model_on_its_field(client, hub):
    html = client.get("/fit/", {**JOB, "hub_model": "nobody/nothing"}, **HX).content.decode()
    assert "nobody/nothing" in html and "no such model on the Hub" in html
    assert 'id="id_hub_model-error"' in html


def test_fit_refuses_an_invalid_id_before_asking_the_hub(client, hub):
    html = client.get("/fit/", {**JOB, "hub_model": "../etc/passwd"}, **HX).content.decode()
    assert "is not a Hugging Face model id" in html
    assert hub.requests == []


def test_the_fit_page_shows_the_field(client):
    html = client.get("/fit/").content.decode()
    assert "Hugging Face model id" in html and 'name="hub_revision"' in html


# -- the launch reads the Hub before its transaction; a budget of uncached reads ----------------

LLAMA = "openai/gpt-oss-20b"  # not gated in the stand-in


def _watch_reads(monkeypatch) -> tuple[int, list[int]]:
    """The transaction depth now, and the list each Hub read appends its depth to."""
    from django.db import connection  # noqa: PLC0415 - the test's own connection

    from tenants import hub as platform_hub  # noqa: PLC0415 - patched below

    depths: list[int] = []
    read = platform_hub._read

    def watched(ref):
        depths.append(len(connection.atomic_blocks))
        return read(ref)

    monkeypatch.setattr(platform_hub, "_read", watched)
    return len(connection.atomic_blocks), depths


def test_a_launch_reads_the_hub_before_its_transaction_opens(hub, owner_a, ops_user, monkeypatch):

    from tenants import services  # noqa: PLC0415 - Django is set up by then
    from tenants.launch_request import LaunchRequest  # noqa: PLC0415 - as above
    from tenants.models import Tier  # noqa: PLC0415 - as above

    image = services.image_create(
        actor=ops_user, name="server", reference="lab/http:1", ports=[8000], connect="service"
    )
    services.credit_grant(tenant=owner_a.tenant, amount="100.00", actor=ops_user, memo="t")
    tier = Tier.objects.get(vram_mb=8 * 1024)
    purchase = services.purchase_create(membership=owner_a, tier=tier, hours=2)[0]
    outside, depths = _watch_reads(monkeypatch)  # the test's own transaction
    result = services.slice_launch_request(
        membership=owner_a,
        request=LaunchRequest(
            purchase=purchase, image=image, model_request={"model": {"hub": LLAMA}}
        ),
    )
    assert depths == [outside]  # read once, with no transaction of the launch's open
    assert hub.requests and result.refusal is not None  # 13 GB of weights on 8 GB
    assert LLAMA in result.refusal.message or result.slice.estimate["model"]["name"] == LLAMA


def test_a_template_reads_the_hub_before_its_transaction_opens(hub, ops_user, monkeypatch):

    from tenants import services  # noqa: PLC0415 - Django is set up by then

    image = services.image_create(
        actor=ops_user, name="server", reference="lab/http:1", ports=[8000], connect="service"
    )
    outside, depths = _watch_reads(monkeypatch)
    job = {"model": {"hub": LLAMA}, "workload": "inference"}
    template = services.template_create(actor=ops_user, name="gpt-oss", image=image,
                                        model_request=job)  # fmt: skip
    services.template_update(actor=ops_user, template=template,
                             model_request={**job, "context_tokens": 2048})  # fmt: skip
    assert depths == [outside]  # the update is answered from the cache, read outside too
    assert hub.requests


def _hub_rates(settings, **rates):
    rest = dict(settings.REST_FRAMEWORK)
    rest["DEFAULT_THROTTLE_RATES"] = {**rest["DEFAULT_THROTTLE_RATES"], **rates}
    settings.REST_FRAMEWORK = rest


def test_uncached_hub_reads_have_a_budget_of_their_own(hub, anon_api, settings):
    _hub_rates(settings, hub_read_anon="1/hour")
    body = {"context_tokens": 4096}
    first = anon_api.post("/api/v1/estimates/", {"model": {"hub": LLAMA}, **body}, format="json")
    assert first.status_code == 200, first.content
    asked = len(hub.requests)
    other = anon_api.post(
        "/api/v1/estimates/", {"model": {"hub": "Qwen/Qwen3-30B-A3B"}, **body}, format="json"
    )
    assert other.status_code == 429, other.content
    assert other.json()["code"] == "throttled"
    assert other.has_header("Retry-After")
    assert len(hub.requests) == asked  # refused before any request
    again = anon_api.post("/api/v1/estimates/", {"model": {"hub": LLAMA}, **body}, format="json")
    assert again.status_code == 200  # read before: free


def test_the_fit_page_shows_a_spent_hub_budget_on_the_field(client, hub, settings):
    _hub_rates(settings, hub_read_anon="1/hour")
    first = client.get("/fit/", {**JOB, "hub_model": LLAMA}, **HX).content.decode()
    assert "safetensors headers on the Hub" in first
    html = client.get("/fit/", {**JOB, "hub_model": "Qwen/Qwen3-30B-A3B"}, **HX).content.decode()
    assert "too many models not read before" in html and 'id="id_hub_model-error"' in html


def test_cache_keys_are_case_blind_for_ids_and_never_hold_the_token(settings):
    from estimator.hub import HubRef  # noqa: PLC0415 - as above
    from tenants.hub import facts_key, ref_key  # noqa: PLC0415 - Django is set up by then

    settings.HF_TOKEN = "hf_secret_never_in_a_key"
    sha = "a" * 40
    assert facts_key("Qwen/Qwen3-8B", sha) == facts_key("qwen/qwen3-8b", sha)
    assert ref_key(HubRef("Qwen/Qwen3-8B", "main")) != ref_key(HubRef("Qwen/Qwen3-8B", "Main"))
    assert ref_key(HubRef("a/b", "main")) != ref_key(HubRef("a/b", "v1"))
    assert "hf_secret" not in ref_key(HubRef("a/b", "main")) + facts_key("a/b", sha)
    key = ref_key(HubRef("a/b", "main"))
    settings.HF_ENDPOINT = "https://mirror.example"
    assert ref_key(HubRef("a/b", "main")) != key  # another endpoint, another entry

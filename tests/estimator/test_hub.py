"""A model named by its Hugging Face id: read from a loopback stand-in of the Hub
(tests/estimator/hub_standin.py), through huggingface_hub, into the same estimate as its
pasted config.json, with the weights exact from the safetensors headers."""

from __future__ import annotations

import json

import pytest

import estimator
from estimator.hub import MAX_HEADER_BYTES, HubRef, check_repo_id, check_revision
from estimator.hub_fetch import fetch_hub_facts
from tests.estimator.hub_standin import FIXTURES, TOKEN, load_description

pytestmark = pytest.mark.django_db
URL = "/api/v1/estimates/"
QWEN = "Qwen/Qwen3-30B-A3B"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def _post(client, model, **settings):
    return client.post(URL, {"model": model, "context_tokens": 4096, **settings}, format="json")


def _config(name: str) -> str:
    return (FIXTURES / "configs" / name).read_text()


def _term(body, key):
    return next(t for t in body["terms"] if t["key"] == key)


def _refusal(response, field: str) -> dict:
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "validation_error", body
    problem = body["fields"][field][0]
    assert problem["code"] in estimator_codes(), problem
    return {"code": problem["code"], "message": problem["message"]}


def estimator_codes() -> set[str]:
    from gpuplatform.errors import ERROR_CODES  # noqa: PLC0415 - Django settings are set up by then

    return set(ERROR_CODES)


def test_a_model_id_gives_the_estimate_of_its_config_with_exact_weights(hub, anon_api):
    by_id = _post(anon_api, {"hub": QWEN})
    pasted = _post(anon_api, {"config_json": _config("qwen3-30b-a3b.json")})
    assert by_id.status_code == 200, by_id.content
    a, b = by_id.json(), pasted.json()
    assert a["model"]["params"] == b["model"]["params"] == 30_532_122_624
    assert _term(a, "kv_cache")["mib"] == _term(b, "kv_cache")["mib"]
    weights = _term(a, "weights")
    assert weights["basis"] == "exact" and _term(b, "weights")["basis"] == "derived"
    assert weights["mib"] == pytest.approx(30_532_122_624 * 2 / 2**20, abs=0.1)  # API: 0.1 MiB
    assert a["total_mib"] == b["total_mib"]
    assert "safetensors headers on the Hub (16 files)" in a["model"]["read_as"]
    assert a["model"]["name"] == QWEN


def test_a_second_estimate_of_the_same_id_makes_no_request(hub, anon_api):
    assert _post(anon_api, {"hub": QWEN}).status_code == 200
    asked = len(hub.requests)
    assert asked > 16  # model info, config.json, the index, 16 headers
    assert _post(anon_api, {"hub": QWEN, "revision": "main"}, batch=4).status_code == 200
    assert len(hub.requests) == asked


def test_only_headers_are_read_never_the_weights(hub):
    facts = fetch_hub_facts(HubRef(QWEN), endpoint=hub.url, timeout=5)
    assert facts["files"] == 16 and facts["tensor_bytes"] == 2 * 30_532_122_624
    ranges = [h.get("Range") for _, p, h in hub.requests if p.endswith(".safetensors")]
    # the first 100 kB of each file, then (a header longer than that) exactly the header
    assert ranges.count("bytes=0-100000") == 16, ranges
    assert all(r == "bytes=0-100000" or r.startswith("bytes=8-") for r in ranges), ranges


def test_an_unknown_family_still_gets_exact_weights_and_its_kv_from_the_config(hub, anon_api):
    description = load_description("qwen3-30b-a3b")
    description.update(repo_id="acme/mystery-moe", config_overrides={"model_type": "mystery_moe"})
    hub.add(description)
    body = _post(anon_api, {"hub": "acme/mystery-moe"}).json()
    known = _post(anon_api, {"hub": QWEN}).json()
    assert body["model"]["params"] == 30_532_122_624
    weights = _term(body, "weights")
    assert weights["basis"] == "exact" and weights["mib"] == _term(known, "weights")["mib"]
    assert _term(body, "kv_cache")["mib"] == _term(known, "kv_cache")["mib"]
    assert "mystery_moe" in body["model"]["read_as"]


def test_an_unknown_family_whose_attention_cannot_be_read_is_refused(hub, anon_api):
    description = load_description("qwen3-30b-a3b")
    overrides = {"model_type": "mystery_moe", "num_hidden_layers": None,
                 "num_attention_heads": None}  # fmt: skip
    description.update(repo_id="acme/opaque", config_overrides=overrides)
    hub.add(description)
    refusal = _refusal(_post(anon_api, {"hub": "acme/opaque"}), "model.config_json.model_type")
    assert refusal["code"] == "unsupported_architecture"
    assert "num_hidden_layers" in refusal["message"] and "KV cache" in refusal["message"]


def test_a_missing_model_is_a_clear_400_naming_it(hub, anon_api):
    refusal = _refusal(_post(anon_api, {"hub": "nobody/no-such-model"}), "model.hub")
    assert refusal["code"] == "hub_model_not_found"
    assert "nobody/no-such-model" in refusal["message"]


def test_a_revision_that_does_not_exist_is_refused_on_the_revision(hub, anon_api):
    response = _post(anon_api, {"hub": QWEN, "revision": "v9.9"})
    refusal = _refusal(response, "model.revision")
    assert refusal["code"] == "hub_revision_not_found"
    assert QWEN in refusal["message"] and "v9.9" in refusal["message"]


def test_a_gated_model_without_a_token_is_refused(hub, anon_api):
    refusal = _refusal(_post(anon_api, {"hub": LLAMA}), "model.hub")
    assert refusal["code"] == "hub_gated" and LLAMA in refusal["message"]
    assert not any("Authorization" in h for _, _, h in hub.requests)


def test_the_token_is_sent_to_the_hub_and_never_shown(hub, anon_api, settings):
    settings.HF_TOKEN = TOKEN
    response = _post(anon_api, {"hub": LLAMA})
    assert response.status_code == 200, response.content
    assert TOKEN not in response.content.decode()
    sent = {h.get("Authorization") for _, _, h in hub.requests}
    assert sent == {f"Bearer {TOKEN}"}
    pasted = _post(anon_api, {"config_json": _config("llama-3-1-8b-instruct.json")}).json()
    body = response.json()
    assert body["model"]["params"] == pasted["model"]["params"] == 8_030_261_248
    assert body["total_mib"] == pasted["total_mib"]
    assert _term(body, "weights")["basis"] == "exact"


def test_a_hub_that_does_not_answer_in_time_is_a_timeout(hub, anon_api, settings):
    settings.HF_HUB_TIMEOUT = 0.3
    hub.delay_s = 1.0
    refusal = _refusal(_post(anon_api, {"hub": QWEN}), "model.hub")
    assert refusal["code"] == "hub_timeout" and QWEN in refusal["message"]


BAD_IDS = ["", "a/b/c", "../etc", "x/..y", "-lead/name", "name-", "a b/c", "a/b?c=1",
           "a/b#x", "x" * 97, "é/model", "org/.hidden", "org/name.", 42, None]  # fmt: skip
BAD_REVISIONS = ["", "a b", "../main", "main..x", "x" * 101, "a?b", "tag#1", "/main",
                 "main/", "refs//pr", "v1.lock", "%2e%2e", 3]  # fmt: skip


@pytest.mark.parametrize("repo_id", BAD_IDS)
def test_an_invalid_id_is_refused_before_any_request(hub, anon_api, repo_id):
    refusal = _refusal(_post(anon_api, {"hub": repo_id}), "model.hub")
    assert refusal["code"] == "invalid"
    assert hub.requests == []


@pytest.mark.parametrize("revision", BAD_REVISIONS)
def test_an_invalid_revision_is_refused_before_any_request(hub, anon_api, revision):
    refusal = _refusal(_post(anon_api, {"hub": QWEN, "revision": revision}), "model.revision")
    assert refusal["code"] == "invalid"
    assert hub.requests == []


@pytest.mark.parametrize("repo_id", ["gpt2", "Qwen/Qwen3-8B", "a.b_c-d/e.f_g-h", "x" * 96])
def test_valid_ids_and_revisions(repo_id):
    assert check_repo_id(repo_id) == repo_id
    for revision in ("main", "v1.0", "refs/pr/3", "0e9e39f249a16976918f6564b8830bc894c89659"):
        assert check_revision(revision) == revision


def test_a_header_longer_than_the_cap_is_refused_without_fetching_it(hub, anon_api):
    description = load_description("llama-3-1-8b-instruct")
    description.update(repo_id="acme/huge-header", gated=False, shards=1,
                       declared_header_length=MAX_HEADER_BYTES + 1)  # fmt: skip
    hub.add(description)
    refusal = _refusal(_post(anon_api, {"hub": "acme/huge-header"}), "model.hub")
    assert refusal["code"] == "hub_too_large" and "acme/huge-header" in refusal["message"]
    ranges = [h.get("Range") for _, p, h in hub.requests if p.endswith("model.safetensors")]
    assert ranges == ["bytes=0-100000"]  # the length prefix's read; never bytes=8-...


def test_too_many_shards_are_refused_before_any_header_is_read(hub):
    with pytest.raises(estimator.EstimatorError) as refused:
        fetch_hub_facts(HubRef(QWEN), endpoint=hub.url, timeout=5, max_shards=8)
    assert refused.value.code == "hub_too_large" and "16" in refused.value.message
    assert not [p for _, p, _ in hub.requests if p.endswith(".safetensors")]


def test_without_the_platform_a_hub_id_is_refused_not_fetched():
    with pytest.raises(estimator.EstimatorError) as refused:
        estimator.EstimateRequest.from_mapping({"model": {"hub": QWEN}})
    assert refused.value.field == "model.hub"


def test_a_hub_id_stands_alone(anon_api, hub):
    response = _post(anon_api, {"hub": QWEN, "config_json": "{}"})
    assert response.status_code == 400
    assert hub.requests == []


def test_the_served_index_matches_the_published_total(hub):
    repo = hub.repos[LLAMA]
    index = json.loads(repo.files["model.safetensors.index.json"].data)
    assert index["metadata"]["total_size"] == 16_060_522_496  # the published index's


GPT_OSS = "openai/gpt-oss-20b"
GPT_OSS_STORED = 13_761_264_768  # the published index's metadata.total_size


def test_gpt_oss_20b_weights_come_out_at_its_stored_size(hub, anon_api):
    """MXFP4 experts (U8 blocks and scales) and bf16 elsewhere: the weights term is the
    stored bytes, about 12.8 GiB, not 21 B parameters at two bytes (39 GiB)."""
    index = json.loads(hub.repos[GPT_OSS].files["model.safetensors.index.json"].data)
    assert index["metadata"]["total_size"] == GPT_OSS_STORED
    by_id = _post(anon_api, {"hub": GPT_OSS})
    assert by_id.status_code == 200, by_id.content
    body = by_id.json()
    weights = _term(body, "weights")
    assert weights["basis"] == "exact"
    assert weights["mib"] == pytest.approx(GPT_OSS_STORED / 2**20, abs=0.1)
    pasted = _post(anon_api, {"config_json": _config("gpt-oss-20b.json")}).json()
    assert body["model"]["params"] == pasted["model"]["params"] == 20_914_757_184
    # the pasted config's quantization_config sizes the same storage from the layout
    assert _term(pasted, "weights")["mib"] == pytest.approx(GPT_OSS_STORED / 2**20, rel=0.002)


def test_an_unknown_family_whose_layers_cache_differently_is_refused_not_guessed(hub, anon_api):
    """gpt-oss under a name nobody knows: its windows on every other layer would make a
    full-attention reading of its fields wrong, so the KV cache is refused, naming why."""
    description = load_description("gpt-oss-20b")
    description.update(repo_id="acme/windowed", config_overrides={"model_type": "windowed"})
    hub.add(description)
    refusal = _refusal(_post(anon_api, {"hub": "acme/windowed"}), "model.config_json.model_type")
    assert refusal["code"] == "unsupported_architecture"
    assert "sliding_window" in refusal["message"] and "layer_types" in refusal["message"]

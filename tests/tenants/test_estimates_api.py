"""POST /api/v1/estimates/ and the public "will it fit?" page over the estimator."""

import pytest
from django.core.cache import cache

pytestmark = pytest.mark.django_db

URL = "/api/v1/estimates/"
LLAMA = {"catalog": "meta-llama/Llama-3.1-8B"}


def _post(client, payload):
    return client.post(URL, payload, format="json")


def test_anonymous_estimate_with_breakdown_and_verdict(anon_api):
    response = _post(
        anon_api,
        {
            "model": LLAMA,
            "workload": "inference",
            "weights_dtype": "bf16",
            "batch": 1,
            "context_tokens": 4096,
            "tier_mib": 8192,
        },
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["total_mib"] == pytest.approx(sum(t["mib"] for t in body["terms"]), abs=1)
    weights = next(t for t in body["terms"] if t["key"] == "weights")
    assert weights["mib"] == pytest.approx(14.96 * 1024, rel=0.01)  # 8.03 B params in bf16
    assert body["fits"] is False  # 15 GiB of weights never fit 8 GiB
    assert body["smallest_fitting_tier_mib"] == 24576
    assert body["suggestions"] and all(
        s["total_mib"] < body["total_mib"] for s in body["suggestions"]
    )


def test_estimate_has_no_side_effects(anon_api, django_assert_max_num_queries):
    with django_assert_max_num_queries(0):
        assert _post(anon_api, {"model": LLAMA}).status_code == 200


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"model": {"catalog": "no/such-model"}}, "model.catalog"),
        ({"model": LLAMA, "batch": -1}, "batch"),
        ({"model": LLAMA, "batch": "many"}, "batch"),
        ({"model": LLAMA, "weights_dtype": "fp3"}, "weights_dtype"),
        ({"model": LLAMA, "engine": "tgi-next"}, "engine"),
        ({"model": LLAMA, "colour": "red"}, "colour"),
        ({"model": {"config_json": "{not json"}}, "model.config_json"),
        (
            {"model": {"hidden_size": 4096, "num_layers": 0, "num_heads": 32, "vocab_size": 32000}},
            "model.num_layers",
        ),
        (
            {
                "model": {
                    "hidden_size": 4096,
                    "num_layers": 32,
                    "num_heads": 32,
                    "num_kv_heads": 5,
                    "vocab_size": 32000,
                    "intermediate_size": 11008,
                }
            },
            "model.num_kv_heads",
        ),
        ({"model": {"parameters": 10**14}}, "model.parameters"),
    ],
)
def test_bad_input_is_400_naming_the_field(anon_api, payload, field):
    response = _post(anon_api, payload)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "validation_error"
    assert any(name.startswith(field) for name in body["fields"]), body
    assert body["message"].startswith(field)


def test_non_object_and_oversized_bodies_are_400(anon_api):
    assert _post(anon_api, [1, 2]).status_code == 400
    big = {"model": {"config_json": "{" + " " * (1024 * 1024) + "}"}}
    response = _post(anon_api, big)
    assert response.status_code == 400
    assert response.json()["code"] == "parse_error"


def test_anonymous_estimates_are_throttled(anon_api, settings):
    cache.clear()
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"anon": "2/min", "user": "100/min", "auth_failure": "10/min"},
    }
    codes = [_post(anon_api, {"model": LLAMA}).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    cache.clear()


def test_catalog_lists_models_with_sources(anon_api):
    body = anon_api.get("/api/v1/estimates/models/").json()
    assert body["count"] >= 12
    names = {row["name"] for row in body["results"]}
    assert "meta-llama/Llama-3.1-8B" in names
    assert all(row["source"].startswith("https://") for row in body["results"])


def test_fit_page_shows_verdict_and_updates_with_htmx(client):
    page = client.get("/fit/").content.decode()
    assert 'id="fit-verdict"' in page and 'id="fit-terms"' in page
    params = {
        "model": "Qwen/Qwen2.5-0.5B",
        "workload": "inference",
        "weights_dtype": "bf16",
        "kv_cache_dtype": "bf16",
        "engine": "transformers",
        "batch": 1,
        "context_tokens": 2048,
        "tier_mib": 4096,
    }
    partial = client.get("/fit/", params, HTTP_HX_REQUEST="true").content.decode()
    assert partial.lstrip().startswith('<section id="fit-result"')
    assert "Fits the 4 GB tier" in partial
    bad = client.get(
        "/fit/", {**params, "config_json": "{broken"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert 'id="fit-error"' in bad and "config_json" in bad

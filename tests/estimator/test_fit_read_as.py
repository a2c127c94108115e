"""The /fit/ page and POST /api/v1/estimates/ say which family a model was read as, and how."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.django_db

JAMBA = (Path(__file__).parent / "fixtures" / "configs" / "jamba-v0-1.json").read_text()


def test_the_api_names_the_family_and_the_reading(anon_api) -> None:
    body = anon_api.post(
        "/api/v1/estimates/", {"model": {"config_json": JAMBA}}, format="json"
    ).json()
    assert body["model"]["family"] == "jamba"
    assert "config.json" in body["model"]["read_as"] and "SSM" in body["model"]["read_as"]
    catalog = anon_api.post(
        "/api/v1/estimates/", {"model": {"catalog": "meta-llama/Llama-3.1-8B"}}, format="json"
    ).json()
    assert "catalog" in catalog["model"]["read_as"]


def test_the_fit_page_shows_the_family_it_read(client) -> None:
    params = {
        "model": "meta-llama/Llama-3.1-8B", "config_json": JAMBA, "workload": "inference",
        "weights_dtype": "bf16", "kv_cache_dtype": "bf16", "engine": "transformers",
        "batch": "1", "context_tokens": "4096", "method": "lora", "optimizer": "adamw",
    }  # fmt: skip
    page = client.get("/fit/", params, HTTP_HX_REQUEST="true").content.decode()
    assert 'id="fit-read-as"' in page
    assert "<strong>jamba</strong>" in page and "4 attention + 28 SSM layers" in page

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

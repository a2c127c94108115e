"""`gpp estimate` with a Hugging Face model id: the platform reads it from the Hub
(a stand-in here, tests/estimator/hub_standin.py)."""

QWEN = "Qwen/Qwen3-30B-A3B"


def test_estimate_a_model_id_that_is_not_a_catalog_name(gpp, hub):
    plain = gpp("estimate", QWEN, "--json")
    assert plain.code == 0, plain.stderr
    assert plain.json()["estimate"]["model"]["name"] == QWEN
    flagged = gpp("estimate", "--hub", QWEN, "--revision", "main", "--json")
    assert flagged.code == 0, flagged.stderr
    assert flagged.json()["estimate"]["total_mib"] == plain.json()["estimate"]["total_mib"]


def test_estimate_a_missing_model_id_names_it(gpp, hub):
    missing = gpp("estimate", "--hub", "nobody/nothing", "--json")
    assert missing.code == 1
    error = missing.error()
    assert error["fields"]["model.hub"][0]["code"] == "hub_model_not_found"
    assert "nobody/nothing" in error["message"]

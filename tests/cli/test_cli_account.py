"""`gpp` against the live test server, without nodes: login (the token stored 0600, the
environment over it), tiers, estimates with the verdict per tier, buying once per
idempotency key (also when the CLI retries a call whose answer was lost), and the exit
codes: 1 for the API's refusals, 2 for usage errors, 3 for network and auth failures."""

from __future__ import annotations

import socket
import stat
from decimal import Decimal
from pathlib import Path

import pytest

from tenants import services
from tenants.models import LedgerEntry, Purchase, Tier
from tests.cli.support import LosingProxy
from tests.factories import MembershipFactory, make_token

pytestmark = pytest.mark.django_db(transaction=True)

CONFIGS = Path(__file__).resolve().parent.parent / "tenants" / "fixtures" / "estimator"


def grant(owner, ops_user, amount: str = "50.00") -> None:
    services.credit_grant(tenant=owner.tenant, amount=amount, actor=ops_user, memo="cli tests")


def test_login_checks_the_token_stores_it_0600_and_the_environment_overrides_it(gpp, owner, token):
    gpp.token = ""  # as a new user: nothing in the environment
    bad = gpp("login", "--url", gpp.url + "/api/v1/", "--token-stdin", stdin="gpp_wrong\n")
    assert bad.code == 3, bad.stderr
    assert not (gpp.config_dir / "config.json").exists()  # a refused token is not stored

    done = gpp("login", "--url", gpp.url + "/api/v1/", "--token-stdin", stdin=token + "\n")
    assert done.code == 0, done.stderr
    assert f"as {owner.user.email} (Kestrel Compute, owner)" in done.stdout
    stored = gpp.config_dir / "config.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert token in stored.read_text() and gpp.url in stored.read_text()

    # the stored login serves every later command, with GPP_URL unset too
    me = gpp("whoami", "--json", GPP_URL="")
    assert me.code == 0, me.stderr
    assert me.json()["me"]["email"] == owner.user.email
    assert me.json()["token_from"] == str(stored)

    # GPP_TOKEN wins over the stored token
    other = MembershipFactory(tenant__name="Other Lab", user__email="olga@other.test")
    them = gpp("whoami", "--json", GPP_TOKEN=make_token(other.user)[1])
    assert them.json()["me"]["email"] == "olga@other.test"
    assert them.json()["token_from"] == "GPP_TOKEN"

    out = gpp("logout")
    assert out.code == 0 and token not in stored.read_text()
    after = gpp("whoami")
    assert after.code == 3 and "not_logged_in" in after.stderr


def test_tiers_list_what_is_on_sale(gpp):
    listed = gpp("tiers", "--json")
    assert listed.code == 0, listed.stderr
    assert [t["vram_gb"] for t in listed.json()] == [4, 8, 12, 24]
    Tier.objects.filter(vram_mb=12 * 1024).update(is_active=False)
    shown = gpp("tiers")
    assert shown.code == 0
    assert "8 GB" in shown.stdout and "12 GB" not in shown.stdout
    assert "12 GB" in gpp("tiers", "--all").stdout


def test_estimate_gives_the_verdict_per_tier_for_a_catalog_model_and_a_config_json(gpp):
    big = gpp("estimate", "meta-llama/Llama-3.1-8B", "--json")
    assert big.code == 0, big.stderr
    verdicts = {row["vram_mb"] // 1024: row["fits"] for row in big.json()["tiers"]}
    assert verdicts == {4: False, 8: False, 12: False, 24: True}
    assert big.json()["smallest_fitting_tier"]["name"] == "24 GB"

    small = gpp("estimate", "Qwen/Qwen2.5-1.5B", "--context", "2048")
    assert small.code == 0, small.stderr
    assert "Smallest tier that fits: 4 GB." in small.stdout

    # a local config.json: in nf4 the 7B fits 8 GB, not 4 GB
    config = CONFIGS / "qwen2.5-7b.config.json"
    local = gpp("estimate", "--config", str(config), "--dtype", "nf4", "--json")
    assert local.code == 0, local.stderr
    rows = local.json()["tiers"]
    assert local.json()["estimate"]["weights_dtype"] == "nf4"
    assert [r["fits"] for r in rows] == sorted(r["fits"] for r in rows)  # fits from some size up
    assert rows[0]["fits"] is False and rows[-1]["fits"] is True

    # without a token: the estimator is public, its default tier sizes stand in
    anonymous = gpp("estimate", "meta-llama/Llama-3.1-8B", "--json", GPP_TOKEN="")
    assert anonymous.code == 0, anonymous.stderr
    assert [(r["vram_mb"], r["fits"]) for r in anonymous.json()["tiers"]] == [
        (4096, False), (8192, False), (12288, False), (24576, True)
    ]  # fmt: skip
    assert "Qwen/Qwen2.5-1.5B" in gpp("estimate", "--models", GPP_TOKEN="").stdout

    # the estimator's refusal is the API's: exit 1 with its code and field
    wrong = gpp("estimate", "Qwen/Qwen2.5-1.5B", "--dtype", "fp3", "--json")
    assert wrong.code == 1
    assert wrong.error()["code"] == "validation_error"
    assert "weights_dtype" in wrong.error()["fields"]


def test_buy_charges_once_per_idempotency_key(gpp, owner, ops_user):
    grant(owner, ops_user)
    first = gpp("buy", "8", "--hours", "2", "--yes", "--json", "--idempotency-key", "k-1")
    assert first.code == 0, first.stderr
    bought = first.json()
    assert (bought["tier_name"], bought["hours"], bought["repeated"]) == ("8 GB", 2, False)
    again = gpp("buy", "8", "--hours", "2", "--yes", "--json", "--idempotency-key", "k-1")
    assert again.code == 0, again.stderr
    assert again.json()["id"] == bought["id"] and again.json()["repeated"] is True
    assert "nothing charged" in gpp("buy", "8GB", "--hours", "2", "--yes",
                                    "--idempotency-key", "k-1").stdout  # fmt: skip
    assert Purchase.objects.filter(tenant=owner.tenant).count() == 1
    owner.tenant.refresh_from_db()
    assert owner.tenant.credit_balance == Decimal("50.00") - Decimal(bought["price_paid"])

    # each invocation without a key is a new purchase
    other = gpp("buy", "4", "--hours", "1", "--yes", "--json")
    assert other.code == 0 and other.json()["id"] != bought["id"]
    assert other.json()["idempotency_key"].startswith("gpp-")
    assert Purchase.objects.filter(tenant=owner.tenant).count() == 2


def test_a_buy_whose_answer_is_lost_is_retried_with_its_key_and_charged_once(
    gpp, owner, ops_user, live_server
):
    grant(owner, ops_user)
    with LosingProxy(live_server.url, "POST", "/api/v1/purchases/") as proxy:
        done = gpp("buy", "4", "--hours", "3", "--yes", "--json", GPP_URL=proxy.url)
    assert done.code == 0, done.stderr
    assert "retrying" in done.stderr
    posts = [seen for seen in proxy.seen if seen[0] == "POST"]
    assert len(posts) == 2 and posts[0][2] == posts[1][2] != ""  # the same key, twice
    assert done.json()["repeated"] is True  # the server answered the retry with the first
    assert Purchase.objects.filter(tenant=owner.tenant).count() == 1
    assert LedgerEntry.objects.filter(tenant=owner.tenant, kind="purchase").count() == 1


def test_an_api_refusal_exits_1_with_its_code_and_message(gpp, owner):
    poor = gpp("buy", "24", "--hours", "5", "--yes")
    assert poor.code == 1
    assert "insufficient_credit" in poor.stderr
    as_json = gpp("buy", "24", "--hours", "5", "--yes", "--json")
    assert as_json.code == 1 and as_json.stdout == ""
    error = as_json.error()
    assert error["code"] == "insufficient_credit" and error["status"] == 409 and error["message"]
    missing = gpp("show", "424242", "--json")
    assert missing.code == 1 and missing.error()["code"] == "not_found"
    assert not Purchase.objects.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["buy", "8"],  # --hours is required
        ["buy", "8", "--hours", "0", "--yes"],
        ["stop", "7"],  # destructive, no terminal to ask on, no --yes
        ["terminate", "7"],
        ["show", "seven"],
        ["nonsense"],
        ["launch", "--image", "1", "--purchase", "1"],  # no model for the VRAM check
    ],
)
def test_usage_errors_exit_2_before_anything_is_sent(gpp, owner, argv):
    done = gpp(*argv)
    assert done.code == 2, (done.stdout, done.stderr)
    assert not Purchase.objects.exists()


def test_a_launch_file_with_an_unknown_key_is_a_usage_error(gpp, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("image: CUDA base\npurchase: 1\nmodel: Qwen/Qwen2.5-1.5B\ngpus: 8\n")
    done = gpp("launch", str(spec), "--json")
    assert done.code == 2
    assert "gpus" in done.error()["message"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_network_and_auth_failures_exit_3(gpp):
    refused = gpp("tiers", "--json", GPP_URL=f"http://127.0.0.1:{_closed_port()}")
    assert refused.code == 3
    assert refused.error()["code"] == "connection_failed"
    revoked = gpp("ps", GPP_TOKEN="gpp_not_a_real_token")
    assert revoked.code == 3 and "gpp login" in revoked.stderr
    nobody = gpp("tiers", GPP_TOKEN="")
    assert nobody.code == 3 and "not_logged_in" in nobody.stderr

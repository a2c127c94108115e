"""The estimate as the fit and launch pages show it (issue 13, "Tenant pages"): the smallest
tier that fits named as a tier with a link to buy it, one rounding rule for every MiB figure,
the breakdown once, suggestions the form can apply, a cheaper tier that would also fit, the
launch page when its only purchase is busy, errors next to the field that clear the verdict,
and a label on every field."""

import json
import math
import random
import re
from html.parser import HTMLParser

import pytest

import estimator
from estimator import EstimateRequest, model_from_catalog
from estimator.rounding import up_to_tenth, whole_mib, whole_terms
from estimator.verdict import fits_in_tier, usable_in_tier
from tenants import services
from tenants.forms.estimate import FitForm, error_field
from tenants.forms.slices import LaunchEstimateForm
from tenants.models import Image, Purchase, Role, Slice, Tier
from tenants.views.estimate import apply_values
from tests.factories import MembershipFactory
from tests.tenants.test_lifecycle_pages import (  # noqa: F401 (gpu, running: fixtures)
    SSH_KEY,
    gpu,
    launch_data,
    queued_slice,
    running,
)

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}
BIG = {  # Llama 3.1 8B in bf16: about 16.5 GiB, so only the 24 GB tier holds it
    "model": "meta-llama/Llama-3.1-8B",
    "workload": "inference",
    "weights_dtype": "bf16",
    "kv_cache_dtype": "bf16",
    "engine": "transformers",
    "batch": "1",
    "context_tokens": "4096",
    "method": "lora",
    "optimizer": "adamw",
}
SMALL = {**BIG, "model": "Qwen/Qwen2.5-0.5B", "context_tokens": "2048"}


# --- a small HTML reader: elements by id, their text and attributes ---------------------------

VOID = {"input", "br", "img", "meta", "link", "hr", "source", "col", "area", "wbr", "base"}


def _attrs(attrs) -> dict:
    """Attributes by name; a boolean one (`hidden`, `disabled`) is "" rather than None."""
    return {name: "" if value is None else value for name, value in attrs}


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[dict] = []
        self.elements: list[dict] = []

    def handle_starttag(self, tag, attrs):
        element = {"tag": tag, "attrs": _attrs(attrs), "text": []}
        self.elements.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag, attrs):
        self.elements.append({"tag": tag, "attrs": _attrs(attrs), "text": []})

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i]["tag"] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data):
        for element in self.stack:
            element["text"].append(data)


class Html:
    def __init__(self, text: str) -> None:
        reader = _Reader()
        reader.feed(text)
        self.raw = text
        self.elements = reader.elements

    def by_id(self, id_: str) -> dict | None:
        return next((e for e in self.elements if e["attrs"].get("id") == id_), None)

    def text(self, id_: str) -> str:
        element = self.by_id(id_)
        assert element is not None, f"no #{id_}"
        return " ".join("".join(element["text"]).split())

    def attr(self, id_: str, name: str) -> str | None:
        element = self.by_id(id_)
        assert element is not None, f"no #{id_}"
        return element["attrs"].get(name)

    def has(self, id_: str) -> bool:
        return self.by_id(id_) is not None

    def all(self, tag: str, **attrs: str) -> list[dict]:
        return [
            e
            for e in self.elements
            if e["tag"] == tag and all(e["attrs"].get(k) == v for k, v in attrs.items())
        ]

    def with_class(self, cls: str) -> list[dict]:
        return [e for e in self.elements if cls in (e["attrs"].get("class") or "").split()]


def page(response) -> Html:
    return Html(response.content.decode())


def tier(gb: int) -> Tier:
    return Tier.objects.get(vram_mb=gb * 1024)


def term_values(html: Html, prefix: str) -> tuple[list[int], int]:
    """The whole-MiB terms and the total of a breakdown table."""
    table = html.raw[html.raw.index(f'id="{prefix}-terms"') :]
    table = table[: table.index("</table>")]
    terms = [int(x) for x in re.findall(r'<td class="num">(-?\d+)</td>', table)]
    total = int(re.search(r'<th class="num">(-?\d+)</th>', table).group(1))
    return terms, total


@pytest.fixture
def image(ops_user) -> Image:
    return services.image_create(
        actor=ops_user, name="torch", reference="pytorch/pytorch:2.4.0", ports=[22]
    )


@pytest.fixture
def funded(owner_a, ops_user):
    services.credit_grant(tenant=owner_a.tenant, amount="100.00", actor=ops_user, memo="trial")
    owner_a.tenant.refresh_from_db()
    return owner_a


@pytest.fixture
def purchase(funded) -> Purchase:
    return services.purchase_create(membership=funded, tier=tier(8), hours=2)[0]


def estimate_partial(client, purchase, **job) -> Html:
    params = {"estimate": "1", **BIG, **job}
    if purchase is not None:
        params["purchase"] = purchase.pk
    response = client.get("/launch/", params, **HX)
    assert response.status_code == 200
    return page(response)


# --- one rounding rule --------------------------------------------------------------------


def test_whole_mib_rounds_up_and_the_dict_total_rounds_to_the_same_whole_number():
    assert whole_mib(16903.0) == 16903
    assert whole_mib(16903.1) == 16904
    assert whole_mib(None) is None
    assert up_to_tenth(16903.02) == 16903.1 and up_to_tenth(16903.0) == 16903.0
    rng = random.Random(13)
    for _ in range(2000):
        raw = rng.uniform(0, 200_000) if rng.random() < 0.5 else rng.randint(0, 9999) + 1e-9
        assert whole_mib(up_to_tenth(raw)) == math.ceil(raw), raw


def test_whole_terms_add_up_to_the_whole_total_each_within_one_mib():
    rng = random.Random(7)
    for _ in range(500):
        exact = [rng.uniform(0, 20_000) for _ in range(rng.randint(1, 9))]
        shown = [round(v, 1) for v in exact]  # as the estimate's dict carries them
        total = up_to_tenth(sum(exact))
        wholes = whole_terms(shown, total)
        assert sum(wholes) == whole_mib(total)
        assert all(abs(w - v) < 1.5 for w, v in zip(wholes, shown, strict=True))
    assert whole_terms([], 0) == []


@pytest.mark.parametrize(
    "model",
    ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-0.5B", "google/gemma-2-9b", "openai-community/gpt2"],
)
def test_every_estimate_dict_rounds_to_the_figure_the_launch_check_stores(model):
    result = estimator.estimate(
        estimator.EstimateRequest.from_mapping({"model": {"catalog": model}, "tier_mib": 4096})
    )
    data = result.to_dict()
    assert whole_mib(data["total_mib"]) == math.ceil(result.total_mib)
    for shown, exact in zip(data["suggestions"], result.suggestions, strict=True):
        assert whole_mib(shown["total_mib"]) == math.ceil(exact.total_mib)


def test_refusal_and_estimate_agree_on_one_figure_and_the_breakdown_appears_once(
    client, funded, purchase, image
):
    client.force_login(funded.user)
    response = client.post("/launch/", launch_data(purchase, image, **BIG))
    assert response.status_code == 422
    html = page(response)
    refused = Slice.objects.get(tenant=funded.tenant)
    message = html.text("refusal-message")
    assert f"about {refused.estimate_mb} MiB" in message
    assert html.text("estimate-total") == f"{refused.estimate_mb} MiB"
    assert f"{refused.estimate_mb} MiB needed" in html.text("estimate-verdict")
    terms, total = term_values(html, "estimate")
    assert total == refused.estimate_mb and sum(terms) == total
    # every MiB figure on the page is a whole number: no "16903.4" beside "about 16904"
    main = html.raw[html.raw.index("<main") : html.raw.index("</main>")]
    assert not re.search(r"\d+\.\d+ MiB", main)
    # the breakdown once, in the estimate panel; the refusal points to it
    assert html.raw.count('class="estimate-terms"') == 1
    assert html.raw.count("To make it fit") == 1
    assert not html.has("refusal-terms")


def test_fit_page_figures_agree_and_terms_add_up(client):
    html = page(client.get("/fit/", {**BIG, "tier_mib": 8192}))
    terms, total = term_values(html, "fit")
    assert sum(terms) == total
    assert html.text("fit-total") == f"{total} MiB"
    chart = json.loads(re.search(r'id="fit-chart-data"[^>]*>(.*?)</script>', html.raw).group(1))
    assert chart["mib"] == terms  # the chart draws the figures the table shows
    for li in re.findall(r"<li>(.*?)</li>", html.raw[html.raw.index('id="fit-suggestions"') :]):
        assert re.search(r": \d+ MiB", li), li  # suggestions in whole MiB too


# --- the smallest tier that fits, by name, with a link to buy it -----------------------------


def test_fit_names_the_smallest_fitting_tier_with_a_buy_link(client):
    html = page(client.get("/fit/", {**BIG, "tier_mib": 8192}, **HX))
    assert html.text("fit-verdict") == "Does not fit the 8 GB tier"
    assert html.text("fit-smallest") == "24 GB"
    assert html.attr("fit-buy-smallest", "href") == f"/buy/?tier={tier(24).pk}"
    assert "($1.00 / hour)" in html.text("fit-tier-advice")
    assert "MiB" not in html.text("fit-smallest")  # a tier, not a raw figure


def test_refusal_names_the_smallest_tier_with_a_buy_link(client, funded, purchase, image):
    client.force_login(funded.user)
    html = page(client.post("/launch/", launch_data(purchase, image, **BIG)))
    advice = html.text("refusal-tier")
    assert "24 GB" in advice and "($1.00 / hour)" in advice
    assert html.attr("refusal-buy", "href") == f"/buy/?tier={tier(24).pk}"
    assert html.text("estimate-smallest") == "24 GB"


def test_live_estimate_on_launch_names_the_tier_and_links_to_buy_it(client, funded, purchase):
    client.force_login(funded.user)
    html = estimate_partial(client, purchase)
    assert html.attr("estimate-panel", "data-fits") == "false"
    assert "Does not fit the tier (8 GB)" in html.text("estimate-verdict")
    assert html.text("estimate-smallest") == "24 GB"
    assert html.attr("estimate-buy-smallest", "href") == f"/buy/?tier={tier(24).pk}"


def test_buy_page_preselects_the_linked_tier(client, funded):
    client.force_login(funded.user)
    body = client.get(f"/buy/?tier={tier(24).pk}").content.decode()
    select = re.search(r'<select name="tier".*?</select>', body, re.S).group(0)
    assert re.search(rf'value="{tier(24).pk}"[^>]*selected', select)


def test_no_tier_holds_it_says_so(client):
    html = page(
        client.get("/fit/", {**BIG, "model": "meta-llama/Llama-3.1-70B", "tier_mib": 24576})
    )
    assert html.text("fit-smallest") == "No tier holds it"
    assert not html.has("fit-buy-smallest")


# --- a cheaper tier that would also fit ------------------------------------------------------


def test_fit_says_when_a_cheaper_tier_would_also_fit(client):
    html = page(client.get("/fit/", {**SMALL, "tier_mib": 24576}))
    assert html.text("fit-verdict") == "Fits the 24 GB tier"
    cheaper = html.text("fit-cheaper")
    assert "4 GB" in cheaper and "0.20 credits / hour ($0.20 / hour)" in cheaper
    assert "1.00 credit / hour ($1.00 / hour)" in cheaper  # the chosen tier's price beside it
    assert html.attr("fit-buy-cheaper", "href") == f"/buy/?tier={tier(4).pk}"
    # on the smallest tier that fits, nothing cheaper to say
    assert not page(client.get("/fit/", {**SMALL, "tier_mib": 4096})).has("fit-cheaper")
    # a job that does not fit: the smallest tier is named, no "cheaper" note
    assert not page(client.get("/fit/", {**BIG, "tier_mib": 8192})).has("fit-cheaper")


def test_launch_says_when_a_cheaper_tier_than_the_purchase_would_fit(client, funded):
    big = services.purchase_create(membership=funded, tier=tier(24), hours=1)[0]
    client.force_login(funded.user)
    html = estimate_partial(client, big, **SMALL)
    assert html.attr("estimate-panel", "data-fits") == "true"
    assert "4 GB" in html.text("estimate-cheaper") and "($0.20 / hour)" in html.text(
        "estimate-cheaper"
    )


# --- suggestions the form can apply ----------------------------------------------------------


def test_each_fitting_suggestion_has_an_apply_button_and_applying_it_fits(client):
    html = page(client.get("/fit/", {**BIG, "tier_mib": 8192}, **HX))
    buttons = html.with_class("apply-suggestion")
    items = re.findall(r"<li>(.*?)</li>", html.raw[html.raw.index('id="fit-suggestions"') :], re.S)
    fitting = [li for li in items if "fits</span>" in li]
    assert buttons and len(buttons) == len(fitting)
    assert all("apply-suggestion" not in li for li in items if "fits</span>" not in li)
    form_fields = set(FitForm().fields)
    for button in buttons:
        values = json.loads(button["attrs"]["data-apply"])
        assert values and set(values) <= form_fields
        params = {**BIG, "tier_mib": 8192}
        for name, value in values.items():
            if value is True:
                params[name] = "on"
            elif value is False:
                params.pop(name, None)
            else:
                params[name] = value
        again = page(client.get("/fit/", params, **HX))
        assert again.text("fit-verdict") == "Fits the 8 GB tier", values


def test_live_estimate_suggestions_apply_to_the_launch_form(client, funded, purchase):
    client.force_login(funded.user)
    html = estimate_partial(client, purchase)
    buttons = html.with_class("apply-suggestion")
    assert buttons
    values = json.loads(buttons[0]["attrs"]["data-apply"])
    again = estimate_partial(client, purchase, **values)
    assert again.attr("estimate-panel", "data-fits") == "true"


def test_training_suggestions_map_to_the_job_fields():
    form = FitForm()
    assert json.loads(apply_values({"micro_batch": 1, "seq_len": 1024}, form)) == {
        "batch": "1",
        "context_tokens": "1024",
    }
    assert json.loads(apply_values({"gradient_checkpointing": True}, form)) == {
        "gradient_checkpointing": True
    }
    assert json.loads(apply_values({"prefill_chunk": 512}, form)) == {"prefill_chunk": "512"}
    assert apply_values({"fused_attention": True}, form) is None  # no such field: no button


def test_training_suggestions_on_the_launch_form_apply_to_its_fields(client, funded, purchase):
    client.force_login(funded.user)
    job = {**BIG, "model": "Qwen/Qwen2.5-1.5B", "workload": "training", "method": "full"}
    html = estimate_partial(client, purchase, **job)
    assert html.attr("estimate-panel", "data-fits") == "false"
    applied = [json.loads(b["attrs"]["data-apply"]) for b in html.with_class("apply-suggestion")]
    assert applied, "a fitting change for a training job"
    names = set().union(*applied)
    assert names <= set(LaunchEstimateForm().fields)


# --- /launch/ when its only purchase is busy, and a Launch button that says why not -----------


@pytest.fixture(params=["queued", "provisioning", "running"])
def busy_slice(request, funded, purchase, image, django_capture_on_commit_callbacks):
    """The tenant's only purchase held by a slice waiting in line, placed, or running."""
    if request.param == "queued":
        return queued_slice(funded, purchase, image)
    if request.param == "provisioning":
        request.getfixturevalue("gpu")
        with django_capture_on_commit_callbacks(execute=False):  # no provisioning task
            slice, _ = services.slice_launch(
                membership=funded,
                purchase=purchase,
                image=image,
                model_request={"model": {"catalog": "Qwen/Qwen2.5-0.5B"}},
                ssh_public_key=SSH_KEY,
            )
        assert slice.state == Slice.State.PROVISIONING
        return slice
    return request.getfixturevalue("running")


def test_launch_with_the_only_purchase_in_use_links_to_its_slice(client, funded, busy_slice):
    slice, state = busy_slice, busy_slice.state
    client.force_login(funded.user)
    html = page(client.get("/launch/"))
    assert not html.has("no-purchase")
    notice = html.text("purchase-in-use")
    assert "in use by slice #" in notice and state in notice
    assert html.attr("in-use-slice", "href") == f"/slices/{slice.pk}/"
    assert html.attr("launch-submit", "disabled") is not None
    assert html.attr("launch-submit", "aria-describedby") == "launch-blocked"
    assert "running a slice" in html.text("launch-blocked")


def test_launch_without_any_purchase_or_image_is_disabled_with_reasons(client, funded):
    client.force_login(funded.user)
    html = page(client.get("/launch/"))
    assert html.has("no-purchase") and not html.has("purchase-in-use")
    assert html.attr("launch-submit", "disabled") is not None
    reason = html.text("launch-blocked")
    assert "No purchase with minutes left" in reason and "No image is on the allowlist" in reason


def test_launch_button_is_enabled_when_a_purchase_and_an_image_are_there(
    client, funded, purchase, image
):
    client.force_login(funded.user)
    html = page(client.get("/launch/"))
    assert html.attr("launch-submit", "disabled") is None and not html.has("launch-blocked")
    assert not html.has("purchase-in-use") and not html.has("no-purchase")


def test_a_second_free_purchase_means_no_busy_notice(client, funded, purchase, image):
    queued_slice(funded, purchase, image)
    services.purchase_create(membership=funded, tier=tier(4), hours=1)
    client.force_login(funded.user)
    html = page(client.get("/launch/"))
    assert not html.has("purchase-in-use") and html.attr("launch-submit", "disabled") is None


def test_all_purchases_in_use_lists_each_slice(client, funded, purchase, image):
    first = queued_slice(funded, purchase, image)
    other = services.purchase_create(membership=funded, tier=tier(4), hours=1)[0]
    second = queued_slice(funded, other, image)
    client.force_login(funded.user)
    html = page(client.get("/launch/"))
    notice = html.text("purchase-in-use")
    assert "All your purchases with minutes left are in use" in notice
    hrefs = {a["attrs"].get("href") for a in html.all("a")}
    assert {f"/slices/{first.pk}/", f"/slices/{second.pk}/"} <= hrefs


def test_a_viewer_sees_the_launch_button_disabled(client, funded, purchase, image):
    viewer = MembershipFactory(tenant=funded.tenant, role=Role.VIEWER)
    client.force_login(viewer.user)
    html = page(client.get("/launch/"))
    assert html.attr("launch-submit", "disabled") is not None
    assert "Viewers cannot launch" in html.text("launch-blocked")


# --- an invalid value: the error next to its field, and no verdict -----------------------------


def test_fit_context_minus_five_errors_next_to_the_field_and_clears_the_verdict(client):
    good = page(client.get("/fit/", {**BIG, "tier_mib": 24576}, **HX))
    assert good.has("fit-verdict")
    assert good.attr("id_context_tokens-error", "hidden") is not None  # the slot, empty
    bad = page(client.get("/fit/", {**BIG, "tier_mib": 24576, "context_tokens": "-5"}, **HX))
    assert not bad.has("fit-verdict") and not bad.has("fit-terms") and bad.has("fit-error")
    slot = bad.by_id("id_context_tokens-error")
    assert slot["attrs"].get("hx-swap-oob") == "true" and "hidden" not in slot["attrs"]
    assert "greater than or equal to 1" in bad.text("id_context_tokens-error")
    assert bad.attr("id_batch-error", "hidden") is not None  # the other slots cleared
    # without htmx, the whole page shows the error inside the field's label
    full = client.get("/fit/", {**BIG, "context_tokens": "-5"}).content.decode()
    label = re.search(r'<label for="id_context_tokens">.*?</label>', full, re.S).group(0)
    assert "greater than or equal to 1" in label and 'id="fit-verdict"' not in full


def test_fit_malformed_config_json_errors_next_to_that_field(client):
    bad = page(client.get("/fit/", {**BIG, "config_json": "{broken"}, **HX))
    assert not bad.has("fit-verdict")
    assert bad.text("id_config_json-error"), "the JSON error sits by the config field"
    assert bad.attr("id_model-error", "hidden") is not None


def test_fit_estimator_refusal_lands_on_the_field_it_names(client):
    job = {**BIG, "workload": "training", "method": "lora", "weights_dtype": "nf4"}
    bad = page(client.get("/fit/", job, **HX))
    assert not bad.has("fit-verdict")
    assert "QLoRA" in bad.text("id_weights_dtype-error")
    form = FitForm({})
    assert error_field(form, "model.config_json") == "config_json"
    assert error_field(form, "seq_len") == "context_tokens"
    assert error_field(form, "model.num_hidden_layers") == "model"
    assert error_field(form, "cuda_context_mib") is None


def test_launch_live_estimate_with_an_invalid_value_shows_the_error_and_no_verdict(
    client, funded, purchase
):
    client.force_login(funded.user)
    bad = estimate_partial(client, purchase, context_tokens="-5")
    assert bad.attr("estimate-panel", "data-fits") == ""
    assert not bad.has("estimate-body") and not bad.has("estimate-terms")
    assert "Nothing estimated" in bad.text("estimate-verdict")
    assert "greater than or equal to 1" in bad.text("id_context_tokens-error")
    good = estimate_partial(client, purchase)
    assert good.attr("id_context_tokens-error", "hidden") is not None


def test_launch_post_with_a_bad_value_shows_it_by_the_field_and_no_verdict(
    client, funded, purchase, image
):
    client.force_login(funded.user)
    response = client.post("/launch/", launch_data(purchase, image, context_tokens="-5"))
    assert response.status_code == 400
    html = page(response)
    assert "greater than or equal to 1" in html.text("id_context_tokens-error")
    assert html.attr("estimate-panel", "data-fits") == "" and not html.has("estimate-terms")


# --- every field has a label ------------------------------------------------------------------


def unlabelled(html: Html) -> list[str]:
    labelled = {e["attrs"].get("for") for e in html.all("label")}
    missing = []
    for element in html.elements:
        if element["tag"] not in ("input", "select", "textarea"):
            continue
        attrs = element["attrs"]
        if attrs.get("type") in ("hidden", "submit", "button"):
            continue
        if attrs.get("id") in labelled or attrs.get("aria-label"):
            continue
        missing.append(attrs.get("name") or attrs.get("id") or element["tag"])
    return missing


def test_every_field_on_fit_and_launch_has_a_label(client, funded, purchase, image):
    assert unlabelled(page(client.get("/fit/"))) == []
    client.force_login(funded.user)
    assert unlabelled(page(client.get("/launch/"))) == []
    # the label text is not empty either
    for label in page(client.get("/launch/")).all("label"):
        assert "".join(label["text"]).strip(), label


def test_launch_model_request_keeps_its_shape_when_the_new_fields_are_left_alone(
    client, funded, purchase, image
):
    client.force_login(funded.user)
    client.post("/launch/", launch_data(purchase, image))
    slice = Slice.objects.get(tenant=funded.tenant)
    assert set(slice.model_request) == {
        "model",
        "workload",
        "weights_dtype",
        "kv_cache_dtype",
        "engine",
        "batch",
        "context_tokens",
    }


def test_a_verdict_and_its_figures_follow_one_rule_at_the_usable_edge():
    """Whole MiB on both sides: a job fits when its figure (rounded up) is at most the usable
    figure (rounded down), so "7885 MiB needed, 7884 usable" never reads "fits"."""
    request = EstimateRequest(
        model=model_from_catalog("Qwen/Qwen2.5-0.5B"), engine="vllm", tier_mib=8192
    )
    usable, _ = usable_in_tier(request, 8192)
    assert usable == 7884
    for total in (7883.1, 7884.0, 7884.2, 7884.9, 7885.0):
        assert fits_in_tier(request, total, 8192) == (whole_mib(total) <= usable)

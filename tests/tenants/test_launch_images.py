"""The images each node holds (read at the preflight and by reconcile), what the launch
page and the API say of an image no node holds, and the model the launch page preselects."""

from __future__ import annotations

import json
import re

import pytest

import estimator
from nodes import services as node_services
from nodes.image_refs import node_holds, parse_image_ls
from nodes.models import Node
from tenants import services
from tenants.forms.estimate import DEFAULT_MODEL, model_for_tier
from tenants.models import Image

# `docker image ls --digests --no-trunc --format '{{json .}}'` as Docker 26 prints it
IMAGE_LS = "\n".join(
    json.dumps(row)
    for row in [
        {"Containers": "N/A", "Digest": "sha256:" + "a" * 64, "ID": "sha256:" + "1" * 64,
         "Repository": "busybox", "Tag": "1.36", "Size": "4.26MB"},
        {"Containers": "N/A", "Digest": "<none>", "ID": "sha256:" + "2" * 64,
         "Repository": "gpuplatform-lab/workload", "Tag": "latest", "Size": "9MB"},
        {"Containers": "N/A", "Digest": "sha256:" + "b" * 64, "ID": "sha256:" + "3" * 64,
         "Repository": "ghcr.io/acme/train", "Tag": "<none>", "Size": "1GB"},
        {"Containers": "N/A", "Digest": "<none>", "ID": "sha256:" + "4" * 64,
         "Repository": "<none>", "Tag": "<none>", "Size": "1MB"},
    ]
) + "\nnot json\n"  # fmt: skip


def test_the_listing_is_parsed_into_references() -> None:
    assert parse_image_ls(IMAGE_LS) == [
        "busybox:1.36",
        "busybox@sha256:" + "a" * 64,
        "ghcr.io/acme/train@sha256:" + "b" * 64,
        "gpuplatform-lab/workload:latest",
    ]


@pytest.mark.parametrize(
    ("reference", "held"),
    [
        ("busybox:1.36", True),
        ("docker.io/library/busybox:1.36", True),
        ("busybox:1.37", False),
        ("gpuplatform-lab/workload", True),  # :latest
        ("ghcr.io/acme/train:2@sha256:" + "b" * 64, True),  # the digest decides
        ("ghcr.io/acme/train:2", False),
        ("busybox:1.36@sha256:" + "c" * 64, False),
    ],
)
def test_a_node_holds_a_reference_by_tag_or_digest(reference: str, held: bool) -> None:
    assert node_holds(parse_image_ls(IMAGE_LS), reference) is held


# --- the fleet's images on the launch page and in the API ----------------------------------


@pytest.fixture
def held_and_missing(db):
    held = Image.objects.create(name="held", reference="acme/held:1", ports=[22], connect="ssh")
    missing = Image.objects.create(
        name="missing", reference="acme/missing:2", ports=[22], connect="ssh"
    )
    return held, missing


@pytest.mark.django_db(transaction=True)
def test_reconcile_records_the_images_and_the_launch_page_warns_of_a_pull(
    worker_fleet, owner_a, funded, held_and_missing, client, api_a, settings
):
    fleet = worker_fleet()
    row = fleet.registered[0]
    assert Node.objects.get(pk=row.pk).images_read_at is not None  # read at the preflight
    fleet.nodes[0].set_images(["acme/held:1"])
    services.slices_reconcile()
    node = Node.objects.get(pk=row.pk)
    assert "acme/held:1" in node.images and "acme/missing:2" not in node.images
    held, missing = held_and_missing
    funded(owner_a, vram_gb=8)
    client.force_login(owner_a.user)

    page = client.get("/launch/").content.decode()
    notes = re.search(r'<ul id="image-pull-notes".*?</ul>', page, re.S).group(0)
    assert f'data-image="{missing.pk}"' in notes and f'data-image="{held.pk}"' not in notes
    assert "missing (acme/missing:2) is on no node that takes slices now" in notes
    assert "whether nodes here can pull is not known" in notes

    settings.NODES_CAN_PULL = "no"
    page = client.get("/launch/").content.decode()
    assert "nodes here cannot pull images, so a launch of it would fail" in page

    body = api_a.get("/api/v1/images/").json()
    rows = {r["name"]: r for r in body["results"]}
    assert (rows["held"]["on_nodes"], rows["held"]["available"]) == (1, True)
    assert (rows["missing"]["on_nodes"], rows["missing"]["available"]) == (0, False)
    one = api_a.get(f"/api/v1/images/{missing.pk}/").json()
    assert one["on_nodes"] == 0 and one["available"] is False

    node_services.node_drain(node=node, reason="maintenance")  # takes no placements now
    rows = {r["name"]: r for r in api_a.get("/api/v1/images/").json()["results"]}
    assert rows["held"]["on_nodes"] == 0


# --- the model the launch page preselects ---------------------------------------------------


def _selected_model(page: str) -> str:
    select = re.search(r'<select name="model".*?</select>', page, re.S).group(0)
    return re.search(r'<option value="([^"]+)"[^>]*selected', select).group(1)


def _fits(model: str, tier_mib: int) -> bool:
    request = estimator.EstimateRequest.from_mapping(
        {
            "model": {"catalog": model},
            "workload": "inference",
            "weights_dtype": "bf16",
            "kv_cache_dtype": "bf16",
            "engine": "transformers",
            "batch": 1,
            "context_tokens": 4096,
            "tier_mib": tier_mib,
        }
    )
    return estimator.estimate(request, suggestions=False).fits


@pytest.mark.django_db
def test_the_launch_page_preselects_a_model_that_fits_the_only_purchase(
    owner_a, funded, image_ssh, client
):
    funded(owner_a, vram_gb=4)
    client.force_login(owner_a.user)
    page = client.get("/launch/").content.decode()
    chosen = _selected_model(page)
    assert chosen != DEFAULT_MODEL and not _fits(DEFAULT_MODEL, 4096)
    assert _fits(chosen, 4096), chosen
    assert 'id="estimate-panel"' in page
    assert "does not fit" not in page.lower().split('id="estimate-panel"', 1)[1][:3000]


@pytest.mark.django_db
def test_the_largest_purchase_and_a_model_for_it_are_preselected(
    owner_a, funded, image_ssh, client
):
    small = funded(owner_a, vram_gb=4)
    large = funded(owner_a, vram_gb=12)
    client.force_login(owner_a.user)
    page = client.get("/launch/").content.decode()
    select = re.search(r'<select name="purchase".*?</select>', page, re.S).group(0)
    assert f'value="{large.pk}" selected' in select
    assert _fits(_selected_model(page), 12 * 1024)
    # a purchase asked for keeps its own model
    page = client.get(f"/launch/?purchase={small.pk}").content.decode()
    assert _selected_model(page) == model_for_tier(4096)


@pytest.mark.django_db
def test_the_default_model_stays_where_it_fits_or_with_no_purchase(
    owner_a, funded, image_ssh, client
):
    client.force_login(owner_a.user)
    assert _selected_model(client.get("/launch/").content.decode()) == DEFAULT_MODEL
    funded(owner_a, vram_gb=24)
    assert _selected_model(client.get("/launch/").content.decode()) == DEFAULT_MODEL

"""`gpp launch --image` with a reference of one's own (docs/images.md): refused naming the
registry policy where no rule allows it, launched (pulled, run by digest) where one does;
an allowlisted image's name still picks its entry."""

from __future__ import annotations

import pytest

from tenants import services
from tenants.models import Slice

pytestmark = pytest.mark.django_db(transaction=True)

BROUGHT = "registry.acme.test:5000/team/tool:1"


def test_launch_sends_a_reference_and_the_policy_decides(gpp, owner, fleet, credit, ops_user):
    gpp("buy", "4", "--hours", "1", "--yes")
    argv = ("launch", "--image", BROUGHT, "--tier", "4", "--model", "Qwen/Qwen2.5-1.5B",
            "--context", "2048", "--wait", "--json")  # fmt: skip
    refused = gpp(*argv)
    assert refused.code == 1, refused.stdout
    error = refused.error()
    assert error["code"] == "image_not_allowed" and "no registry rule" in error["message"]
    assert not Slice.objects.exists()

    services.registry_rule_set(
        actor=ops_user, pattern="registry.acme.test:5000", mode="registry", reason="cli"
    )
    launched = gpp(*argv)
    assert launched.code == 0, launched.stderr
    slice = Slice.objects.get(pk=launched.json()["id"])
    assert slice.state == Slice.State.RUNNING and slice.image == BROUGHT
    assert slice.image_entry is None and slice.image_digest.startswith("sha256:")


def test_a_name_that_is_no_reference_is_still_an_unknown_image(gpp, owner, credit):
    gpp("buy", "4", "--hours", "1", "--yes")
    done = gpp("launch", "--image", "No such image", "--tier", "4", "--model",
               "Qwen/Qwen2.5-1.5B", "--json")  # fmt: skip
    assert done.code == 1 and done.error()["code"] == "unknown_image"

"""The slice page's IDE links: VS Code, Cursor and JetBrains Gateway open a slice whose
image runs an sshd through the host of the ~/.ssh/config block the page gives (its
ProxyJump goes through the gateway); a slice without an sshd gets none."""

from __future__ import annotations

import html
import re
import subprocess
from urllib.parse import parse_qs, urlsplit

import pytest

from nodes.models import Allocation, Gpu, Node
from tenants.models import Image, Purchase, Slice, Tier
from tenants.selectors import gateway_details

pytestmark = pytest.mark.django_db


def running(owner, image: Image, n: int) -> Slice:
    """A running slice of `image` whose connection is what provisioning stores: the
    gateway's details for the image's ports."""
    purchase = Purchase.objects.create(
        tenant=owner.tenant, tier=Tier.objects.get(vram_mb=4096), hours=1, price_paid=0,
        minutes_total=60, minutes_left=60,
    )  # fmt: skip
    node = Node.objects.create(
        gate_status="passed", name=f"n{n}", address=f"10.3.0.{n}", status="active"
    )
    gpu = Gpu.objects.create(node=node, uuid=f"GPU-{n}", index=0, model="x", vram_total_mb=24576)
    s = Slice.objects.create(
        tenant=owner.tenant, purchase=purchase, image=image.reference, image_entry=image,
        vram_mb=4096, state="running",
        allocation=Allocation.objects.create(gpu=gpu, vram_mb=4096, owner_key=f"slice-ide-{n}"),
    )  # fmt: skip
    s.connection = {
        "kind": image.connect,
        "host": node.address,
        "gateway": gateway_details(
            s.pk,
            image.ports,
            has_sshd=image.connect == Image.Connect.SSH,
            ssh_user=image.ssh_user,
        ),  # fmt: skip
    }
    s.save(update_fields=["connection"])
    return s


def links(page: str) -> dict[str, str]:
    return {
        ide: html.unescape(url)
        for url, ide in re.findall(r'<a href="([^"]+)"[^>]*data-ide="([a-z]+)"', page)
    }


def test_a_slice_with_an_sshd_offers_ide_links_through_its_config_blocks_host(
    client, owner_a, settings, tmp_path
):
    settings.GATEWAY_ADDRESS = "127.0.0.1:2222"
    image = Image.objects.create(
        name="ssh", reference="lab/ssh:1", ports=[22], connect="ssh", ssh_user="renter"
    )
    s = running(owner_a, image, 1)
    client.force_login(owner_a.user)
    page = client.get(f"/slices/{s.pk}/").content.decode()
    found = links(page)
    assert found == {
        "vscode": f"vscode://vscode-remote/ssh-remote+slice-{s.pk}/home/renter",
        "cursor": f"cursor://vscode-remote/ssh-remote+slice-{s.pk}/home/renter",
        "jetbrains": found["jetbrains"],
    }
    gateway = urlsplit(found["jetbrains"])
    assert (gateway.scheme, gateway.netloc) == ("jetbrains-gateway", "connect")
    assert parse_qs(gateway.fragment) == {
        "type": ["ssh"], "deploy": ["false"], "host": [f"slice-{s.pk}"], "port": ["22"],
        "user": ["renter"], "projectPath": ["/home/renter"],
    }  # fmt: skip
    # the host the links name is the config block's, as OpenSSH reads the block on the page
    block = html.unescape(re.search(r'<pre id="gateway-ssh-config">(.*?)</pre>', page, re.S)[1])
    config = tmp_path / "config"
    config.write_text(block)
    resolved = subprocess.run(  # noqa: S603
        ["ssh", "-F", str(config), "-G", f"slice-{s.pk}"],  # noqa: S607
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert "proxyjump gpp-gateway" in resolved and "user renter" in resolved
    # and a root login opens root's home
    root = Image.objects.create(name="ssh-root", reference="lab/r:1", ports=[22], connect="ssh")
    r = running(owner_a, root, 2)
    page = client.get(f"/slices/{r.pk}/").content.decode()
    assert links(page)["vscode"] == f"vscode://vscode-remote/ssh-remote+slice-{r.pk}/root"


def test_a_slice_without_an_sshd_offers_no_ide_links(client, owner_a, settings):
    settings.GATEWAY_ADDRESS = "127.0.0.1:2222"
    for n, (connect, ports) in enumerate((("service", [8000]), ("jupyter", [8888])), start=1):
        image = Image.objects.create(
            name=connect, reference=f"lab/{connect}:1", ports=ports, connect=connect
        )
        s = running(owner_a, image, n)
        client.force_login(owner_a.user)
        page = client.get(f"/slices/{s.pk}/").content.decode()
        assert 'id="gateway-connect"' in page  # the gateway's forwards are there
        assert 'id="slice-ide"' not in page and "vscode://" not in page, connect

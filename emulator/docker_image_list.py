"""`docker image ls` / `docker images` as Docker 26 answers it with `--format` (a Go
template per image, `{{json .}}` included), `--digests`, `--no-trunc` and `--quiet`;
without a format, the table of emulator.docker_queries.cmd_images. The images listed are
those the node holds: the ones its containers run and `NodeState.images` (None there
means any image can be pulled, which lists only the containers' images, as a real host
that pulls on demand holds only what it ran)."""

from __future__ import annotations

import hashlib

from . import gotemplate
from .docker_flags import SWITCH, VALUE, Flag, UsageError, parse_flags
from .docker_formats import image_id, image_ref
from .docker_queries import cmd_images
from .shell import Invocation
from .state import NodeState

SIZE = "8.52GB"
CREATED_AT = "2024-05-01 10:00:00 +0000 UTC"


def _row(ref: str, *, trunc: bool, digests: bool) -> dict[str, str]:
    """The fields docker's image formatter offers, as it prints them. An image pulled by
    digest ("repo:tag@sha256:...") is listed untagged under that digest."""
    name, at, pinned = ref.partition("@")
    repo, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "")
    if at:
        tag = "<none>"
    full = image_id(ref)
    digest = pinned or "sha256:" + hashlib.sha256(ref.encode()).hexdigest()
    return {
        "Containers": "N/A",
        "CreatedAt": CREATED_AT,
        "CreatedSince": "2 weeks ago",
        "Digest": digest if digests else "<none>",
        "ID": full[7:19] if trunc else full,
        "Repository": repo,
        "SharedSize": "N/A",
        "Size": SIZE,
        "Tag": tag,
        "UniqueSize": "N/A",
        "VirtualSize": SIZE,
    }


def cmd_image_ls(node: NodeState, inv: Invocation, args: list[str]) -> int:
    try:
        p = parse_flags(
            "images",
            args,
            [
                Flag(("all", "a"), SWITCH),
                Flag(("quiet", "q"), SWITCH),
                Flag(("no-trunc",), SWITCH),
                Flag(("digests",), SWITCH),
                Flag(("filter", "f"), VALUE),
                Flag(("format",), VALUE),
            ],
            interspersed=True,
        )
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status
    fmt = p.get("format") or ""
    if not fmt or fmt == "table" or p.has("quiet"):
        return cmd_images(node, inv, args)
    with node.lock:
        refs = sorted(
            {image_ref(c.image) for c in node.containers.values()}
            | {image_ref(i) for i in (node.images or set())}
        )
    template = gotemplate.unescape_format(fmt)
    for ref in refs:
        row = _row(ref, trunc=not p.has("no-trunc"), digests=p.has("digests"))
        inv.out(gotemplate.render(template, row) + "\n")
    return 0

"""The docker subcommands that read and change no container: ps (filters, --format, the
table), inspect, logs, port, info, version, images, image inspect, pull."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

from . import gotemplate
from .containers import Container
from .docker_flags import SWITCH, VALUE, Flag, Parsed, UsageError, parse_flags
from .docker_formats import (
    API_VERSION,
    DEFAULT_CMD,
    DOCKER_VERSION,
    IMAGE_PATH,
    PS_DEFAULT,
    PS_HEADERS,
    image_id,
    image_ref,
    info_doc,
    inspect_doc,
    no_such_container,
    ps_context,
    rfc3339,
    tabwrite,
)
from .shell import Invocation
from .state import NodeState

_PS_FLAGS = [
    Flag(("all", "a"), SWITCH),
    Flag(("quiet", "q"), SWITCH),
    Flag(("no-trunc",), SWITCH),
    Flag(("size", "s"), SWITCH),
    Flag(("latest", "l"), SWITCH),
    Flag(("last", "n"), VALUE),
    Flag(("filter", "f"), VALUE),
    Flag(("format",), VALUE),
]
_PS_FILTERS = ("label", "status", "name", "id", "ancestor", "exited")

PsRow = tuple[Container, dict[str, Any]]  # a container and its `ps` template context


def cmd_ps(node: NodeState, inv: Invocation, args: list[str]) -> int:
    try:
        p = parse_flags("ps", args, _PS_FLAGS, interspersed=True)
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status
    if p.positional:
        inv.err(
            "\"docker ps\" accepts no arguments.\nSee 'docker ps --help'.\n\n"
            "Usage:  docker ps [OPTIONS]\n\nList containers\n"
        )
        return 1
    filters: dict[str, list[str]] = {}
    for f in p.all("filter"):
        k, eq, v = f.partition("=")
        if not eq:
            inv.err("Error response from daemon: bad format of filter (expected name=value)\n")
            return 1
        if k not in _PS_FILTERS:
            inv.err(f"Error response from daemon: invalid filter '{k}'\n")
            return 1
        filters.setdefault(k, []).append(v)
    rows = _ps_rows(node, p, filters)
    fmt = p.get("format")
    if p.has("quiet") and not fmt:
        for _, ctx in rows:
            inv.out(ctx["ID"] + "\n")
        return 0
    return _ps_print(inv, fmt, rows)


def _ps_rows(node: NodeState, p: Parsed, filters: dict[str, list[str]]) -> list[PsRow]:
    """The containers to list, newest first, with their template contexts."""
    trunc = not p.has("no-trunc")
    with node.lock:
        node.refresh()
        now = node.clock.now()
        items = sorted(node.containers.values(), key=lambda c: c.created, reverse=True)
        show_all = p.has("all") or "status" in filters or "exited" in filters
        if not show_all:
            items = [c for c in items if c.running]
        items = [c for c in items if _matches(c, filters)]
        if p.has("latest"):
            items = items[:1]
        elif p.get("last"):
            items = items[: int(p.get("last") or 0)]
        return [(c, ps_context(c, now, trunc)) for c in items]


def _ps_print(inv: Invocation, fmt: str | None, rows: list[PsRow]) -> int:
    """The rows through --format: a table (docker's default), `json`, or a template."""
    if not fmt or fmt == "table":
        fmt = PS_DEFAULT
    if fmt == "json":
        fmt = "{{json .}}"
    fmt = gotemplate.unescape_format(fmt)
    try:
        if fmt.startswith("table"):
            body = fmt[len("table") :].lstrip()
            header = gotemplate.render(body, PS_HEADERS, {"Label": lambda k: "LABEL"})
            table = [header.split("\t")]
            for c, ctx in rows:
                table.append(gotemplate.render(body, ctx, _ps_methods(c)).split("\t"))
            inv.out(tabwrite(table))
        else:
            for c, ctx in rows:
                inv.out(gotemplate.render(fmt, ctx, _ps_methods(c)) + "\n")
    except gotemplate.TemplateError as e:
        inv.err(f"template parsing error: template: :1: {e}\n")
        return 64
    return 0


def _ps_methods(c: Container) -> dict[str, Any]:
    return {"Label": lambda key: c.labels.get(key, "")}


def _matches(c: Container, filters: dict[str, list[str]]) -> bool:
    """Docker's filter semantics: every `label` filter must hold (AND); several values
    of any other key are alternatives (OR)."""
    for k, values in filters.items():
        if k == "label":
            for v in values:
                lk, eq, lv = v.partition("=")
                if lk not in c.labels or (eq and c.labels[lk] != lv):
                    return False
            continue
        ok = False
        for v in values:
            if k == "status":
                ok = c.state == v
            elif k == "name":
                ok = re.search(v, c.name) is not None
            elif k == "id":
                ok = c.id.startswith(v)
            elif k == "ancestor":
                ok = image_ref(c.image) == image_ref(v)
            elif k == "exited":
                ok = c.status == "exited" and str(c.exit_code) == v
            if ok:
                break
        if not ok:
            return False
    return True


def cmd_inspect(node: NodeState, inv: Invocation, args: list[str]) -> int:
    try:
        p = parse_flags(
            "inspect",
            args,
            [Flag(("format", "f"), VALUE), Flag(("type",), VALUE), Flag(("size", "s"), SWITCH)],
            interspersed=True,
        )
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status
    if not p.positional:
        inv.err(
            "\"docker inspect\" requires at least 1 argument.\nSee 'docker inspect --help'.\n\n"
            "Usage:  docker inspect [OPTIONS] NAME|ID [NAME|ID...]\n\n"
            "Return low-level information on Docker objects\n"
        )
        return 1
    docs, missing = [], []
    with node.lock:
        node.refresh()
        for ref in p.positional:
            c = node.find_container(ref)
            if c is None:
                missing.append(ref)
            else:
                docs.append(inspect_doc(node, c))
    fmt = p.get("format")
    if fmt:
        fmt = gotemplate.unescape_format(fmt)
        try:
            for d in docs:
                inv.out(gotemplate.render(fmt, d) + "\n")
        except gotemplate.TemplateError as e:
            inv.err(f"template parsing error: template: :1: {e}\n")
            return 1
    else:
        inv.out(gotemplate.go_json(docs, indent=4) + "\n" if docs else "[]\n")
    for ref in missing:
        inv.err(f"Error: No such object: {ref}\n")
    return 1 if missing else 0


def cmd_logs(node: NodeState, inv: Invocation, args: list[str]) -> int:
    try:
        p = parse_flags(
            "logs",
            args,
            [
                Flag(("tail", "n"), VALUE),
                Flag(("timestamps", "t"), SWITCH),
                Flag(("follow", "f"), SWITCH),
                Flag(("since",), VALUE),
                Flag(("until",), VALUE),
                Flag(("details",), SWITCH),
            ],
            interspersed=True,
        )
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status
    if len(p.positional) != 1:
        inv.err(
            "\"docker logs\" requires exactly 1 argument.\nSee 'docker logs --help'.\n\n"
            "Usage:  docker logs [OPTIONS] CONTAINER\n\nFetch the logs of a container\n"
        )
        return 1
    with node.lock:
        node.refresh()
        c = node.find_container(p.positional[0])
        if c is None:
            no_such_container(inv, p.positional[0])
            return 1
        lines = list(c.logs)
    tail = p.get("tail", "all")
    if tail is not None and tail not in ("all", "-1"):
        try:
            n = int(tail)
        except ValueError:
            inv.err(f'invalid argument "{tail}" for "-n, --tail" flag\n')
            return 125
        lines = lines[-n:] if n > 0 else []
    since = p.get("since")
    if since:
        try:
            floor = _parse_since(since)
        except ValueError:
            inv.err(f'invalid value for "since": {since}\n')
            return 125
        lines = [line for line in lines if line[0] is not None and line[0] >= floor]
    for at, stream, text in lines:
        prefix = rfc3339(at) + " " if p.has("timestamps") else ""
        (inv.out if stream == "stdout" else inv.err)(prefix + text + "\n")
    return 0


def _parse_since(value: str) -> float:
    """docker's --since: an RFC 3339 time (what the platform sends) or Unix seconds."""
    if value.replace(".", "", 1).isdigit():
        return float(value)
    head, _, fraction = value.rstrip("Z").partition(".")
    moment = datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return moment.timestamp() + (float("0." + fraction) if fraction else 0.0)


def cmd_port(node: NodeState, inv: Invocation, args: list[str]) -> int:
    if not args:
        inv.err("\"docker port\" requires at least 1 argument.\nSee 'docker port --help'.\n")
        return 1
    with node.lock:
        node.refresh()
        c = node.find_container(args[0])
        if c is None:
            inv.err(f"Error: No such container: {args[0]}\n")
            return 1
        want = args[1] if len(args) > 1 else None
        if want and "/" not in want:
            want += "/tcp"
        found = False
        for cport, hip, hport in c.ports if c.running else []:
            if want and cport != want:
                continue
            found = True
            head = "" if want else f"{cport} -> "
            if hip in ("", "0.0.0.0"):  # noqa: S104 - text docker prints, not a bind
                inv.out(f"{head}0.0.0.0:{hport}\n{head}[::]:{hport}\n")
            else:
                inv.out(f"{head}{hip}:{hport}\n")
        if want and not found:
            inv.err(f"Error: No public port '{want}' published for {args[0]}\n")
            return 1
    return 0


def cmd_info(node: NodeState, inv: Invocation, args: list[str]) -> int:
    try:
        p = parse_flags("info", args, [Flag(("format", "f"), VALUE)], interspersed=True)
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status
    with node.lock:
        node.refresh()
        doc = info_doc(node)
    fmt = p.get("format")
    if fmt:
        if fmt == "json":
            fmt = "{{json .}}"
        try:
            inv.out(gotemplate.render(gotemplate.unescape_format(fmt), doc) + "\n")
        except gotemplate.TemplateError as e:
            inv.err(f"template parsing error: template: :1: {e}\n")
            return 1
        return 0
    inv.out(
        "Client: Docker Engine - Community\n Version:    "
        + DOCKER_VERSION
        + "\n Context:    default\n\n"
        "Server:\n"
        f" Containers: {doc['Containers']}\n  Running: {doc['ContainersRunning']}\n"
        f"  Paused: {doc['ContainersPaused']}\n"
        f"  Stopped: {doc['ContainersStopped']}\n Images: {doc['Images']}\n"
        f" Server Version: {DOCKER_VERSION}\n Storage Driver: overlay2\n Cgroup Driver: systemd\n"
        " Cgroup Version: 2\n Runtimes: io.containerd.runc.v2 nvidia runc\n Default Runtime: runc\n"
        f" Kernel Version: {doc['KernelVersion']}\n Operating System: {doc['OperatingSystem']}\n"
        f" Architecture: x86_64\n CPUs: 64\n Name: {node.name}\n"
    )
    return 0


def cmd_version(node: NodeState, inv: Invocation, args: list[str]) -> int:
    try:
        p = parse_flags("version", args, [Flag(("format", "f"), VALUE)], interspersed=True)
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status
    doc = {
        "Client": {
            "Version": DOCKER_VERSION,
            "ApiVersion": API_VERSION,
            "Os": "linux",
            "Arch": "amd64",
        },
        "Server": {
            "Version": DOCKER_VERSION,
            "ApiVersion": API_VERSION,
            "MinAPIVersion": "1.24",
            "Os": "linux",
            "Arch": "amd64",
            "KernelVersion": "5.15.0-105-generic",
        },
    }
    fmt = p.get("format")
    if fmt:
        inv.out(gotemplate.render(gotemplate.unescape_format(fmt), doc) + "\n")
        return 0
    inv.out(
        f"Client: Docker Engine - Community\n Version:           {DOCKER_VERSION}\n"
        f" API version:       {API_VERSION}\n\nServer: Docker Engine - Community\n Engine:\n"
        f"  Version:          {DOCKER_VERSION}\n"
        f"  API version:      {API_VERSION} (minimum version 1.24)\n"
    )
    return 0


def cmd_images(node: NodeState, inv: Invocation, args: list[str]) -> int:
    quiet = "-q" in args or "--quiet" in args
    with node.lock:
        images = sorted(
            {image_ref(c.image) for c in node.containers.values()}
            | {image_ref(i) for i in (node.images or set())}
        )
    rows = [["REPOSITORY", "TAG", "IMAGE ID", "CREATED", "SIZE"]]
    for ref in images:
        repo, _, tag = ref.rpartition(":")
        iid = image_id(ref)[7:19]
        if quiet:
            inv.out(iid + "\n")
        rows.append([repo, tag, iid, "2 weeks ago", "8.52GB"])
    if not quiet:
        inv.out(tabwrite(rows))
    return 0


def cmd_image_inspect(node: NodeState, inv: Invocation, args: list[str]) -> int:
    refs = [
        a
        for i, a in enumerate(args)
        if not a.startswith("-") and (i == 0 or args[i - 1] not in ("--format", "-f"))
    ]
    if not refs:
        inv.err('"docker image inspect" requires at least 1 argument.\n')
        return 1
    docs, status = [], 0
    with node.lock:
        present = None if node.images is None else {image_ref(i) for i in node.images}
        for raw in refs:
            ref = image_ref(raw)
            if present is not None and ref not in present:
                inv.err(f"Error response from daemon: No such image: {raw}\n")
                status = 1
                continue
            own = node.image_env.get(ref, node.image_env.get(raw, []))
            docs.append(
                {
                    "Id": image_id(ref),
                    "RepoTags": [ref],
                    "RepoDigests": [
                        f"{ref.rsplit(':', 1)[0]}@sha256:{hashlib.sha256(ref.encode()).hexdigest()}"
                    ],
                    "Config": {"Env": [IMAGE_PATH, *own], "Cmd": list(DEFAULT_CMD)},
                }
            )
    fmt = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--format", "-f")), None)
    if fmt:
        for doc in docs:
            inv.out(gotemplate.render(gotemplate.unescape_format(fmt), doc) + "\n")
    else:
        inv.out(json.dumps(docs, indent=4) + "\n")
    return status


def cmd_pull(node: NodeState, inv: Invocation, args: list[str]) -> int:
    refs = [a for a in args if not a.startswith("-")]
    if len(refs) != 1:
        inv.err("\"docker pull\" requires exactly 1 argument.\nSee 'docker pull --help'.\n")
        return 1
    ref = image_ref(refs[0])
    with node.lock:
        if node.images is not None and ref not in {image_ref(i) for i in node.images}:
            repo = ref.rsplit(":", 1)[0]
            inv.err(
                f"Error response from daemon: pull access denied for {repo}, repository does "
                "not exist or may require 'docker login': denied: requested access to the "
                "resource is denied\n"
            )
            return 1
    tag = ref.rsplit(":", 1)[1]
    digest = hashlib.sha256(ref.encode()).hexdigest()
    inv.out(
        f"{tag}: Pulling from {ref.rsplit(':', 1)[0]}\nDigest: sha256:{digest}\n"
        f"Status: Image is up to date for {ref}\n"
        f"{ref if '/' in ref else 'docker.io/library/' + ref}\n"
    )
    return 0

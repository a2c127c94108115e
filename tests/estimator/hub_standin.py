"""A small stand-in of the Hugging Face Hub on loopback, for the estimator's Hub reader.

It answers what huggingface_hub asks, as the Hub does:

- ``GET /api/models/{repo_id}/revision/{revision}`` (``?blobs=true``): the model's JSON
  (``id``, ``sha``, ``gated``, ``siblings`` with ``rfilename``, ``size``, ``lfs``);
  404 ``X-Error-Code: RepoNotFound`` / ``RevisionNotFound`` otherwise;
- ``HEAD`` and ``GET /{repo_id}/resolve/{revision}/{filename}``: ``X-Repo-Commit``,
  ``ETag``, ``Content-Length`` (and ``X-Linked-Size`` / ``X-Linked-Etag`` for LFS files),
  ``Accept-Ranges: bytes``; a ``Range: bytes=a-b`` answers 206 with ``Content-Range``, 416
  when it starts past the end; 404 ``EntryNotFound`` for a missing file, 401 ``GatedRepo``
  for a gated repository's files without an accepted token.

Repositories are the JSON descriptions in ``fixtures/hub/`` (see its README.md), or ones a
test adds. Safetensors headers are real; the data section is virtual (zeros on a range
request, never materialised) and a whole-file GET of weights answers 500, so a test fails
if anything downloads weights. Every request is logged (method, path, headers).
"""

from __future__ import annotations

import copy
import hashlib
import json
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from django.core.cache import cache

FIXTURES = Path(__file__).resolve().parent / "fixtures"
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
               "F8_E8M0": 1}  # fmt: skip
INDEX = "model.safetensors.index.json"


@dataclass
class Served:
    """One file of a repository: its bytes (or a header and a virtual size)."""

    data: bytes  # the whole file, or a safetensors file's length prefix + header
    size: int  # the file's size (past len(data): zeros)
    lfs: bool = False

    @property
    def etag(self) -> str:
        return hashlib.sha256(self.data + str(self.size).encode()).hexdigest()


@dataclass
class Repo:
    repo_id: str
    commit: str
    refs: dict[str, str]
    gated: bool | str
    files: dict[str, Served]


def expand_tensors(description: dict[str, Any]) -> list[tuple[str, str, list[int]]]:
    """The description's tensors in order, {layer} and {expert} names repeated."""
    layers = int(description.get("layers", 0))
    experts = int(description.get("experts", 0))
    entries = description["tensors"]
    out: list[tuple[str, str, list[int]]] = []
    i = 0
    while i < len(entries):
        if "{layer}" not in entries[i]["name"]:
            e = entries[i]
            out.append((e["name"], e["dtype"], list(e["shape"])))
            i += 1
            continue
        block = []
        while i < len(entries) and "{layer}" in entries[i]["name"]:
            block.append(entries[i])
            i += 1
        for layer in range(layers):
            for e in block:
                for expert in range(experts if "{expert}" in e["name"] else 1):
                    name = e["name"].replace("{layer}", str(layer)).replace("{expert}", str(expert))
                    out.append((name, e["dtype"], list(e["shape"])))
    return out


def _nbytes(dtype: str, shape: list[int]) -> int:
    n = DTYPE_BYTES[dtype]
    for d in shape:
        n *= d
    return n


def safetensors_file(
    tensors: list[tuple[str, str, list[int]]], declared_length: int | None = None
) -> Served:
    """A real safetensors header over a virtual data section."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in tensors:
        size = _nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads the header to 8 bytes
    length = declared_length if declared_length is not None else len(text)
    prefix = struct.pack("<Q", length) + text
    return Served(prefix, 8 + len(text) + offset, lfs=True)


def _split(tensors: list[tuple[str, str, list[int]]], shards: int) -> list[list]:
    total = sum(_nbytes(d, s) for _, d, s in tensors)
    target = total / shards
    parts: list[list] = [[]]
    done = 0
    for tensor in tensors:
        if done >= target * len(parts) and len(parts) < shards:
            parts.append([])
        parts[-1].append(tensor)
        done += _nbytes(tensor[1], tensor[2])
    return parts


def build_repo(description: dict[str, Any]) -> Repo:
    """A served repository from its JSON description."""
    files: dict[str, Served] = {}
    if "config" in description:
        config = json.loads((FIXTURES / "configs" / description["config"]).read_text())
        config.update(description.get("config_overrides") or {})
        files["config.json"] = Served(json.dumps(config, indent=2).encode(), 0)
    tensors = expand_tensors(description) if description.get("tensors") else []
    shards = int(description.get("shards", 1))
    declared = description.get("declared_header_length")
    if tensors and shards == 1:
        files["model.safetensors"] = safetensors_file(tensors, declared)
    elif tensors:
        weight_map = {}
        total = 0
        for k, part in enumerate(_split(tensors, shards), 1):
            name = f"model-{k:05d}-of-{shards:05d}.safetensors"
            files[name] = safetensors_file(part, declared)
            total += sum(_nbytes(d, s) for _, d, s in part)
            weight_map.update({t[0]: name for t in part})
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        files[INDEX] = Served(json.dumps(index, indent=2).encode(), 0)
    for served in files.values():
        served.size = served.size or len(served.data)
    commit = description["commit"]
    return Repo(
        repo_id=description["repo_id"],
        commit=commit,
        refs={"main": commit, **(description.get("refs") or {})},
        gated=description.get("gated", False),
        files=files,
    )


def load_description(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / "hub" / f"{name}.json").read_text())


@dataclass
class HubStandIn:
    """The stand-in's state: repositories, accepted tokens, delays, and the request log."""

    repos: dict[str, Repo] = field(default_factory=dict)
    tokens: set[str] = field(default_factory=set)
    delay_s: float = 0.0  # every answer waits this long (a slow Hub)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, description: dict[str, Any]) -> Repo:
        repo = build_repo(copy.deepcopy(description))
        self.repos[repo.repo_id] = repo
        return repo

    def add_fixtures(self) -> None:
        for path in sorted((FIXTURES / "hub").glob("*.json")):
            self.add(json.loads(path.read_text()))

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.requests]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    # -- routing -----------------------------------------------------------------------------

    def _answer(self, *, head: bool) -> None:
        hub = self.server.hub
        with hub.lock:
            hub.requests.append(
                (self.command, self.path, {k.title(): v for k, v in self.headers.items()})
            )
        if hub.delay_s:
            time.sleep(hub.delay_s)
        path = urlsplit(self.path).path
        if path.startswith("/api/models/") and "/revision/" in path:
            repo_id, _, revision = path[len("/api/models/") :].partition("/revision/")
            return self._model_info(unquote(repo_id), unquote(revision), head=head)
        if "/resolve/" in path:
            repo_id, _, rest = path.lstrip("/").partition("/resolve/")
            revision, _, filename = rest.partition("/")
            return self._resolve(unquote(repo_id), unquote(revision), unquote(filename), head=head)
        return self._error(404, "RepoNotFound", "Not found", head=head)

    def _repo(self, repo_id: str, revision: str, *, head: bool) -> tuple[Repo, str] | None:
        repo = self.server.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found", head=head)
            return None
        commit = repo.refs.get(revision) or (revision if revision == repo.commit else None)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head=head)
            return None
        return repo, commit

    def _model_info(self, repo_id: str, revision: str, *, head: bool) -> None:
        found = self._repo(repo_id, revision, head=head)
        if found is None:
            return
        repo, commit = found
        siblings = []
        for name, served in sorted(repo.files.items()):
            sibling: dict[str, Any] = {"rfilename": name, "size": served.size}
            if served.lfs:
                sibling["lfs"] = {"sha256": served.etag, "size": served.size, "pointerSize": 135}
            siblings.append(sibling)
        body = {
            "_id": hashlib.sha256(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.partition("/")[0],
            "sha": commit,
            "private": False,
            "gated": repo.gated,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "library_name": "transformers",
            "tags": ["safetensors"],
            "lastModified": "2025-01-01T00:00:00.000Z",
            "createdAt": "2024-07-18T00:00:00.000Z",
            "siblings": siblings,
        }
        self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)

    def _resolve(self, repo_id: str, revision: str, filename: str, *, head: bool) -> None:
        found = self._repo(repo_id, revision, head=head)
        if found is None:
            return
        repo, commit = found
        if repo.gated and not self._authorized():
            message = f"Access to model {repo_id} is restricted. You must have access to it "
            return self._error(401, "GatedRepo", message + "and be authenticated.", head=head)
        served = repo.files.get(filename)
        if served is None:
            return self._error(404, "EntryNotFound", "Entry not found", head=head, commit=commit)
        headers = {
            "X-Repo-Commit": commit,
            "ETag": f'"{served.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if served.lfs:
            headers.update({"X-Linked-Size": str(served.size), "X-Linked-Etag": f'"{served.etag}"'})
        wanted = self.headers.get("Range")
        if wanted is None:
            if served.lfs and not head:
                return self._error(500, "StandIn", "the stand-in never serves weights", head=head)
            return self._send(200, served.data, headers, head, length=served.size)
        return self._range(served, wanted, headers, head)

    def _range(self, served: Served, wanted: str, headers: dict[str, str], head: bool) -> None:
        unit, _, spec = wanted.partition("=")
        first_text, _, last_text = spec.partition("-")
        first = int(first_text)
        last = min(int(last_text) if last_text else served.size - 1, served.size - 1)
        if unit.strip() != "bytes" or first >= served.size or first > last:
            headers["Content-Range"] = f"bytes */{served.size}"
            return self._send(416, b"", headers, head)
        chunk = served.data[first : last + 1]
        chunk += bytes(last + 1 - first - len(chunk))  # the virtual data section: zeros
        headers["Content-Range"] = f"bytes {first}-{last}/{served.size}"
        return self._send(206, chunk, headers, head)

    def _authorized(self) -> bool:
        auth = self.headers.get("Authorization") or ""
        return auth.startswith("Bearer ") and auth[7:] in self.server.hub.tokens

    # -- answers ------------------------------------------------------------------------------

    def _error(
        self, status: int, code: str, message: str, *, head: bool, commit: str | None = None
    ) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message}
        headers["Content-Type"] = "application/json"
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(status, json.dumps({"error": message}).encode(), headers, head)

    def _send(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str],
        head: bool,
        length: int | None = None,
    ) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if not head:
            self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hub: HubStandIn


def start(hub: HubStandIn) -> _Server:
    """Serve ``hub`` on 127.0.0.1 at a free port, in a daemon thread; sets ``hub.url``."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.hub = hub
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, name="hub-standin", daemon=True).start()
    return server


# -- pytest fixtures (import them into a test module to use them) ------------------------------

TOKEN = "hf_standin_secret_token_7c1d"


@pytest.fixture(scope="session")
def hub_server() -> Iterator[HubStandIn]:
    state = HubStandIn()
    server = start(state)
    yield state
    server.shutdown()


@pytest.fixture
def hub(hub_server: HubStandIn, settings: Any) -> HubStandIn:
    """The stand-in with the fixture repositories, an empty log, no delay, the platform
    pointed at it (no token, 5 s per request) and an empty cache."""
    hub_server.repos.clear()
    hub_server.add_fixtures()
    hub_server.requests.clear()
    hub_server.tokens = {TOKEN}
    hub_server.delay_s = 0.0
    settings.HF_ENDPOINT = hub_server.url
    settings.HF_TOKEN = ""
    settings.HF_HUB_TIMEOUT = 5.0
    cache.clear()
    return hub_server

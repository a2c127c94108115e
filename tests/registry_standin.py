"""A tiny container registry for tests: the read side of the Docker Registry HTTP API v2
(`/v2/`, manifests and blobs by tag or digest, GET and HEAD), serving images exported
with `docker save` from a lab node's own dockerd, on loopback (dockerd treats
127.0.0.0/8 registries as insecure, so plain HTTP works), with HTTP basic auth per
repository for the private-image case. Nothing is pushed: a test names what it serves.

    registry = RegistryStandIn().start()
    tar = registry.work / "http.tar"; node.docker("save", "-o", str(tar), HTTP_IMAGE)
    registry.serve_saved(tar, "renter/web", "1")
    registry.serve_saved(tar, "renter/preload", "1", env=["LD_PRELOAD=/evil.so"])
    registry.serve_saved(tar, "renter/secret", "1", users={"alice": "s3cret"})
    f"{registry.host}/renter/web:1" is then pullable by any dockerd on this machine.

Layers are served gzip-compressed (deterministically: the same bytes every time) under
the schema 2 media types; the image configuration can be changed per repository (its
environment, exposed ports, user), which makes another image with another digest.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import tarfile
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_V1 = "application/vnd.docker.container.image.v1+json"
LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"

_PATH_RE = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Repository:
    """What one repository serves: its tags' manifests, and who may read it (no users:
    anyone)."""

    tags: dict[str, str] = field(default_factory=dict)  # tag -> manifest digest
    users: dict[str, str] = field(default_factory=dict)  # user -> password


class RegistryStandIn:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}  # digest -> bytes (manifests, configs, layers)
        self.repos: dict[str, Repository] = {}
        # what was asked: (method, repository, kind, reference, user or "") per request
        self.requests: list[tuple[str, str, str, str, str]] = []
        self.refused: Counter[str] = Counter()  # repository -> requests answered 401
        self.challenges = 0  # version checks answered 401 (a client with no login stops there)
        self._lock = threading.Lock()
        self._tmp = tempfile.TemporaryDirectory(prefix="gpp-registry-")
        self.work = Path(self._tmp.name)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- serving
    def start(self) -> RegistryStandIn:
        handler = type("Handler", (_Handler,), {"registry": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="registry-standin", daemon=True
        )
        self._thread.start()
        return self

    @property
    def host(self) -> str:
        """The registry part of a reference: 127.0.0.1:<port>."""
        assert self._server is not None, "start() first"
        return f"127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._tmp.cleanup()

    def __enter__(self) -> RegistryStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what it serves
    def serve_saved(
        self,
        saved: Path,
        repository: str,
        tag: str,
        *,
        env: list[str] | None = None,
        exposed_ports: list[int] | None = None,
        user: str | None = None,
        users: dict[str, str] | None = None,
    ) -> str:
        """Serve the (first) image of a `docker save` tarball as repository:tag; `env`
        entries are added to its configuration's Env, `exposed_ports` replace its
        ExposedPorts, `user` its User. Returns the manifest digest."""
        with tarfile.open(saved) as tar:
            index = json.loads(_member(tar, "manifest.json"))
            first = index[0]
            config = json.loads(_member(tar, first["Config"]))
            layers = [_member(tar, name) for name in first["Layers"]]
        inner = config.setdefault("config", {})
        if env:
            inner["Env"] = [*(inner.get("Env") or []), *env]
        if exposed_ports is not None:
            inner["ExposedPorts"] = {f"{p}/tcp": {} for p in exposed_ports}
        if user is not None:
            inner["User"] = user
        config_bytes = json.dumps(config, sort_keys=True).encode()
        compressed = [gzip.compress(layer, mtime=0) for layer in layers]
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_V2,
            "config": {
                "mediaType": CONFIG_V1,
                "size": len(config_bytes),
                "digest": self._blob(config_bytes),
            },
            "layers": [
                {"mediaType": LAYER_GZIP, "size": len(blob), "digest": self._blob(blob)}
                for blob in compressed
            ],
        }
        digest = self._blob(json.dumps(manifest, indent=3).encode())
        with self._lock:
            repo = self.repos.setdefault(repository, Repository())
            repo.tags[tag] = digest
            if users:
                repo.users.update(users)
        return digest

    def _blob(self, data: bytes) -> str:
        digest = _digest(data)
        with self._lock:
            self.blobs[digest] = data
        return digest

    def manifest_reads(self, repository: str, *, user: str | None = None) -> int:
        """Manifest requests for the repository that were answered (by `user` only, when
        given)."""
        with self._lock:
            return sum(
                1
                for method, repo, kind, _, who in self.requests
                if repo == repository and kind == "manifests" and (user is None or who == user)
            )


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    handle = tar.extractfile(name)
    if handle is None:
        raise ValueError(f"{name} is not a file in the saved image")
    return handle.read()


class _Handler(BaseHTTPRequestHandler):
    registry: RegistryStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass  # quiet: the test reads `requests`

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        registry = self.registry
        if self.path.rstrip("/") == "/v2":
            # the API's version check, where a client learns how to authenticate: a
            # challenge while some repository is private and nothing was presented (as a
            # registry with basic auth answers); an anonymous client then asks anyway
            with registry._lock:
                private = any(repo.users for repo in registry.repos.values())
            if private and not self.headers.get("Authorization"):
                with registry._lock:
                    registry.challenges += 1
                return self._unauthorized(body=body)
            return self._send(200, b"{}", "application/json", body=body)
        match = _PATH_RE.match(self.path.split("?", 1)[0])
        if match is None:
            return self._error(404, "NAME_UNKNOWN", "no such path", body=body)
        name, kind, ref = match["name"], match["kind"], match["ref"]
        with registry._lock:
            repo = registry.repos.get(name)
        if repo is None:
            return self._error(404, "NAME_UNKNOWN", "repository name not known", body=body)
        user = self._user(repo)
        if user is None:
            with registry._lock:
                registry.refused[name] += 1
            return self._unauthorized(body=body)
        if kind == "manifests":
            digest = ref if ref.startswith("sha256:") else repo.tags.get(ref, "")
            if ref.startswith("sha256:") and ref not in repo.tags.values():
                digest = ""
            if not digest:
                return self._error(404, "MANIFEST_UNKNOWN", "manifest unknown", body=body)
            with registry._lock:
                registry.requests.append((self.command, name, kind, ref, user))
            data = registry.blobs[digest]
            return self._send(200, data, MANIFEST_V2, body=body, digest=digest)
        with registry._lock:
            data_or_none = registry.blobs.get(ref)
            registry.requests.append((self.command, name, kind, ref, user))
        if data_or_none is None:
            return self._error(404, "BLOB_UNKNOWN", "blob unknown", body=body)
        return self._send(200, data_or_none, "application/octet-stream", body=body, digest=ref)

    def _user(self, repo: Repository) -> str | None:
        """Who asks ("" for anyone on an open repository), or None when refused."""
        if not repo.users:
            return ""
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return user if repo.users.get(user) == password and password else None

    def _unauthorized(self, *, body: bool) -> None:
        data = json.dumps(
            {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]}
        ).encode()
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="registry-standin"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str, *, body: bool) -> None:
        data = json.dumps({"errors": [{"code": code, "message": message}]}).encode()
        self._send(status, data, "application/json", body=body)

    def _send(
        self, status: int, data: bytes, content_type: str, *, body: bool, digest: str = ""
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()
        if body:
            self.wfile.write(data)

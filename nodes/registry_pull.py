"""Pulling an image a renter brought (on no allowlist), as argv lists. Pure Python: no
Django.

Each start pulls with the launching tenant's own registry login, or with none, never
with whatever login the node's own Docker configuration holds: a per-start Docker config
directory (`docker --config DIR`, one per start under a directory only its owner may
enter, 0700) whose config.json is written from stdin (the login is never in an argv, an
environment variable or a shell), removed right after the pull.

The pull asks by tag first: dockerd asks the registry for a tag at every pull, with the
login given, even when it holds the image already (a pull by digest it holds is
answered from its own store, asking no one). That is the authorisation: a tenant whose
login does not read the repository is refused there, whatever the node holds. The start
then runs the image by the digest (`repo@sha256:...`) that pull resolved, or that the
slice's first start resolved (pulled again by digest, in the same repository, with the
same login), so a tag moved meanwhile, or retagged on the node by another tenant's pull,
changes nothing that runs."""

from __future__ import annotations

import base64
import json
import posixpath
import re
import secrets
from dataclasses import dataclass

from .image_refs import DOCKER_HUB
from .runtime import check_image

DIRECTORY = "/var/lib/gpuplatform/pull-auth"
CONFIG_FILE = "config.json"
MAX_PORTS = 8  # the ports a brought image's configuration declares that a slice keeps
# the key the docker CLI looks Docker Hub's login up by; other registries by host[:port]
_HUB_KEY = "https://index.docker.io/v1/"
_OWNER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,100}$")
_DIR_RE = re.compile(
    rf"^{re.escape(DIRECTORY)}/[A-Za-z0-9][A-Za-z0-9_.:-]{{0,100}}-[0-9a-f]{{16}}$"
)
_DIGEST_LINE_RE = re.compile(r"^Digest: (sha256:[0-9a-f]{64})\s*$", re.MULTILINE)


@dataclass(frozen=True)
class RegistryLogin:
    """A tenant's login to one registry, unsealed for one start."""

    registry: str
    username: str
    password: str

    def __repr__(self) -> str:  # never in a log or a traceback
        return f"RegistryLogin(registry={self.registry!r}, ...)"


@dataclass(frozen=True)
class BroughtImage:
    """A brought image as a start runs it: by digest, with the ports it declares."""

    reference: str  # name@sha256:...
    digest: str
    ports: tuple[int, ...]


def config_dir_for(owner_key: str) -> str:
    """A new directory for one start's Docker configuration."""
    if not isinstance(owner_key, str) or not _OWNER_RE.fullmatch(owner_key):
        raise ValueError(f"owner_key is not acceptable for a pull directory: {owner_key!r}")
    return posixpath.join(DIRECTORY, f"{owner_key}-{secrets.token_hex(8)}")


def check_dir(path: object) -> str:
    if not isinstance(path, str) or not _DIR_RE.fullmatch(path):
        raise ValueError(f"not a pull directory: {path!r}")
    return path


def directory_argvs(path: str) -> list[list[str]]:
    """The directory of all starts' pull configurations, then this start's, each its
    owner's only."""
    return [
        ["install", "-d", "-m", "0700", DIRECTORY],
        ["install", "-d", "-m", "0700", check_dir(path)],
    ]


def config_write_argv(path: str) -> list[str]:
    """Write the Docker configuration given on stdin into the start's directory."""
    return ["install", "-m", "0600", "/dev/stdin", posixpath.join(check_dir(path), CONFIG_FILE)]


def remove_argv(path: str) -> list[str]:
    return ["rm", "-rf", "--", check_dir(path)]


def config_json(registry: str = "", username: str = "", password: str = "") -> bytes:
    """A Docker config.json holding one registry login, or none at all (`{"auths": {}}`:
    an anonymous pull, whatever the node's own configuration holds)."""
    auths: dict[str, dict[str, str]] = {}
    if registry and (username or password):
        key = _HUB_KEY if registry == DOCKER_HUB else registry
        token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
        auths[key] = {"auth": token}
    return json.dumps({"auths": auths}).encode()


def pull_argv(config_dir: str, reference: str) -> list[str]:
    """`docker pull` under the start's own configuration (not --quiet: the digest it
    resolved is on its `Digest:` line)."""
    return ["docker", "--config", check_dir(config_dir), "pull", "--", check_image(reference)]


def pulled_digest(output: str) -> str:
    """The manifest digest a pull resolved ("" when its output names none)."""
    found = _DIGEST_LINE_RE.findall(output or "")
    return found[-1] if found else ""

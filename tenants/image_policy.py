"""Which images renters may bring (images on no allowlist): ops' registry rules, each a
pattern and a mode, and the one rule that decides for a reference. Pure Python: no Django
(the rules live in tenants.models.RegistryRule; docs/images.md says it for people).

A pattern names, from widest to narrowest:

    *                          every image
    ghcr.io                    every image of one registry (host, or host:port)
    ghcr.io/acme/*             every repository under a path
    docker.io/library/python   one repository

The narrowest pattern that matches a reference decides; a reference no rule matches is
"allowlist only", as before registry rules existed. A mode says what a match allows:

- allowlist: only allowlisted images (a narrower rule that closes part of a wider one);
- registry:  any image from here, on any node that takes slices (a registry ops trust);
- any:       any image from here, only on nodes whose node agent runs (an image's own
             files reach the toolkit's hooks: CVE-2025-23267, CVE-2026-24260).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from nodes.image_refs import DOCKER_HUB, ReferenceParts, is_registry_host, reference_parts

ALLOWLIST = "allowlist"
REGISTRY = "registry"
ANY = "any"
MODES = (ALLOWLIST, REGISTRY, ANY)
MODE_WORDS = {
    ALLOWLIST: "allowlist only",
    REGISTRY: "any image from here",
    ANY: "any image, on nodes whose agent runs",
}
EVERYTHING = "*"
MAX_PATTERN = 255

_PATTERN_HELP = (
    "A pattern is *, a registry (ghcr.io, 127.0.0.1:5000), a path under one ending in /* "
    "(ghcr.io/acme/*), or one repository (docker.io/library/python)."
)
_COMPONENT_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789._-")
_HOST_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789.-:[]")


class Rule(NamedTuple):
    pattern: str
    mode: str


class Decision(NamedTuple):
    """What the policy says of a reference: its mode and the rule that said it ("" when
    no rule matched: allowlist only)."""

    mode: str
    pattern: str = ""

    @property
    def allows(self) -> bool:
        return self.mode in (REGISTRY, ANY)

    @property
    def needs_agent(self) -> bool:
        return self.mode == ANY


def clean_pattern(text: object) -> str:
    """A pattern as ops typed it, normalised (registry lower case, a Docker Hub repository
    under library/ when it names no user); ValueError with the grammar otherwise."""
    pattern = str(text or "").strip()
    if pattern == EVERYTHING:
        return pattern
    if not pattern or len(pattern) > MAX_PATTERN or " " in pattern:
        raise ValueError(_PATTERN_HELP)
    host, slash, path = pattern.partition("/")
    host = host.lower()
    if not is_registry_host(host) or not set(host) <= _HOST_CHARS or host.startswith((".", "-")):
        raise ValueError(
            "Start with the registry (docker.io, ghcr.io, 127.0.0.1:5000). " + _PATTERN_HELP
        )
    if host in ("index.docker.io", "registry-1.docker.io"):
        host = DOCKER_HUB
    if not slash:
        return host
    wide = path.endswith("/*") or path == "*"
    parts = (
        path[:-2].split("/") if path.endswith("/*") else ([] if path == "*" else path.split("/"))
    )
    if any(not p or not set(p) <= _COMPONENT_CHARS for p in parts) or "*" in "/".join(parts):
        raise ValueError(_PATTERN_HELP)
    if path == "*":
        return host  # ghcr.io/* is the registry
    if host == DOCKER_HUB and not wide and len(parts) == 1:
        parts = ["library", *parts]
    return f"{host}/{'/'.join(parts)}" + ("/*" if wide else "")


def matches(pattern: str, parts: ReferenceParts) -> bool:
    if pattern == EVERYTHING:
        return True
    if "/" not in pattern:
        return parts.registry == pattern
    if pattern.endswith("/*"):
        return parts.full_name.startswith(pattern[:-1])
    return parts.full_name == pattern


def _narrowness(pattern: str) -> tuple[int, int]:
    """How narrow a pattern is: one repository, then the deepest path, then a registry,
    then everything."""
    if pattern == EVERYTHING:
        return (0, 0)
    if "/" not in pattern:
        return (1, 0)
    if pattern.endswith("/*"):
        return (2, pattern.count("/"))
    return (3, 0)


def decide(rules: Iterable[Rule | tuple[str, str]], reference: str) -> Decision:
    """The narrowest rule matching `reference` decides; none: allowlist only."""
    parts = reference_parts(reference)
    found = [Rule(*r) for r in rules if matches(r[0], parts)]
    if not found:
        return Decision(ALLOWLIST)
    rule = max(found, key=lambda r: _narrowness(r.pattern))
    return Decision(rule.mode if rule.mode in MODES else ALLOWLIST, rule.pattern)


def refusal(reference: str, decision: Decision) -> str:
    """Why a reference on no allowlist may not be launched, naming the policy."""
    registry = reference_parts(reference).registry
    if decision.pattern:
        return (
            f"{reference} is on no allowlist, and the registry policy's rule "
            f"'{decision.pattern}' allows only allowlisted images there: launch one of the "
            "allowlist (GET /images/), or ask ops to allow the registry."
        )
    return (
        f"{reference} is on no allowlist, and no registry rule lets renters bring images "
        f"from {registry}: only allowlisted images run (GET /images/); ops set the registry "
        "policy."
    )


def clean_registry(text: object) -> str:
    """A registry as a login names it: host or host:port (docker.io for Docker Hub)."""
    registry = str(text or "").strip().lower().removeprefix("https://").rstrip("/")
    if registry in ("index.docker.io/v1", "index.docker.io/v1/"):
        registry = DOCKER_HUB
    try:
        cleaned = clean_pattern(registry)
    except ValueError:
        cleaned = ""
    if not cleaned or "/" in cleaned or cleaned == EVERYTHING:
        raise ValueError(
            "A registry is its host, or host:port: docker.io, ghcr.io, 127.0.0.1:5000."
        )
    return cleaned

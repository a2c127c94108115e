"""SSH keys for the emulator: persistent Ed25519 host keys, authorized public keys,
OpenSSH-style fingerprints and known_hosts lines."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import os
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
)


def new_ed25519_pem() -> str:
    """A fresh Ed25519 private key in OpenSSH PEM format."""
    key = ed25519.Ed25519PrivateKey.generate()
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()


def generate_ed25519() -> paramiko.Ed25519Key:
    """A fresh Ed25519 key as a paramiko key (client keys in tests and benchmarks)."""
    return paramiko.Ed25519Key(file_obj=io.StringIO(new_ed25519_pem()))


def public_line(key: paramiko.PKey, comment: str = "") -> str:
    """`ssh-ed25519 AAAA... comment` (authorized_keys format)."""
    line = f"{key.get_name()} {key.get_base64()}"
    return f"{line} {comment}" if comment else line


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's `SHA256:...` fingerprint."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_line(host: str, port: int, key: paramiko.PKey) -> str:
    target = host if port == 22 else f"[{host}]:{port}"
    return f"{target} {key.get_name()} {key.get_base64()}"


def load_or_create_host_key(path: Path) -> paramiko.PKey:
    """The node's host key, created on first use and kept across restarts."""
    if path.exists():
        return paramiko.Ed25519Key(filename=str(path))
    return write_new_host_key(path)


def write_new_host_key(path: Path) -> paramiko.PKey:
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = new_ed25519_pem()
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(pem)
    os.replace(tmp, path)
    key = paramiko.Ed25519Key(file_obj=io.StringIO(pem))
    path.with_name(path.name + ".pub").write_text(
        public_line(key, f"emulator@{path.parent.name}") + "\n"
    )
    return key


def parse_authorized_keys(lines: list[str] | str) -> set[bytes]:
    """The key blobs of OpenSSH authorized_keys lines (options prefixes and comments allowed)."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    blobs: set[bytes] = set()
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        for k, f in enumerate(fields[:-1]):
            if f in _KEY_TYPES:
                with contextlib.suppress(binascii.Error, ValueError):
                    blobs.add(base64.b64decode(fields[k + 1], validate=True))
                break
    return blobs


class AuthorizedKeys:
    """A fixed set of keys plus, optionally, a file re-read when it changes."""

    def __init__(self, keys: list[str] | None = None, files: list[Path] | None = None):
        self._static = parse_authorized_keys(list(keys or []))
        self._files = [Path(f) for f in files or []]
        self._cache: dict[Path, tuple[float, set[bytes]]] = {}

    def add(self, line: str) -> None:
        self._static |= parse_authorized_keys([line])

    def blobs(self) -> set[bytes]:
        out = set(self._static)
        for f in self._files:
            try:
                mtime = f.stat().st_mtime
            except OSError:
                continue
            cached = self._cache.get(f)
            if cached is None or cached[0] != mtime:
                cached = (mtime, parse_authorized_keys(f.read_text()))
                self._cache[f] = cached
            out |= cached[1]
        return out

    def allows(self, key: paramiko.PKey) -> bool:
        return key.asbytes() in self.blobs()

    def __bool__(self) -> bool:
        return bool(self.blobs())

"""A slice's own SSH host key: made once by the platform, given to every run's container,
so a resumed slice answers with the key a renter already pinned. Pure: no Django.

The private half is OpenSSH's own format (what `ssh-keygen` writes and sshd reads); the
public half is one OpenSSH public key line without a comment; the fingerprint is written as
`ssh-keygen -l` prints it (`SHA256:` and the unpadded base64 of the key blob's SHA-256)."""

from __future__ import annotations

import base64
import binascii
import hashlib

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

KEY_TYPE = "ssh-ed25519"


def host_key_make() -> tuple[str, str]:
    """A new Ed25519 host key: (the private key in OpenSSH format, the public key line)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.OpenSSH,
        encryption_algorithm=serialization.NoEncryption(),
    ).decode("ascii")
    public = (
        key.public_key()
        .public_bytes(
            encoding=serialization.Encoding.OpenSSH,
            format=serialization.PublicFormat.OpenSSH,
        )
        .decode("ascii")
    )
    return private, public


def _blob(public_line: str) -> bytes | None:
    parts = public_line.split()
    if len(parts) < 2 or parts[0] != KEY_TYPE:
        return None
    try:
        return base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        return None


def host_key_fingerprint(public_line: str) -> str:
    """`SHA256:...` as `ssh-keygen -l` prints it; "" for no key or an unreadable one."""
    blob = _blob(public_line or "")
    if blob is None:
        return ""
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")
    return f"SHA256:{digest}"


def host_key_known_hosts_line(alias: str, public_line: str) -> str:
    """The known_hosts line that pins `public_line` for the host called `alias`; "" when
    there is no usable key."""
    if _blob(public_line or "") is None:
        return ""
    key_type, data = public_line.split()[:2]
    return f"{alias} {key_type} {data}"

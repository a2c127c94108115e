"""Reading a pasted OpenSSH public key: one line, decoded and checked (type, whole, strong
enough), and its fingerprint as OpenSSH prints it. No query and no write: a refusal is a
ServiceError on `public_key` naming what is wrong. Adding the key is
`tenants.services.keys`."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from gpuplatform.errors import ServiceError

from .models import SshKey

# A 16384-bit RSA key is under 3,000 characters: anything far longer is a pasted file.
SSH_PUBLIC_KEY_MAX_CHARS = 8192
RSA_MIN_BITS = 2048
COMMENT_MAX = 200

ACCEPTED_TYPES = tuple(SshKey.KeyType.values)
# What an OpenSSH key type looks like, accepted or not (ssh-dss, certificates, ...): such
# a paste is a key of the wrong kind, not garbage, and the answer says which kinds work.
_KEY_TYPE_SHAPE = re.compile(r"(ssh|ecdsa|sk|rsa)-[a-z0-9@.+-]+")
_PRIVATE_MARKERS = ("PRIVATE KEY", "PuTTY-User-Key-File")
_ACCEPTED_HINT = (
    "ssh-ed25519 (ssh-keygen -t ed25519), ecdsa-sha2-nistp256/384/521, ssh-rsa of at "
    "least 2048 bits, or a security key (sk-ssh-ed25519@openssh.com, "
    "sk-ecdsa-sha2-nistp256@openssh.com)"
)
_EXAMPLE = "'ssh-ed25519 AAAA… you@laptop'"


@dataclass(frozen=True)
class ParsedKey:
    key_type: str
    public_key: str  # "<type> <base64>", the base64 re-encoded from the decoded blob
    comment: str
    fingerprint: str  # OpenSSH's SHA256 form, as `ssh-keygen -l` prints it


def _refuse(message: str, code: str = "invalid_public_key") -> ServiceError:
    return ServiceError(message, code=code, field="public_key")


def _blob_type(blob: bytes) -> str:
    """The key type the blob itself names (its first SSH string)."""
    if len(blob) < 4:
        return ""
    (length,) = struct.unpack(">I", blob[:4])
    return blob[4 : 4 + length].decode("ascii", "replace")


def ssh_fingerprint(blob: bytes) -> str:
    """OpenSSH's SHA256 fingerprint of a key blob: SHA256:<base64, unpadded>."""
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def ssh_public_key_parse(text: str) -> ParsedKey:
    """One OpenSSH public key line (`<type> <base64> [comment]`), checked by decoding the
    key itself; a ServiceError on `public_key` naming what is wrong otherwise."""
    parts = _one_key_line(text if isinstance(text, str) else "").split()
    key_type = _accepted_type(parts[0])
    if len(parts) < 2:
        raise _refuse("The key itself is missing after its type.")
    blob = _key_blob(key_type, parts[1])
    comment = " ".join(parts[2:])[:COMMENT_MAX]
    return ParsedKey(
        key_type=key_type,
        public_key=f"{key_type} {base64.b64encode(blob).decode()}",
        comment=comment,
        fingerprint=ssh_fingerprint(blob),
    )


def _one_key_line(text: str) -> str:
    """The one line of a paste that looks like one public key, refusing anything else
    (a private key, a whole file, nothing, the SSH2 format, several keys) by name."""
    if "\x00" in text:
        raise _refuse("A public key is text without NUL characters.")
    if any(marker in text for marker in _PRIVATE_MARKERS):
        raise _refuse(
            "This is a private key; paste the .pub file instead (e.g. ~/.ssh/id_ed25519.pub). "
            "Nothing was stored; keep the private key to yourself.",
            code="private_key",
        )
    if len(text) > SSH_PUBLIC_KEY_MAX_CHARS:
        raise _refuse(
            f"Ensure this field has no more than {SSH_PUBLIC_KEY_MAX_CHARS} characters: "
            "paste one public key line.",
            code="max_length",
        )
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        raise _refuse("Paste your public key, e.g. " + _EXAMPLE + ".", code="required")
    if "BEGIN SSH2 PUBLIC KEY" in lines[0]:
        raise _refuse(
            "This is an SSH2 (RFC 4716) key: convert it to one OpenSSH line with "
            "`ssh-keygen -i -f <file>` and paste that."
        )
    words = [word for line in lines for word in line.split()]
    if sum(1 for w in words if w in ACCEPTED_TYPES) > 1:
        raise _refuse("That is several keys: add them one at a time.")
    if len(lines) > 1:
        raise _refuse("Paste one line: " + _EXAMPLE + ".")
    return lines[0]


def _accepted_type(key_type: str) -> str:
    """The line's key type when it is one accepted here; a key of another kind is told
    which kinds work."""
    if key_type not in ACCEPTED_TYPES:
        if _KEY_TYPE_SHAPE.fullmatch(key_type):
            raise _refuse(
                f"Keys of type {key_type[:64]} are not accepted: use {_ACCEPTED_HINT}.",
                code="unsupported_key_type",
            )
        raise _refuse(
            "Not an OpenSSH public key: expected one line like " + _EXAMPLE + " "
            "(the contents of your .pub file, with no options in front)."
        )
    return key_type


def _key_blob(key_type: str, encoded: str) -> bytes:
    """The decoded key, when it is whole, of the type its line names, and strong enough."""
    damaged = "The key is damaged or cut short: copy the whole line of the .pub file."
    try:
        blob = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise _refuse(damaged) from None
    if _blob_type(blob) != key_type:
        raise _refuse(damaged)
    try:
        key = serialization.load_ssh_public_key(f"{key_type} {encoded}".encode())
    except (ValueError, UnsupportedAlgorithm, NotImplementedError):
        # NotImplementedError: an ECDSA point in compressed form, which SSH never sends
        raise _refuse(damaged) from None
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < RSA_MIN_BITS:
        raise _refuse(
            f"This RSA key has {key.key_size} bits; at least {RSA_MIN_BITS} are needed. "
            "Better: make an Ed25519 key (ssh-keygen -t ed25519).",
            code="weak_key",
        )
    return blob

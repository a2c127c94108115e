"""SSH keys people sign in to the gateway with: read a pasted public key, add, remove,
and the gateway's note of each key's last use.

A key is the person's, not the tenant's: the gateway finds the person by the key's
fingerprint and decides from their membership what they may reach. So one key belongs
to one account (the fingerprint is unique across users), and removing it shuts that
person out at once (the gateway re-checks open streams against it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import re
import struct
import unicodedata
from dataclasses import dataclass

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpuplatform.errors import Conflict, NotAllowed, ServiceError

from ..locks import ssh_key_lock, ssh_keys_owner_lock
from ..models import Membership, SshKey
from .notify import audit_event_record

MAX_SSH_KEYS_PER_USER = 50
SSH_KEY_NAME_MAX = 64
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


def _clean_name(name: str) -> str:
    name = (name if isinstance(name, str) else "").strip()
    if not name:
        raise ServiceError("Give the key a name, e.g. laptop.", code="required", field="name")
    if len(name) > SSH_KEY_NAME_MAX:
        raise ServiceError(
            f"Ensure this field has no more than {SSH_KEY_NAME_MAX} characters.",
            code="max_length",
            field="name",
        )
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in name):
        raise ServiceError("A name is one line of plain text.", code="invalid", field="name")
    return name


def _duplicate(existing: SshKey, user: User) -> Conflict:
    if existing.user_id == user.pk:
        message = f"You already added this key, as {existing.name!r}."
    else:
        # Never who: only that the key is taken, so a key signs in one person.
        message = (
            "This key is registered to another account. A key identifies one person at "
            "the gateway: make a new key pair for this account (ssh-keygen -t ed25519)."
        )
    return Conflict(message, code="duplicate_key", field="public_key")


def _key_summary(key: SshKey) -> dict[str, object]:
    return {
        "ssh_key_id": key.pk,
        "name": key.name,
        "type": key.key_type,
        "fingerprint": key.fingerprint,
    }


@transaction.atomic
def ssh_key_add(*, user: User, name: str, public_key: str) -> SshKey:
    """Register a public key on `user`'s account; nothing is stored unless all is well."""
    name = _clean_name(name)
    parsed = ssh_public_key_parse(public_key)
    membership = Membership.objects.select_related("tenant").filter(user=user).first()
    if membership is None and not user.is_staff:
        raise NotAllowed("Join or create a tenant before adding SSH keys.", code="no_tenant")
    if membership is not None and not membership.tenant.is_active:
        raise NotAllowed("This tenant is suspended: no new SSH keys.", code="tenant_suspended")
    ssh_keys_owner_lock(user.pk)
    existing = SshKey.objects.filter(fingerprint=parsed.fingerprint).first()
    if existing is not None:
        raise _duplicate(existing, user)
    if SshKey.objects.filter(user=user).count() >= MAX_SSH_KEYS_PER_USER:
        raise Conflict(
            f"An account holds at most {MAX_SSH_KEYS_PER_USER} SSH keys: remove one first.",
            code="too_many_keys",
        )
    try:
        with transaction.atomic():
            key = SshKey.objects.create(
                user=user,
                name=name,
                key_type=parsed.key_type,
                public_key=parsed.public_key,
                comment=parsed.comment,
                fingerprint=parsed.fingerprint,
            )
    except IntegrityError:  # another account registered it between the check and here
        existing = SshKey.objects.filter(fingerprint=parsed.fingerprint).first()
        raise (
            _duplicate(existing, user)
            if existing
            else Conflict("This key is already registered.", code="duplicate_key")
        ) from None
    if membership is not None:
        audit_event_record(
            tenant=membership.tenant,
            actor=user,
            action="ssh_key.added",
            summary=f"{user.email} added SSH key {name!r} ({key.fingerprint})",
            data=_key_summary(key),
        )
    return key


@transaction.atomic
def ssh_key_remove(*, user: User, key_id: int) -> bool:
    """Remove one of `user`'s keys; False when there is none by that id (another user's,
    or already removed: removing twice is harmless)."""
    key = ssh_key_lock(key_id, user_id=user.pk)
    if key is None:
        return False
    summary = _key_summary(key)
    key_name = key.name
    key.delete()
    membership = Membership.objects.select_related("tenant").filter(user=user).first()
    if membership is not None:
        audit_event_record(
            tenant=membership.tenant,
            actor=user,
            action="ssh_key.removed",
            summary=f"{user.email} removed SSH key {key_name!r} ({summary['fingerprint']})",
            data=summary,
        )
    return True


def _address(address: str | None) -> str | None:
    """The IP address alone (an IPv6 zone dropped), or None when it is not one."""
    if not address:
        return None
    try:
        return str(ipaddress.ip_address(str(address).split("%", 1)[0]))
    except ValueError:
        return None


@transaction.atomic
def ssh_key_touch(*, key_id: int, address: str | None) -> bool:
    """The gateway's note that the key just signed someone in from `address` (an IP
    address; anything else is recorded as unknown). False when the key is gone."""
    updated = SshKey.objects.filter(pk=key_id).update(
        last_used_at=timezone.now(), last_used_address=_address(address)
    )
    return updated == 1

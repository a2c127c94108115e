"""Real SSH key material for the SSH key tests: fresh public key lines of every type the
gateway takes (security keys built by hand: making one needs the hardware), and private
keys in the forms people paste by mistake."""

from __future__ import annotations

import base64
import os
import struct

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

_CURVES = {
    "ecdsa-sha2-nistp256": ec.SECP256R1,
    "ecdsa-sha2-nistp384": ec.SECP384R1,
    "ecdsa-sha2-nistp521": ec.SECP521R1,
}


def _ssh_string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _openssh_line(private) -> str:
    return (
        private.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def public_line(key_type: str = "ssh-ed25519", *, comment: str = "", bits: int = 2048) -> str:
    """A fresh, valid public key line of `key_type` (with `comment` when given)."""
    if key_type == "ssh-ed25519":
        line = _openssh_line(ed25519.Ed25519PrivateKey.generate())
    elif key_type in _CURVES:
        line = _openssh_line(ec.generate_private_key(_CURVES[key_type]()))
    elif key_type == "ssh-rsa":
        line = _openssh_line(rsa.generate_private_key(public_exponent=65537, key_size=bits))
    elif key_type == "sk-ssh-ed25519@openssh.com":
        blob = _ssh_string(key_type.encode()) + _ssh_string(os.urandom(32)) + _ssh_string(b"ssh:")
        line = f"{key_type} {base64.b64encode(blob).decode()}"
    elif key_type == "sk-ecdsa-sha2-nistp256@openssh.com":
        point = (
            ec.generate_private_key(ec.SECP256R1())
            .public_key()
            .public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
        )
        blob = (
            _ssh_string(key_type.encode())
            + _ssh_string(b"nistp256")
            + _ssh_string(point)
            + _ssh_string(b"ssh:")
        )
        line = f"{key_type} {base64.b64encode(blob).decode()}"
    else:
        raise ValueError(key_type)
    return f"{line} {comment}" if comment else line


def ecdsa_compressed_line() -> str:
    """An ecdsa-sha2-nistp256 line whose point is compressed, which SSH never sends."""
    point = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint)
    )
    key_type = b"ecdsa-sha2-nistp256"
    blob = _ssh_string(key_type) + _ssh_string(b"nistp256") + _ssh_string(point)
    return f"{key_type.decode()} {base64.b64encode(blob).decode()}"


def private_pastes() -> dict[str, str]:
    """Private keys as they are pasted by mistake: OpenSSH, PEM, PKCS#8, PuTTY."""
    ed = ed25519.Ed25519PrivateKey.generate()
    rs = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    none = serialization.NoEncryption()
    return {
        "openssh": ed.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, none
        ).decode(),
        "rsa-pem": rs.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, none
        ).decode(),
        "pkcs8": ed.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, none
        ).decode(),
        "putty": "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: me\n"
        "Public-Lines: 2\nAAAAC3NzaC1lZDI1NTE5AAAAI\nPrivate-Lines: 1\nAAAAIE\n",
    }

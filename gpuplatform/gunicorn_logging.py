"""gunicorn access log without secrets in URLs (invitation and password-reset links)."""

import re
from datetime import timedelta
from typing import Any

from gunicorn.glogging import Logger  # type: ignore[import-untyped]  # gunicorn ships no types

SECRET_PATHS = re.compile(
    r"(/invitations/|/accounts/reset/[^/\s]+/)"  # the prefix stays
    r"(?!accept/|set-password/)[^/\s?]+"  # the secret goes
)


def redact(text: str) -> str:
    return SECRET_PATHS.sub(r"\1[redacted]", text)


class RedactingLogger(Logger):
    """`--logger-class gpuplatform.gunicorn_logging.RedactingLogger`."""

    def atoms(
        self, resp: Any, req: Any, environ: dict[str, Any], request_time: timedelta
    ) -> dict[str, Any]:
        # resp and req: gunicorn's own HTTP objects (untyped); the atoms are its log fields.
        atoms = super().atoms(resp, req, environ, request_time)
        for key in ("r", "U", "{raw_uri}e"):
            if isinstance(atoms.get(key), str):
                atoms[key] = redact(atoms[key])
        return atoms

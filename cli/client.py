"""The REST API as `gpp` calls it: token auth, the API's one error shape turned into
exceptions with stable exit codes, pages followed, and retries that never repeat a
purchase or a launch (their Idempotency-Key is kept across the retries)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import requests
from urllib3.exceptions import NewConnectionError

from cli import __version__

API_PREFIX = "/api/v1"
CONNECT_TIMEOUT_S = 10.0
# A launch answers once the VRAM is reserved; on a busy platform that can take a while.
READ_TIMEOUT_S = 120.0
RETRY_DELAYS_S = (0.5, 1.5)  # two retries after the first try
MAX_RETRY_AFTER_S = 10.0  # a throttled call waits this long at most before it gives up
PAGE_SIZE = 200  # the API's largest page

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


@dataclass
class CliError(Exception):
    """What went wrong, as the API (or gpp itself) names it: `code` for programs,
    `message` for people, `fields` per input field, `body` the whole answer if any."""

    code: str
    message: str
    exit_code: int = EXIT_REFUSED
    status: int | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    # What may help, a line each for people; `extra` goes into the --json error as it is.
    hints: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.fields:
            out["fields"] = self.fields
        if self.status is not None:
            out["status"] = self.status
        out["exit_code"] = self.exit_code
        return {**out, **self.extra}


def refused(code: str, message: str, **extra: Any) -> CliError:
    """A refusal gpp makes itself (exit 1), e.g. a launch whose slice failed."""
    return CliError(code, message, EXIT_REFUSED, **extra)


def unreachable(code: str, message: str, **extra: Any) -> CliError:
    return CliError(code, message, EXIT_UNREACHABLE, **extra)


def new_idempotency_key() -> str:
    return f"gpp-{uuid.uuid4()}"


def _nothing_was_sent(exc: requests.RequestException) -> bool:
    """Whether the request never reached the server (refused, no route, no name), so that
    sending it again cannot do anything twice."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    return isinstance(reason, NewConnectionError)


class Api:
    def __init__(
        self,
        url: str,
        token: str,
        *,
        on_retry: Callable[[str], None] | None = None,
        session: requests.Session | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.on_retry = on_retry or (lambda message: None)
        self.last_status = 0  # of the last answer: 201 created, 200 the same key's first result
        self.session = session or requests.Session()
        self.session.headers["User-Agent"] = f"gpp/{__version__}"
        self.session.headers["Accept"] = "application/json"

    # --- one call ---------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        idempotency_key: str = "",
        repeatable: bool = False,
        auth: bool = True,
        text: bool = False,
    ) -> Any:
        """Call the API and return its JSON (None for an empty answer). A read, a create
        with an idempotency key, or a call the API documents as safe to repeat
        (`repeatable`) is retried when the connection broke or the server was briefly
        unavailable; anything else only when it never reached the server."""
        headers = self._headers(auth=auth, idempotency_key=idempotency_key, text=text)
        safe = method == "GET" or bool(idempotency_key) or repeatable
        answer = self._send(method, path, params=params, body=body, headers=headers, safe=safe)
        self.last_status = answer.status_code
        if text and 200 <= answer.status_code < 300:
            return answer.text  # a download (CSV): errors still come as JSON
        return _result(answer, self.url)

    def _headers(self, *, auth: bool, idempotency_key: str, text: bool) -> dict[str, str]:
        headers: dict[str, str] = {}
        if auth:
            if not self.token:
                raise unreachable(
                    "not_logged_in", "No API token: run `gpp login` or set GPP_TOKEN."
                )
            headers["Authorization"] = f"Bearer {self.token}"
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        if text:
            headers["Accept"] = "text/csv, application/json"  # JSON for a refusal
        return headers

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None,
        body: Any,
        headers: dict[str, str],
        safe: bool,
    ) -> requests.Response:
        """The answer to the call, after the retries `request` allows (`safe`: it may be
        sent again whatever became of it)."""
        url = self.url + API_PREFIX + path
        delays = list(RETRY_DELAYS_S)
        while True:
            try:
                answer = self.session.request(
                    method,
                    url,
                    params=params,
                    json=body,
                    headers=headers,
                    timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S),
                    allow_redirects=False,
                )
            except requests.RequestException as exc:
                if delays and (safe or _nothing_was_sent(exc)):
                    self._wait(delays.pop(0), f"{method} {path}: {_short(exc)}; retrying")
                    continue
                raise unreachable(
                    "connection_failed", f"Could not reach {self.url}: {_short(exc)}"
                ) from exc
            wait = _retry_after(answer)
            if answer.status_code == 429 and delays and wait is not None:
                # a throttled call was refused before anything happened: any may be repeated
                delays.pop(0)
                self._wait(wait, f"{method} {path}: throttled; retrying in {wait:.0f} s")
                continue
            if answer.status_code in (502, 503, 504) and delays and safe:
                self._wait(delays.pop(0), f"{method} {path}: {answer.status_code}; retrying")
                continue
            return answer

    def _wait(self, seconds: float, message: str) -> None:
        self.on_retry(message)
        time.sleep(seconds)

    def get(self, path: str, *, auth: bool = True, **params: Any) -> Any:
        query = {k: v for k, v in params.items() if v is not None}
        return self.request("GET", path, params=query, auth=auth)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.request("POST", path, body=body if body is not None else {}, **kwargs)

    # --- lists ------------------------------------------------------------------------------

    def pages(self, path: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every row of a paginated list, page after page. The next page's query is taken
        from the API's `next` link and sent to our own base URL (a proxy in front of the
        API may write another host into the link)."""
        query: dict[str, Any] = {k: v for k, v in params.items() if v is not None}
        query.setdefault("page_size", PAGE_SIZE)
        while True:
            page = self.request("GET", path, params=query)
            if isinstance(page, list):  # an unpaginated list
                yield from page
                return
            yield from page.get("results", [])
            following = page.get("next")
            if not following:
                return
            query = dict(parse_qsl(urlsplit(following).query))

    def all(self, path: str, **params: Any) -> list[dict[str, Any]]:
        return list(self.pages(path, **params))


def _short(exc: Exception) -> str:
    """What failed, without urllib3's wrapping ("HTTPConnection(host=..., port=...): ")."""
    text = str(exc)
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    if reason is not None:
        text = re.sub(r"^\S*Connection(?:Pool)?\([^)]*\): ", "", str(reason))
    return text if len(text) <= 200 else text[:197] + "..."


def _retry_after(answer: requests.Response) -> float | None:
    value = answer.headers.get("Retry-After", "1")
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 <= seconds <= MAX_RETRY_AFTER_S else None


def _result(answer: requests.Response, base: str) -> Any:
    status = answer.status_code
    try:
        body = answer.json() if answer.content else None
    except ValueError:
        body = None
    if 200 <= status < 300:
        if body is None and answer.content:
            raise unreachable(
                "bad_answer", f"{base} answered {status} with something that is not JSON."
            )
        return body
    error = body if isinstance(body, dict) else {}
    code = str(error.get("code") or f"http_{status}")
    message = str(error.get("message") or answer.reason or "").strip()
    if not error and answer.text:
        message = answer.text.strip().splitlines()[0][:200]
    fields = error.get("fields") if isinstance(error.get("fields"), dict) else {}
    extra = {"status": status, "fields": fields or {}, "body": error}
    if status == 401:
        raise unreachable(code, f"{message} Run `gpp login` with a live token.".strip(), **extra)
    if 300 <= status < 400:
        # e.g. http:// answered with a redirect to https://: a POST would be lost on the way
        where = answer.headers.get("Location", "elsewhere")
        raise unreachable("redirected", f"{base} redirects to {where}: use that URL.", **extra)
    if status >= 500:
        raise unreachable(code if error else "server_error", message or f"HTTP {status}", **extra)
    raise refused(code, message or f"HTTP {status}", **extra)

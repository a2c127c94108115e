"""The estimator's Hub reader for the platform: a model id read from the Hugging Face Hub
(estimator.hub_fetch) with the settings' endpoint and token, cached in Django's cache.

Keys: a branch or tag resolves to its commit for ``HF_HUB_REF_TTL`` seconds; what was read
at a commit (immutable) is kept ``HF_HUB_CACHE_TTL`` seconds. A repeated estimate makes no
request. Keys are a digest of the endpoint, the id (lower-cased: the Hub's ids are unique
whatever their case, and it answers any spelling with the same repository) and the
revision (case kept: git's branch names are not case-blind); never of the token, which
never leaves this module but in the Authorization header to the Hub.

A read the cache cannot answer is several requests to the Hub (up to one per shard), so
each caller has a budget of them (``hub_reader``: the ``hub_read_anon`` and
``hub_read_user`` throttle rates, per address or per account); a cached model costs none.
A launch reads the Hub before its transaction opens (``hub_prefetch``): no database
transaction or row lock is ever held across network I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest
from rest_framework import throttling
from rest_framework.settings import api_settings

from estimator import EstimatorError, ModelSpec
from estimator.hub import (
    HUB_FIELD,
    HubFacts,
    HubReader,
    HubRef,
    hub_error,
    hub_ref_from_mapping,
    model_from_hub,
)
from estimator.hub_fetch import fetch_hub_facts
from gpuplatform.http import client_address

CACHE_VERSION = 2
# A read is several requests (model info, config.json, each header); past this many
# request timeouts in all, the page or API answers hub_timeout whatever the client retries.
DEADLINE_REQUESTS = 4
THROTTLED = "throttled"
_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="hub-read")

Charge = Callable[[HubRef], None]


class HubThrottled(EstimatorError):
    """The caller's budget of uncached Hub reads is spent; ``wait``: seconds until one."""

    def __init__(self, ref: HubRef, wait: float | None) -> None:
        self.wait = wait
        after = f" in {int(wait) + 1} s" if wait is not None else " later"
        super().__init__(
            HUB_FIELD,
            f"{ref.repo_id}: too many models not read before were asked of the Hub from "
            f"your address or account; try again{after}, or ask for one already read",
            code=THROTTLED,
        )


def _key(kind: str, repo_id: str, at: str) -> str:
    digest = hashlib.sha256(
        "\n".join((settings.HF_ENDPOINT, repo_id.lower(), at)).encode()
    ).hexdigest()[:40]
    return f"estimator:hub:v{CACHE_VERSION}:{kind}:{digest}"


def ref_key(ref: HubRef) -> str:
    return _key("ref", ref.repo_id, ref.revision)


def facts_key(repo_id: str, commit: str) -> str:
    return _key("facts", repo_id, commit)


def hub_model(ref: HubRef) -> ModelSpec:
    """The ModelSpec of a Hub model id, with no budget (a caller the platform trusts)."""
    return model_from_hub(hub_facts(ref))


def hub_reader(request: HttpRequest | Any) -> HubReader:
    """The estimator's ``hub`` reader for one web or API request: a cached model is free,
    one not read before is charged to the caller's budget (HubThrottled when spent)."""

    def read(ref: HubRef) -> ModelSpec:
        return model_from_hub(hub_facts(ref, charge=lambda r: _charge(request, r)))

    return read


def hub_prefetch(model_request: object, *, user: Any = None) -> HubReader:
    """Read the Hub model a launch's job names NOW, before any transaction opens; the
    reader returned answers from what was read (or raises what the read raised) and
    makes no request. A job naming no (valid) Hub id gets a reader that never reads:
    the estimator refuses an invalid id itself, before asking a reader. An uncached read
    is charged to ``user``'s budget when one is given."""
    ref = _launch_ref(model_request)
    if ref is None:
        return _never
    facts: HubFacts | None = None
    error: EstimatorError | None = None
    who = SimpleNamespace(user=user, META={})
    charge = (lambda r: _charge(who, r)) if user is not None else None
    try:
        facts = hub_facts(ref, charge=charge)
    except EstimatorError as exc:
        error = exc

    def read(asked: HubRef) -> ModelSpec:
        if asked != ref:
            return _never(asked)
        if error is not None:
            raise error
        assert facts is not None
        return model_from_hub(facts)

    return read


def _launch_ref(model_request: object) -> HubRef | None:
    model = model_request.get("model") if isinstance(model_request, dict) else None
    if not isinstance(model, dict) or HUB_FIELD not in model:
        return None
    try:
        return hub_ref_from_mapping(model)
    except EstimatorError:
        return None  # refused by the estimator with its field, never read


def _never(ref: HubRef) -> ModelSpec:
    raise hub_error("hub_unavailable", ref, "this model was not read before the launch")


def hub_facts(ref: HubRef, *, charge: Charge | None = None) -> HubFacts:
    """What the Hub holds of ``ref``, from the cache when it was read before; ``charge``
    is called before a read the cache cannot answer (and may refuse it)."""
    commit = ref.revision if ref.pinned else cache.get(ref_key(ref))
    if commit:
        cached = cache.get(facts_key(ref.repo_id, commit))
        if cached is not None:
            return cached
    if charge is not None:
        charge(ref)
    facts = _read(ref)
    cache.set(facts_key(ref.repo_id, facts["commit"]), facts, settings.HF_HUB_CACHE_TTL)
    if not ref.pinned:
        cache.set(ref_key(ref), facts["commit"], settings.HF_HUB_REF_TTL)
    return facts


def _read(ref: HubRef) -> HubFacts:
    timeout = float(settings.HF_HUB_TIMEOUT)
    future = _POOL.submit(
        fetch_hub_facts,
        ref,
        endpoint=settings.HF_ENDPOINT,
        token=settings.HF_TOKEN or None,
        timeout=timeout,
        deadline_s=timeout * DEADLINE_REQUESTS,
    )
    try:
        return future.result(timeout=timeout * DEADLINE_REQUESTS)
    except FutureTimeout as exc:
        future.cancel()  # still queued: never started
        raise hub_error("hub_timeout", ref, "the Hub did not answer in time; try again") from exc


# -- the budget of uncached reads ------------------------------------------------------------


class _HubReadThrottle(throttling.SimpleRateThrottle):
    """DRF's sliding-window throttle, keyed by account or address, on its own scope."""

    def __init__(self, scope: str) -> None:
        self.scope = scope
        super().__init__()

    def get_rate(self) -> str | None:
        # Read when used, so settings changes take effect at once.
        rates = api_settings.DEFAULT_THROTTLE_RATES
        return rates.get(str(self.scope))  # type: ignore[return-value]

    def get_ident(self, request: Any) -> str:
        return client_address(request)

    def get_cache_key(self, request: Any, view: Any) -> str:
        user = getattr(request, "user", None)
        ident = user.pk if user is not None and user.is_authenticated else self.get_ident(request)
        return f"throttle_{self.scope}_{ident}"


def _charge(request: Any, ref: HubRef) -> None:
    user = getattr(request, "user", None)
    signed_in = user is not None and user.is_authenticated
    throttle = _HubReadThrottle("hub_read_user" if signed_in else "hub_read_anon")
    if not throttle.allow_request(request, None):  # type: ignore[arg-type]  # no view: unused
        raise HubThrottled(ref, throttle.wait())

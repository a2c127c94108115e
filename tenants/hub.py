"""The estimator's Hub reader for the platform: a model id read from the Hugging Face Hub
(estimator.hub_fetch) with the settings' endpoint and token, cached in Django's cache.

Keys: a branch or tag resolves to its commit for ``HF_HUB_REF_TTL`` seconds; what was read
at a commit (immutable) is kept ``HF_HUB_CACHE_TTL`` seconds. A repeated estimate makes no
request. The token never leaves this module but in the Authorization header to the Hub.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from django.conf import settings
from django.core.cache import cache

from estimator import ModelSpec
from estimator.hub import HubFacts, HubRef, hub_error, model_from_hub
from estimator.hub_fetch import fetch_hub_facts

CACHE_VERSION = 1
# A read is several requests (model info, config.json, each header); past this many
# request timeouts in all, the page or API answers hub_timeout whatever the client retries.
DEADLINE_REQUESTS = 4
_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="hub-read")


def _ref_key(ref: HubRef) -> str:
    return f"estimator:hub:v{CACHE_VERSION}:ref:{ref.repo_id}@{ref.revision}"


def _facts_key(repo_id: str, commit: str) -> str:
    return f"estimator:hub:v{CACHE_VERSION}:facts:{repo_id}@{commit}"


def hub_model(ref: HubRef) -> ModelSpec:
    """The ModelSpec of a Hub model id (the estimator's ``hub`` reader)."""
    return model_from_hub(hub_facts(ref))


def hub_facts(ref: HubRef) -> HubFacts:
    """What the Hub holds of ``ref``, from the cache when it was read before."""
    commit = ref.revision if ref.pinned else cache.get(_ref_key(ref))
    if commit:
        cached = cache.get(_facts_key(ref.repo_id, commit))
        if cached is not None:
            return cached
    facts = _read(ref)
    cache.set(_facts_key(ref.repo_id, facts["commit"]), facts, settings.HF_HUB_CACHE_TTL)
    if not ref.pinned:
        cache.set(_ref_key(ref), facts["commit"], settings.HF_HUB_REF_TTL)
    return facts


def _read(ref: HubRef) -> HubFacts:
    timeout = float(settings.HF_HUB_TIMEOUT)
    future = _POOL.submit(
        fetch_hub_facts,
        ref,
        endpoint=settings.HF_ENDPOINT,
        token=settings.HF_TOKEN or None,
        timeout=timeout,
    )
    try:
        return future.result(timeout=timeout * DEADLINE_REQUESTS)
    except FutureTimeout as exc:
        raise hub_error("hub_timeout", ref, "the Hub did not answer in time; try again") from exc

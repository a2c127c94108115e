"""Read a model's config.json and safetensors headers from the Hugging Face Hub, through
its own client (``huggingface_hub``, imported only here and only when called: the rest of
the estimator stays stdlib). Never the weights: each header is two range requests at most.

The requests, in order (``HfApi`` methods; nothing here speaks HTTP itself):

1. ``model_info(files_metadata=True)``: GET ``/api/models/{id}/revision/{rev}?blobs=true``;
   the commit sha the revision resolves to and each file's size.
2. ``hf_hub_download`` of ``config.json`` (and ``model.safetensors.index.json`` when
   sharded) at that commit: HEAD then GET ``/{id}/resolve/{sha}/{file}``, into a temporary
   cache directory removed afterwards (nothing lands in ~/.cache).
3. ``parse_safetensors_file_metadata`` per weights file: GET with ``Range: bytes=0-100000``;
   when the 8-byte length prefix says the header is longer, a second GET for exactly the
   header, made only when the prefix is within ``SAFETENSORS_MAX_HEADER_LENGTH``.

Errors become ``EstimatorError``s on the ``hub`` field that name the model id, with the
codes ``hub_model_not_found``, ``hub_gated``, ``hub_revision_not_found``,
``hub_file_not_found``, ``hub_too_large``, ``hub_timeout`` and ``hub_unavailable``.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .errors import EstimatorError
from .hub import (
    MAX_HEADER_BYTES,
    MAX_JSON_FILE_BYTES,
    MAX_SHARDS,
    MAX_TENSORS,
    HubFacts,
    HubRef,
    check_repo_id,
    check_revision,
    hub_error,
    hub_facts,
    is_commit,
)
from .parsing import parse_json_object

if TYPE_CHECKING:
    from huggingface_hub import HfApi

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SHARD_WORKERS = 8


def fetch_hub_facts(
    ref: HubRef,
    *,
    endpoint: str,
    token: str | None = None,
    timeout: float = 10.0,
    max_shards: int = MAX_SHARDS,
    deadline_s: float | None = None,
) -> HubFacts:
    """What the Hub holds of ``ref``: its commit, config.json and every safetensors header.

    ``token`` (a gated model's) is sent to ``endpoint`` only; without one no token is sent,
    not even one saved on this machine. ``timeout`` bounds each request; ``deadline_s``
    the whole read: no request starts after it (one under way ends within ``timeout`` of
    its last byte), so a slow Hub cannot keep this thread reading.
    """
    check_repo_id(ref.repo_id)  # never a request for an id or revision that is not one
    check_revision(ref.revision)
    api = _client(endpoint, token)
    until = time.monotonic() + (deadline_s if deadline_s is not None else timeout * 4)
    try:
        return _fetch(api, ref, timeout=timeout, max_shards=max_shards, until=until)
    except EstimatorError:
        raise
    except Exception as exc:  # the client's errors, by kind; anything else is the Hub's fault
        raise hub_refusal(ref, exc) from exc


def _client(endpoint: str, token: str | None) -> HfApi:
    # Optional dependency: only the platform reads the Hub; the pure estimator never does.
    from huggingface_hub import HfApi, constants  # noqa: PLC0415 - imported only when used

    if constants.SAFETENSORS_MAX_HEADER_LENGTH > MAX_HEADER_BYTES:  # never a looser cap
        constants.SAFETENSORS_MAX_HEADER_LENGTH = MAX_HEADER_BYTES
    # token=False: no Authorization header, and no token read from HF_TOKEN or ~/.cache.
    return HfApi(endpoint=endpoint.rstrip("/"), token=token or False, library_name="gpuplatform")


def _in_time(ref: HubRef, until: float) -> None:
    """Refuse to start another request past the read's deadline."""
    if time.monotonic() > until:
        raise hub_error("hub_timeout", ref, "the Hub did not answer in time; try again")


def _fetch(api: HfApi, ref: HubRef, *, timeout: float, max_shards: int, until: float) -> HubFacts:
    info = api.model_info(ref.repo_id, revision=ref.revision, timeout=timeout, files_metadata=True)
    commit = info.sha or ""
    if not is_commit(commit):
        raise hub_error("hub_unavailable", ref, "the Hub answered without a commit sha")
    # The Hub answers any spelling of an id with its repository: keep the Hub's own.
    if isinstance(info.id, str) and info.id.lower() == ref.repo_id.lower():
        ref = HubRef(info.id, ref.revision)
    sizes = {s.rfilename: s.size for s in info.siblings or []}
    if CONFIG_FILE not in sizes:
        raise hub_error("hub_file_not_found", ref, "the repository has no config.json")
    with _scratch_dir() as scratch:
        _in_time(ref, until)
        config = _json_file(api, ref, commit, CONFIG_FILE, sizes, scratch, timeout)
        if SINGLE_FILE in sizes:
            files = [SINGLE_FILE]
        elif INDEX_FILE in sizes:
            _in_time(ref, until)
            index = _json_file(api, ref, commit, INDEX_FILE, sizes, scratch, timeout)
            files = _shards(ref, index, sizes, max_shards)
        else:
            raise hub_error(
                "hub_file_not_found",
                ref,
                f"the repository has neither {SINGLE_FILE} nor {INDEX_FILE}: only safetensors "
                "checkpoints are read",
            )
    headers = _headers(api, ref, commit, files, timeout, until)
    return hub_facts(ref, commit, config, headers)


@contextmanager
def _scratch_dir() -> Iterator[str]:
    """The client's download cache for one read: a temporary directory, removed after."""
    with tempfile.TemporaryDirectory(prefix="gpp-hub-") as path:
        yield path


def _json_file(
    api: HfApi,
    ref: HubRef,
    commit: str,
    filename: str,
    sizes: dict[str, int | None],
    scratch: str,
    timeout: float,
) -> dict[str, Any]:
    size = sizes.get(filename)
    if size is None:  # never a download of unknown length
        raise hub_error("hub_unavailable", ref, f"the Hub did not give the size of {filename}")
    if size > MAX_JSON_FILE_BYTES:
        raise hub_error(
            "hub_too_large",
            ref,
            f"{filename} is {size:,} bytes; the limit is {MAX_JSON_FILE_BYTES:,}",
        )
    path = api.hf_hub_download(
        ref.repo_id, filename, revision=commit, cache_dir=scratch, etag_timeout=timeout
    )
    with open(path, "rb") as handle:
        data = handle.read(MAX_JSON_FILE_BYTES + 1)
    if len(data) > MAX_JSON_FILE_BYTES:
        raise hub_error("hub_too_large", ref, f"{filename} is over {MAX_JSON_FILE_BYTES:,} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise hub_error("hub_unavailable", ref, f"{filename} is not UTF-8 text") from exc
    if filename == CONFIG_FILE:  # config.json is data only: json.loads, never AutoConfig
        return parse_json_object(text, "config_json", infinity=True)
    try:
        loaded = json.loads(text)
    except ValueError as exc:
        raise hub_error("hub_unavailable", ref, f"{filename} is not JSON") from exc
    if not isinstance(loaded, dict):
        raise hub_error("hub_unavailable", ref, f"{filename} is not a JSON object")
    return loaded


def _shards(
    ref: HubRef, index: dict[str, Any], sizes: dict[str, int | None], max_shards: int
) -> list[str]:
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise hub_error("hub_unavailable", ref, f"{INDEX_FILE} has no weight_map")
    files = sorted({f for f in weight_map.values() if isinstance(f, str)})
    if len(files) > max_shards:
        raise hub_error(
            "hub_too_large", ref, f"{len(files):,} safetensors shards; the limit is {max_shards:,}"
        )
    for name in files:
        if name not in sizes or not name.endswith(".safetensors"):
            raise hub_error(
                "hub_file_not_found",
                ref,
                f"{INDEX_FILE} names {name[:100]!r}, not in the repository",
            )
    return files


def _headers(
    api: HfApi, ref: HubRef, commit: str, files: list[str], timeout: float, until: float
) -> dict[str, dict[str, Any]]:
    """Each file's header as ``{tensor: {dtype, shape, data_offsets}}``, in file order.
    The first refusal (too many tensors, past the deadline, an error) cancels the reads
    not yet started: a refused repository costs no more requests."""
    count = [0]
    lock = threading.Lock()

    def read(filename: str) -> dict[str, Any]:
        _in_time(ref, until)
        meta = api.parse_safetensors_file_metadata(
            ref.repo_id, filename, revision=commit, timeout=timeout
        )
        with lock:  # counted as each arrives: never 256 large headers held to find out
            count[0] += len(meta.tensors)
            if count[0] > MAX_TENSORS:
                raise hub_error(
                    "hub_too_large", ref, f"over {MAX_TENSORS:,} tensors in its safetensors files"
                )
        return {
            name: {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": list(t.data_offsets)}
            for name, t in meta.tensors.items()
        }

    pool = ThreadPoolExecutor(max_workers=min(SHARD_WORKERS, len(files)))
    try:
        futures: list[Future[dict[str, Any]]] = [pool.submit(read, f) for f in files]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((x for x in futures if x in done and x.exception() is not None), None)
        if failed is not None:
            pool.shutdown(wait=False, cancel_futures=True)
            raise failed.exception()  # type: ignore[misc]
        return {f: future.result() for f, future in zip(files, futures, strict=True)}
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def hub_refusal(ref: HubRef, exc: BaseException) -> EstimatorError:
    """The client's exception as a refusal naming the model id."""
    # Optional dependency, as in _client.
    from huggingface_hub import errors  # noqa: PLC0415 - imported only when used

    code, message = _kind(exc, errors)
    if code == "hub_revision_not_found":
        return hub_error(code, ref, message, field="revision")
    return hub_error(code, ref, message)


def _kind(exc: BaseException, errors: Any) -> tuple[str, str]:
    if _timed_out(exc):
        return "hub_timeout", "the Hub did not answer in time; try again"
    if isinstance(exc, errors.GatedRepoError):  # before RepositoryNotFoundError, its base
        return "hub_gated", (
            "a gated model: accept its terms on the Hub, and the platform needs a token "
            "allowed to read it"
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return "hub_model_not_found", "no such model on the Hub (or it is private)"
    if isinstance(exc, errors.RevisionNotFoundError):
        return "hub_revision_not_found", "no such revision (branch, tag or commit) in the model"
    if isinstance(exc, errors.RemoteEntryNotFoundError):
        return "hub_file_not_found", "a file the repository lists is missing"
    if isinstance(exc, errors.SafetensorsParsingError):
        if "too big" in str(exc):
            return "hub_too_large", (
                f"a safetensors header declares over {MAX_HEADER_BYTES:,} bytes; not read"
            )
        return "hub_unavailable", "a safetensors header could not be parsed"
    status = getattr(getattr(exc, "response", None), "status_code", None)
    shown = f" (HTTP {status})" if isinstance(status, int) else ""
    return "hub_unavailable", f"the Hub could not be read{shown}; try again later"


def _timed_out(exc: BaseException | None) -> bool:
    """A timeout, or an error the client raised because of one (hf_hub_download wraps it)."""
    for _ in range(6):
        if exc is None:
            return False
        if isinstance(exc, TimeoutError) or type(exc).__name__.endswith("Timeout"):
            return True
        if any(base.__name__ == "TimeoutException" for base in type(exc).__mro__):
            return True
        exc = exc.__cause__ or exc.__context__
    return False

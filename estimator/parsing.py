"""Bounded parsing of user text: size limit, JSON as data only, typed field readers.

Nothing here executes anything it reads: ``json.loads`` only, no regular
expressions over user text, no recursion over user structures. Python's C JSON
decoder raises ``RecursionError`` on absurd nesting long before any hang; that,
like every other decoding failure, becomes an ``EstimatorError``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final, overload

from .errors import EstimatorError

MAX_INPUT_BYTES = 1_048_576  # 1 MiB: no config.json or safetensors header comes near it


class _Missing:
    """The type of ``_MISSING``: no default was given, so the field is required."""


_MISSING: Final = _Missing()


def check_size(value: str | bytes | bytearray, field: str) -> None:
    size = len(value)
    if isinstance(value, str) and size * 4 > MAX_INPUT_BYTES:
        size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_INPUT_BYTES:
        raise EstimatorError(field, f"input is {size:,} bytes; the limit is {MAX_INPUT_BYTES:,}")


def as_text(value: object, field: str) -> str:
    """User text (str, or UTF-8 bytes) within the size limit."""
    if isinstance(value, bytes | bytearray):
        check_size(value, field)
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EstimatorError(field, "not UTF-8 text") from exc
    if not isinstance(value, str):
        raise EstimatorError(field, "expected text")
    check_size(value, field)
    return value


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number")


def _infinity_as_text(name: str) -> str:
    if name == "NaN":
        raise ValueError("NaN is not a number")
    return name  # a string: any field that must be a number refuses it by name


def parse_json_object(value: object, field: str, *, infinity: bool = False) -> dict[str, Any]:
    """Parse user text as one JSON object, or raise EstimatorError naming ``field``.
    With ``infinity``, JSON's non-standard ``Infinity`` reads as the text "Infinity"
    (transformers writes Mamba-2's ``time_step_limit`` as ``[0.0, Infinity]``, a field
    that counts for nothing); NaN is refused either way."""
    text = as_text(value, field)
    try:
        data = json.loads(text, parse_constant=_infinity_as_text if infinity else _reject_constant)
    except RecursionError as exc:
        raise EstimatorError(field, "malformed JSON: nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, huge integers, NaN/Infinity
        raise EstimatorError(field, f"malformed JSON: {str(exc)[:200]}") from exc
    if not isinstance(data, dict):
        raise EstimatorError(field, "expected a JSON object")
    return data


@overload
def read_int(
    data: Mapping[str, Any], key: str, field: str, *, minimum: int = 1, maximum: int = 10**9
) -> int: ...
@overload
def read_int(
    data: Mapping[str, Any],
    key: str,
    field: str,
    *,
    default: int,
    minimum: int = 1,
    maximum: int = 10**9,
) -> int: ...
@overload
def read_int(
    data: Mapping[str, Any],
    key: str,
    field: str,
    *,
    default: int | None,
    minimum: int = 1,
    maximum: int = 10**9,
) -> int | None: ...
def read_int(
    data: Mapping[str, Any],
    key: str,
    field: str,
    *,
    default: int | None | _Missing = _MISSING,
    minimum: int = 1,
    maximum: int = 10**9,
) -> int | None:
    """An integer field; ``None`` or absence gives ``default`` (required if none)."""
    value = data.get(key)
    if value is None:
        if isinstance(default, _Missing):
            raise EstimatorError(f"{field}.{key}", "required", code="required")
        return default
    return check_int(value, f"{field}.{key}", minimum=minimum, maximum=maximum)


def as_int(value: object, field: str) -> int:
    """A JSON integer, or a float with no fraction (JSON does not tell 2 from 2.0); not a
    boolean, a string or 2.5."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise EstimatorError(field, "expected an integer")
    return value


def check_int(value: Any, field: str, *, minimum: int = 1, maximum: int = 10**9) -> int:
    number = as_int(value, field)
    if number < minimum:
        raise EstimatorError(field, f"must be at least {minimum:,}", code="min_value")
    if number > maximum:
        raise EstimatorError(field, f"must be at most {maximum:,}", code="max_value")
    return number


def check_float(value: Any, field: str, *, minimum: float, maximum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EstimatorError(field, "expected a number")
    number = float(value)
    code = None
    if not math.isfinite(number):
        code = "invalid"
    elif number < minimum:
        code = "min_value"
    elif number > maximum:
        code = "max_value"
    if code:
        raise EstimatorError(field, f"must be between {minimum:g} and {maximum:g}", code=code)
    return number


def read_bool(data: Mapping[str, Any], key: str, field: str, *, default: bool) -> bool:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise EstimatorError(f"{field}.{key}", "expected true or false")
    return value


def check_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise EstimatorError(field, "expected true or false")
    return value


def check_choice(value: Any, field: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        shown = value if isinstance(value, str) and len(value) <= 40 else type(value).__name__
        raise EstimatorError(
            field,
            f"unknown value {shown!r}; expected one of {', '.join(choices)}",
            code="invalid_choice",
        )
    return value

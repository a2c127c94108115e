"""The one exception type the estimator raises for bad input."""

from __future__ import annotations


class EstimatorError(ValueError):
    """Bad input: names the offending field (dotted, e.g. ``model.num_kv_heads``) and why.

    ``code`` is the API's field-level error code (gpuplatform.errors.ERROR_CODES):
    ``unknown_field``, ``required``, ``min_value``, ``max_value``, ``invalid_choice``,
    or ``invalid`` for anything else (a wrong type included)."""

    def __init__(self, field: str, message: str, *, code: str = "invalid") -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message
        self.code = code

    def prefixed(self, prefix: str) -> EstimatorError:
        """The same error with ``prefix.`` in front of its field (no double prefix)."""
        if not prefix or self.field == prefix or self.field.startswith(prefix + "."):
            return self
        field = f"{prefix}.{self.field}" if self.field else prefix
        return EstimatorError(field, self.message, code=self.code)


UNKNOWN_FIELD = "Unknown field."  # the words the API's serializers use


def unknown_field(field: str) -> EstimatorError:
    return EstimatorError(field, UNKNOWN_FIELD, code="unknown_field")

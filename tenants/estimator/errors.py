"""The one exception type the estimator raises for bad input."""

from __future__ import annotations


class EstimatorError(ValueError):
    """Bad input: names the offending field (dotted, e.g. ``model.num_kv_heads``) and why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message

    def prefixed(self, prefix: str) -> EstimatorError:
        """The same error with ``prefix.`` in front of its field (no double prefix)."""
        if not prefix or self.field == prefix or self.field.startswith(prefix + "."):
            return self
        field = f"{prefix}.{self.field}" if self.field else prefix
        return EstimatorError(field, self.message)

"""Serializer bases shared by every app's API."""

from typing import Any

from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail


class StrictFieldsMixin:
    """Refuse fields the serializer does not accept, instead of silently dropping them.

    A typo in an optional field ("comand") would otherwise start something the client
    did not ask for.
    """

    def to_internal_value(self, data: Any) -> Any:
        unknown: dict[str, list[ErrorDetail]] = {}
        if isinstance(data, dict):
            writable = {name for name, field in self.fields.items() if not field.read_only}  # type: ignore[attr-defined]
            unknown = {
                str(name): [ErrorDetail("Unknown field.", code="unknown_field")]
                for name in sorted(set(data) - writable, key=str)
            }
        try:
            value = super().to_internal_value(data)  # type: ignore[misc]
        except serializers.ValidationError as exc:
            if unknown and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**exc.detail, **unknown}) from exc
            raise
        if unknown:
            raise serializers.ValidationError(unknown)
        return value


class StrictSerializer(StrictFieldsMixin, serializers.Serializer):
    pass


class StrictModelSerializer(StrictFieldsMixin, serializers.ModelSerializer):
    pass

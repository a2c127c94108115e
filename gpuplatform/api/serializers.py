"""Serializer bases shared by every app's API.

Every input serializer is a StrictSerializer (or StrictModelSerializer), which holds the
whole API to one vocabulary (gpuplatform.errors.ERROR_CODES), at every depth:

- a field it does not accept is refused as `unknown_field`, nested ones included
  (`known_fixed_builds.0.bogus`); a writable nested serializer must itself be strict;
- an integer field takes a JSON integer only: a string (`"2"`), a boolean or a number
  with a fractional part is `invalid` ("A valid integer is required."). A JSON number
  with a zero fraction (`2.0`) is the integer 2: JSON does not tell them apart, nor do
  many clients. The same holds for related ids with integer primary keys. Query strings
  are text by nature: serializers that read them (`query_string = True`, or data given as
  a QueryDict) keep DRF's parsing of "2".
- a text field takes a JSON string only: a number (`{"reason": 0}`) is `invalid` ("Not a
  valid string."), as DRF would otherwise store it as "0". Text is text, as integers are
  integers.
"""

from functools import cache
from typing import Any

from django.db import models
from django.http import QueryDict
from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail

INTEGER_REQUIRED = "A valid integer is required."
# Above this a float is not exact, so 1e300 is not "a whole number".
_EXACT_FLOAT = 2**53
_INTEGER_PKS = (models.AutoField, models.BigAutoField, models.SmallAutoField, models.IntegerField)


def _reads_query_string(field: serializers.Field) -> bool:
    root = field.root
    return bool(getattr(root, "query_string", False)) or isinstance(
        getattr(root, "initial_data", None), QueryDict
    )


def json_integer(data: Any) -> int:
    """`data` as an int if it is a JSON integer (or a float with no fraction); else
    ValueError. Booleans are not integers here, though Python says they are."""
    if isinstance(data, bool):
        raise ValueError("a boolean")
    if isinstance(data, int):
        return data
    if isinstance(data, float) and data.is_integer() and abs(data) < _EXACT_FLOAT:
        return int(data)
    raise ValueError(type(data).__name__)


class StrictIntegerMixin:
    """An IntegerField (or subclass) that refuses strings, booleans and fractions."""

    def to_internal_value(self, data: Any) -> Any:
        if not _reads_query_string(self):  # type: ignore[arg-type]
            try:
                data = json_integer(data)
            except ValueError:
                self.fail("invalid")  # type: ignore[attr-defined]
        return super().to_internal_value(data)  # type: ignore[misc]


class StrictCharMixin:
    """A CharField (or subclass: email, URL, slug, regex) that refuses JSON numbers."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str) and not _reads_query_string(self):  # type: ignore[arg-type]
            self.fail("invalid")  # type: ignore[attr-defined]
        return super().to_internal_value(data)  # type: ignore[misc]


class StrictPrimaryKeyMixin:
    """A PrimaryKeyRelatedField over an integer key takes integers the way integer fields
    do (`"2"` and `2.5` are `invalid`, where Django would look up 2)."""

    def to_internal_value(self, data: Any) -> Any:
        if self.pk_field is None and not _reads_query_string(self):  # type: ignore[attr-defined,arg-type]
            model = getattr(self.get_queryset(), "model", None)  # type: ignore[attr-defined]
            if model is not None and isinstance(model._meta.pk, _INTEGER_PKS):
                try:
                    data = json_integer(data)
                except ValueError:
                    raise serializers.ValidationError(
                        ErrorDetail(INTEGER_REQUIRED, code="invalid")
                    ) from None
        return super().to_internal_value(data)  # type: ignore[misc]


@cache
def _strict_class(cls: type, mixin: type) -> type:
    """`cls` with `mixin` in front, under the same name (the schema does not change)."""
    return type(
        cls.__name__,
        (mixin, cls),
        {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__},
    )


def make_strict(field: serializers.Field, where: str) -> None:
    """Give `field` (and the fields inside it) the strict behaviours, in place."""
    # A plain `type`: mypy reads the stubs' Field.__hash__ as the class's own and would
    # call type[IntegerField] unhashable for the cache.
    kind: type = type(field)
    if isinstance(field, serializers.IntegerField):
        if not isinstance(field, StrictIntegerMixin):
            field.__class__ = _strict_class(kind, StrictIntegerMixin)
    elif isinstance(field, serializers.CharField):
        if not isinstance(field, StrictCharMixin):
            field.__class__ = _strict_class(kind, StrictCharMixin)
    elif isinstance(field, serializers.PrimaryKeyRelatedField):
        if not isinstance(field, StrictPrimaryKeyMixin):
            field.__class__ = _strict_class(kind, StrictPrimaryKeyMixin)
    elif isinstance(field, serializers.ManyRelatedField):
        make_strict(field.child_relation, where)
    elif isinstance(
        field, serializers.ListField | serializers.DictField | serializers.ListSerializer
    ):
        if field.child is not None:
            make_strict(field.child, where)
    elif isinstance(field, serializers.BaseSerializer) and not isinstance(field, StrictFieldsMixin):
        raise TypeError(
            f"{where}: a writable nested serializer must be a StrictSerializer, so that "
            "its unknown fields and integers are refused like the top level's."
        )


class StrictFieldsMixin:
    """Refuse fields the serializer does not accept, instead of silently dropping them.

    A typo in an optional field ("comand") would otherwise start something the client
    did not ask for. Integer fields refuse what is not an integer (see the module).
    """

    # True for a serializer of query-string parameters: their values are text.
    query_string = False

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()  # type: ignore[misc]
        for name, field in fields.items():
            if not field.read_only:
                make_strict(field, f"{type(self).__name__}.{name}")
        return fields

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
                merged: dict[Any, Any] = {**exc.detail, **unknown}
                raise serializers.ValidationError(merged) from exc
            raise
        if unknown:
            raise serializers.ValidationError(unknown)
        return value


class StrictSerializer(StrictFieldsMixin, serializers.Serializer):
    pass


class StrictModelSerializer(StrictFieldsMixin, serializers.ModelSerializer):
    pass

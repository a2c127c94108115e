"""A tally of parameters by component, with the linear matrices a quantizer converts, that
the architecture readers fill module by module as the transformers modeling file builds it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, overload

from ..model import ParamBreakdown


class Reader(Protocol):
    """What config_json's reader offers: config keys read and checked, by ModelSpec field
    (``keys``: which config key fed which field, for the error a ModelSpec raises)."""

    data: Mapping[str, Any]
    field: str
    keys: dict[str, str]

    @overload
    def int(self, key: str, spec_field: str, *, maximum: int, minimum: int = 1) -> int: ...
    @overload
    def int(
        self, key: str, spec_field: str, *, default: int, maximum: int, minimum: int = 1
    ) -> int: ...
    @overload
    def int(
        self, key: str, spec_field: str, *, default: int | None, maximum: int, minimum: int = 1
    ) -> int | None: ...

    def bool(self, key: str, spec_field: str, *, default: bool) -> bool: ...


class Tally:
    """Parameters by component; ``linear`` records a quantizable matrix (and its bias)."""

    def __init__(self) -> None:
        self.components: dict[str, int] = {}
        self.linears: list[tuple[str, int, int, int]] = []
        self.inactive = 0  # routed-expert weights a token does not touch

    def add(self, component: str, count: int) -> None:
        if count:
            self.components[component] = self.components.get(component, 0) + count

    def linear(
        self, component: str, module: str, n_in: int, n_out: int, count: int, *, bias: bool
    ) -> None:
        if count:
            self.linears.append((module, n_in, n_out, count))
            self.add(component, count * (n_in * n_out + (n_out if bias else 0)))

    def gated_mlp(
        self, component: str, hidden: int, inter: int, count: int, *, bias: bool = False
    ) -> None:
        self.linear(component, f"{component}.gate_proj", hidden, inter, count, bias=bias)
        self.linear(component, f"{component}.up_proj", hidden, inter, count, bias=bias)
        self.linear(component, f"{component}.down_proj", inter, hidden, count, bias=bias)

    def breakdown(self) -> ParamBreakdown:
        total = sum(self.components.values())
        linear_params = sum(i * o * c for _, i, o, c in self.linears)
        return ParamBreakdown(
            components=dict(self.components),
            linears=tuple(self.linears),
            linear_params=linear_params,
            other_params=total - linear_params,
            total=total,
            active=total - self.inactive,
        )

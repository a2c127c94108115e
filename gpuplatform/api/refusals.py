"""What a view can refuse with, read from its code: the errors raised by the view and by
everything of ours it calls (services, selectors, serializers), as {status: {code}}."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
from collections.abc import Callable, Iterator
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import models
from django.http import Http404
from rest_framework import exceptions

from gpuplatform.errors import ServiceError

OURS = ("tenants.", "nodes.", "incidents.", "gpuplatform.", "estimator.", "gateway.")
# the view methods DRF's own handlers (list, retrieve, create...) call back into
DRF_HOOKS = (
    "get_queryset",
    "get_object",
    "get_serializer",
    "get_serializer_class",
    "get_serializer_context",
    "perform_create",
    "perform_update",
    "perform_destroy",
)


class Refusals:
    """{status: codes} found, and the raise sites whose code could not be read."""

    def __init__(self) -> None:
        self.codes: dict[int, set[str]] = {}
        self.unread: list[str] = []
        self.reads_body = False  # whether `request.data` is read: a body can be refused

    def add(self, status: int, code: str) -> None:
        self.codes.setdefault(status, set()).add(code)

    def merge(self, other: Refusals) -> None:
        for status, codes in other.codes.items():
            self.codes.setdefault(status, set()).update(codes)
        self.unread.extend(other.unread)


def _ours(obj: Any) -> bool:
    return (getattr(obj, "__module__", None) or "").startswith(OURS)


def _source_tree(func: Callable) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return None


def _constants(node: ast.AST | None, assigned: dict[str, list[ast.AST]]) -> list[str] | None:
    """The strings an expression can be: a constant, `a if c else b`, or a local name
    assigned only such; None when it cannot be read."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        body, orelse = _constants(node.body, assigned), _constants(node.orelse, assigned)
        return None if body is None or orelse is None else body + orelse
    if isinstance(node, ast.Name) and node.id in assigned:
        out: list[str] = []
        for value in assigned[node.id]:
            found = _constants(value, {})
            if found is None:
                return None
            out += found
        return out
    return None


def _method_test(node: ast.AST) -> str | None:
    """ "POST" for `if request.method == "POST":`; None for any other test."""
    if (
        isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Attribute)
        and node.left.attr == "method"
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.Eq)
        and isinstance(node.comparators[0], ast.Constant)
    ):
        return str(node.comparators[0].value).upper()
    return None


def _nodes(node: ast.AST, method: str | None) -> Iterator[ast.AST]:
    """Every node under `node`, less the branches `if request.method == X` rules out for
    `method` (one view function may answer GET and POST)."""
    yield node
    if isinstance(node, ast.If) and method and (wanted := _method_test(node.test)):
        branches: list[ast.stmt] = node.body if wanted == method else node.orelse
        for branch in branches:
            yield from _nodes(branch, method)
        return
    for child in ast.iter_child_nodes(node):
        yield from _nodes(child, method)


def _exception_of(
    cls: type,
    call: ast.Call | None,
    assigned: dict[str, list[ast.AST]],
    where: str,
    out: Refusals,
) -> None:
    if issubclass(cls, ServiceError) and cls.status_code == 400:
        # the error handler answers any 400 ServiceError as validation_error (its own code
        # goes under `fields`), so which code it carries does not change the answer
        out.add(400, "validation_error")
    elif issubclass(cls, ServiceError):
        keyword = next((k.value for k in (call.keywords if call else []) if k.arg == "code"), None)
        if keyword is None and "__init__" in vars(cls):  # a subclass that names its own code
            tree = _source_tree(vars(cls)["__init__"])
            calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)] if tree else []
            keyword = next((k.value for n in calls for k in n.keywords if k.arg == "code"), None)
        codes = [cls.default_code] if keyword is None else _constants(keyword, assigned)
        if codes is None:
            out.unread.append(where)
            return
        for code in codes:
            out.add(cls.status_code, code)
    elif issubclass(cls, exceptions.ValidationError | DjangoValidationError):
        out.add(400, "validation_error")
    elif issubclass(cls, Http404 | exceptions.NotFound):
        out.add(404, "not_found")
    elif issubclass(cls, DjangoPermissionDenied):
        out.add(403, "permission_denied")
    elif issubclass(cls, exceptions.APIException):
        out.add(cls.status_code, str(cls.default_code))


class _Walker:
    def __init__(self, method: str | None) -> None:
        self.seen: set[int] = set()
        self.method = method

    def resolve(self, node: ast.AST, scope: dict[str, Any], owner: type | None) -> Any:
        if isinstance(node, ast.Name):
            return scope.get(node.id, getattr(__builtins__, node.id, None))
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") and owner:
                return inspect.getattr_static(owner, node.attr, None)
            base = self.resolve(node.value, scope, owner)
            if isinstance(base, types.ModuleType) or (isinstance(base, type) and _ours(base)):
                return getattr(base, node.attr, None)
        return None

    def callables(self, target: Any) -> Iterator[tuple[Callable, type | None]]:
        """The functions of ours `target` stands for: itself, or a class's own methods."""
        if isinstance(target, staticmethod | classmethod):
            target = target.__func__
        if isinstance(target, functools.partial):
            target = target.func
        if isinstance(target, types.FunctionType) and _ours(target):
            yield inspect.unwrap(target), None
        elif isinstance(target, type) and _ours(target) and not issubclass(target, models.Model):
            for klass in target.__mro__:
                if not _ours(klass):
                    continue
                for value in vars(klass).values():
                    for func, _ in self.callables(value):
                        yield func, target

    def walk(self, func: Callable, owner: type | None, out: Refusals) -> None:
        if id(func) in self.seen:
            return
        self.seen.add(id(func))
        tree = _source_tree(func)
        if tree is None:
            return
        scope = {**func.__globals__, **inspect.getclosurevars(func).nonlocals}
        assigned: dict[str, list[ast.AST]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(node.value)
        where = f"{func.__module__}.{func.__qualname__}"
        for node in _nodes(tree, self.method):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "data"
                and isinstance(node.value, ast.Name)
                and node.value.id == "request"
            ):
                out.reads_body = True
            elif isinstance(node, ast.Raise) and node.exc is not None:
                call = node.exc if isinstance(node.exc, ast.Call) else None
                raised = self.resolve(call.func if call else node.exc, scope, owner)
                if isinstance(raised, type) and issubclass(raised, BaseException):
                    _exception_of(raised, call, assigned, f"{where}:{node.lineno}", out)
            elif isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Load):
                target = self.resolve(node, scope, owner)
                for callee, callee_owner in self.callables(target):
                    self.walk(callee, callee_owner or owner, out)
            elif isinstance(node, ast.Name) and node.id == "get_object_or_404":
                out.add(404, "not_found")


def view_refusals(view_class: type, handler: str, method: str | None = None) -> Refusals:
    """What `view_class`'s `handler` (an action or an HTTP method) can raise when called
    for `method`, through everything of ours it reaches."""
    out = Refusals()
    walker = _Walker(method)
    names = [handler, *DRF_HOOKS]
    for name in names:
        value = inspect.getattr_static(view_class, name, None)
        for func, _ in walker.callables(value):
            walker.walk(func, view_class, out)
    return out

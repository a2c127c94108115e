"""The house rules (issue 14), checked on the source itself: how modules may depend on each
other, where locks and writes live, how work is queued, and how big a room may grow. Each
test reads the code with `ast` and names the place that breaks a rule."""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from rest_framework.viewsets import ViewSetMixin

from gpuplatform.celery import app as celery_app
from gpuplatform.urls import urlpatterns

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION = ("gpuplatform", "tenants", "nodes", "incidents", "gateway", "edge", "estimator", "cli")
TEST_EQUIPMENT = ("emulator", "nodelab")
MAX_MODULE_LINES = 700
# A function a reader holds in one screen: longer ones are split into named steps.
MAX_FUNCTION_LINES = 60
# Modules that run on a GPU node or stand alone, never inside Django (the `gpp` client
# speaks to the platform through its REST API only).
PURE = (
    "cli",
    "estimator",
    "nodes.placement",
    "nodes.preflight",
    "nodes.sampler",
    "nodes.command_env",
    "nodes.relay",
    "nodes.volumes",
    "incidents.rules",
    "incidents.preemption",
)


@dataclass(frozen=True)
class Import:
    target: str  # the module imported (a package's __init__ when a name is taken from it)
    names: tuple[str, ...]  # the names taken from it ("" for `import x`)
    line: int
    local: bool  # inside a function
    type_checking: bool  # under `if TYPE_CHECKING:`


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module
    lines: tuple[str, ...]

    @property
    def where(self) -> str:
        return str(self.path.relative_to(ROOT))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules(packages: tuple[str, ...] = PRODUCTION) -> tuple[Module, ...]:
    found = []
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            text = path.read_text()
            found.append(
                Module(_module_name(path), path, ast.parse(text), tuple(text.splitlines()))
            )
    return tuple(found)


@cache
def _known() -> frozenset[str]:
    return frozenset(m.name for m in modules(PRODUCTION + TEST_EQUIPMENT))


def imports(module: Module) -> Iterator[Import]:
    """Every import statement of `module`, resolved to the module it loads."""
    known = _known()
    is_package = module.path.name == "__init__.py"

    def walk(node: ast.AST, local: bool, type_checking: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, True, type_checking)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from walk(child, local, True)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(alias.name, ("",), child.lineno, local, type_checking)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = module.name.split(".")
                    if not is_package:
                        package.pop()
                    package = package[: len(package) - (child.level - 1)]
                    base = ".".join([*package, *([base] if base else [])])
                names = tuple(a.name for a in child.names)
                submodules = [n for n in names if f"{base}.{n}" in known]
                for name in submodules:  # `from pkg import module`
                    yield Import(f"{base}.{name}", ("",), child.lineno, local, type_checking)
                rest = tuple(n for n in names if n not in submodules)
                if rest:
                    yield Import(base, rest, child.lineno, local, type_checking)
            else:
                yield from walk(child, local, type_checking)

    yield from walk(module.tree, False, False)


def _top(name: str) -> str:
    return name.split(".")[0]


def test_no_import_cycle_among_production_modules():
    # An edge is an import statement at module level (imports for type checkers only do
    # not run). A package's __init__ that re-exports its submodules is not an edge from
    # them: a cycle needs a module importing, directly or through others, itself.
    names = {m.name for m in modules()}
    edges = {
        m.name: sorted(
            {i.target for i in imports(m) if not i.local and not i.type_checking}
            & (names - {m.name})
        )
        for m in modules()
    }
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for target in edges[name]:
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[name] = 2
        return None

    for name in sorted(edges):
        if name not in state and (cycle := visit(name)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def _reason_near(module: Module, line: int) -> bool:
    """A `noqa: PLC0415` on the import's line, and words saying why: on that line, or in
    the comment just above it (or above the run of imports it belongs to)."""
    text = module.lines[line - 1]
    if "PLC0415" not in text:
        return False
    said = text.split("#", 1)[1]
    for code in ("noqa", "PLC0415", "F401"):
        said = said.replace(code, "")
    if any(c.isalpha() for c in said):
        return True
    for above in reversed(module.lines[: line - 1]):
        above = above.strip()
        if above and not above.startswith(("from ", "import ")):
            return above.startswith("#")
    return False


@pytest.mark.parametrize("packages", [PRODUCTION, TEST_EQUIPMENT, ("tests", "bench")])
def test_function_local_imports_say_why(packages):
    unexplained = [
        f"{m.where}:{i.line} imports {i.target}"
        for m in modules(packages)
        for i in imports(m)
        if i.local and not _reason_near(m, i.line)
    ]
    assert not unexplained, "an import inside a function needs a stated reason:\n" + "\n".join(
        unexplained
    )


def test_no_production_module_outgrows_its_room():
    big = [
        f"{m.where}: {len(m.lines)} lines"
        for m in modules(PRODUCTION + TEST_EQUIPMENT)
        if len(m.lines) > MAX_MODULE_LINES
    ]
    assert not big, f"split these by sub-domain (at most {MAX_MODULE_LINES} lines):\n" + "\n".join(
        big
    )


def test_no_production_function_is_longer_than_a_screen():
    long = [
        f"{m.where}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
        for m in modules(PRODUCTION + TEST_EQUIPMENT)
        for node in ast.walk(m.tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, (
        f"split these into named steps (at most {MAX_FUNCTION_LINES} lines):\n" + "\n".join(long)
    )


def test_no_private_name_is_imported_across_modules():
    ours = set(PRODUCTION + TEST_EQUIPMENT + ("tests", "bench"))
    crossing = [
        f"{m.where}:{i.line} takes {name} from {i.target}"
        for m in modules(PRODUCTION + TEST_EQUIPMENT + ("tests", "bench"))
        for i in imports(m)
        if _top(i.target) in ours
        for name in i.names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not crossing, "a name shared between modules is public:\n" + "\n".join(crossing)


def test_production_never_imports_test_equipment_or_tests():
    wrong = [
        f"{m.where}:{i.line} imports {i.target}"
        for m in modules()
        for i in imports(m)
        if _top(i.target) in (*TEST_EQUIPMENT, "tests", "bench")
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("pure", PURE)
def test_pure_modules_import_no_django(pure):
    ours = [m for m in modules() if m.name == pure or m.name.startswith(pure + ".")]
    assert ours, pure
    wrong = [
        f"{m.where}:{i.line} imports {i.target}"
        for m in ours
        for i in imports(m)
        if _top(i.target) in ("django", "rest_framework", "celery")
        or (_top(i.target) in PRODUCTION and not i.target.startswith(_top(pure)))
    ]
    assert not wrong, "\n".join(wrong)


def _is_tasks_module(name: str) -> bool:
    return name.endswith(".tasks")


def test_only_tasks_modules_import_tasks():
    # Services queue work by the task's name (gpuplatform.dispatch.enqueue), so no
    # service, view or command imports a task object.
    wrong = [
        f"{m.where}:{i.line} imports {i.target}"
        for m in modules()
        for i in imports(m)
        if _is_tasks_module(i.target) and not _is_tasks_module(m.name)
    ]
    assert not wrong, "\n".join(wrong)


def _calls(module: Module, function: str) -> Iterator[ast.Call]:
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == function:
                yield node


def test_every_enqueued_name_is_a_registered_task():
    celery_app.loader.import_default_modules()
    named = {
        (m.where, call.lineno, call.args[0].value)
        for m in modules()
        for call in _calls(m, "enqueue")
        if call.args and isinstance(call.args[0], ast.Constant)
    }
    dynamic = [
        f"{m.where}:{call.lineno}"
        for m in modules()
        for call in _calls(m, "enqueue")
        if not (call.args and isinstance(call.args[0], ast.Constant))
    ]
    assert len(named) > 15  # the services really queue their work through it
    assert not dynamic, "enqueue takes the task's name as written: " + ", ".join(dynamic)
    unknown = [
        f"{where}:{line} {name!r}" for where, line, name in named if name not in celery_app.tasks
    ]
    assert not unknown, "\n".join(unknown)


def _lock_module(module: Module) -> bool:
    return module.name.endswith(".locks")


def test_row_locks_are_taken_in_the_lock_modules():
    # Each app's locks.py writes the order once; a lock taken elsewhere could break it.
    # The placement's claim (FOR UPDATE ... SKIP LOCKED in one UPDATE statement) is the
    # one lock written as SQL, documented in nodes/locks.py.
    elsewhere = [
        f"{m.where}:{call.lineno}"
        for m in modules()
        if not _lock_module(m)
        for call in _calls(m, "select_for_update")
    ]
    advisory = [
        f"{m.where}:{n}"
        for m in modules()
        if not _lock_module(m)
        for n, line in enumerate(m.lines, 1)
        if "advisory_lock" in line or "advisory_unlock" in line
    ]
    raw = [
        f"{m.where}:{n}"
        for m in modules()
        if not _lock_module(m)
        for n, line in enumerate(m.lines, 1)
        if "FOR UPDATE" in line and "#" not in line.split("FOR UPDATE")[0]
    ]
    assert not elsewhere and not advisory, "\n".join(elsewhere + advisory)
    assert {r.split(":")[0] for r in raw} == {"nodes/services/allocations.py"}, raw
    for app in ("tenants", "nodes", "incidents"):
        doc = ast.get_docstring(next(m for m in modules() if m.name == f"{app}.locks").tree)
        assert doc and " -> " in doc, f"{app}/locks.py writes its lock order"


WRITES = {
    "save",
    "delete",
    "create",
    "update",
    "bulk_create",
    "bulk_update",
    "get_or_create",
    "update_or_create",
    "select_for_update",
}


def _orm_receiver(node: ast.AST) -> bool:
    """`X.objects...` or a queryset chain (`.filter(...)`, `.all()`, `get_queryset()`)."""
    while isinstance(node, ast.Attribute | ast.Call):
        if isinstance(node, ast.Attribute) and node.attr == "objects":
            return True
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in (
                "filter",
                "exclude",
                "all",
                "get_queryset",
                "for_tenant",
            ):
                return True
            node = func
        else:
            node = node.value
    return False


def _view_modules() -> list[Module]:
    return [m for m in modules() if m.name.split(".")[-1] == "views" or ".views." in m.name]


def test_views_neither_open_transactions_nor_write_the_orm():
    views = _view_modules()
    assert len(views) >= 8
    wrong = []
    for m in views:
        wrong += [
            f"{m.where}:{i.line} imports transaction"
            for i in imports(m)
            if i.target == "django.db" and "transaction" in i.names
        ]
        for node in ast.walk(m.tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            attr = node.func.attr
            if attr in ("save", "delete", "select_for_update") or (
                attr in WRITES and _orm_receiver(node.func.value)
            ):
                wrong.append(f"{m.where}:{node.lineno} .{attr}()")
    assert not wrong, "a page or the API writes through one service call:\n" + "\n".join(wrong)


def _viewsets(patterns) -> Iterator[type]:
    for pattern in patterns:
        if hasattr(pattern, "url_patterns"):
            yield from _viewsets(pattern.url_patterns)
        else:
            cls = getattr(pattern.callback, "cls", None)
            if cls is not None and issubclass(cls, ViewSetMixin):
                yield cls


def test_api_writes_are_the_projects_own_not_drf_defaults():
    # DRF's create/update/destroy mixins save through the serializer: a write the
    # services never see. Every one the API routes must be overridden to call a service.
    viewsets = set(_viewsets(urlpatterns))
    assert len(viewsets) > 15
    wrong = [
        f"{cls.__module__}.{cls.__name__}.{action}"
        for cls in viewsets
        for action in ("create", "update", "partial_update", "destroy")
        if hasattr(cls, action) and _top(getattr(cls, action).__module__) not in PRODUCTION
    ]
    assert not wrong, "\n".join(sorted(wrong))


# --- services are the write API and nothing else ---------------------------------------------

SERVICE_PACKAGES = ("tenants.services", "nodes.services", "incidents.services")
# Words that put the action first (`apply_findings`, `run_on_node`, `read_nodes`): an
# action's name starts with what it acts on. A list, so it names the usual offenders only.
LEADING_VERBS = frozenset(
    {
        "add", "apply", "build", "check", "compute", "create", "delete", "do", "ensure", "fetch",
        "find", "get", "handle", "load", "make", "mark", "process", "read", "record", "release",
        "remove", "run", "save", "sell", "send", "set", "start", "stop", "store", "update",
    }
)  # fmt: skip


def _service_modules() -> list[Module]:
    return [
        m
        for m in modules()
        if any(m.name == p or m.name.startswith(p + ".") for p in SERVICE_PACKAGES)
    ]


def test_service_modules_define_only_keyword_only_actions():
    """A public function in a services module changes something and is called with names:
    `slice_stop(slice=..., actor=...)`. Reads go to selectors, predicates and labels to the
    models, pure helpers to plain modules; a step kept inside one module is private."""
    assert len(_service_modules()) > 30
    wrong = []
    for m in _service_modules():
        for node in m.tree.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name.startswith("_"):
                continue
            args = node.args
            if args.posonlyargs or args.args or args.vararg:
                wrong.append(f"{m.where}:{node.lineno} {node.name} takes positional arguments")
            first = node.name.split("_")[0]
            if "_" not in node.name or first in LEADING_VERBS:
                wrong.append(f"{m.where}:{node.lineno} {node.name} is not <entity>_<action>")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("package", SERVICE_PACKAGES)
def test_service_packages_export_only_their_actions(package):
    """`from <app>.services import X` names an action: no constant, SQL fragment, class or
    error comes through the package (they are imported from where they live)."""
    module = importlib.import_module(package)
    exported = module.__all__
    assert exported == sorted(exported)
    wrong = []
    for name in exported:
        thing = getattr(module, name)
        if not inspect.isfunction(thing) or not thing.__module__.startswith(package):
            wrong.append(f"{name}: not one of the package's own functions")
            continue
        kinds = {p.kind for p in inspect.signature(thing).parameters.values()}
        if kinds - {inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD}:
            wrong.append(f"{name}: takes positional arguments")
    public = {n for n in vars(module) if not n.startswith("_")}
    submodules = {n for n in public if inspect.ismodule(getattr(module, n))}
    assert public - submodules == set(exported), "the package names only what __all__ lists"
    assert not wrong, "\n".join(wrong)


def _asks_is_staff(test: ast.AST) -> bool:
    for node in ast.walk(test):
        if isinstance(node, ast.Attribute) and node.attr == "is_staff":
            return True
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and any(isinstance(a, ast.Constant) and a.value == "is_staff" for a in node.args)
        ):
            return True
    return False


def test_services_ask_who_is_ops_one_way():
    """Whether an actor is ops is asked through gpuplatform.ops (is_ops, require_ops), so
    an anonymous or missing actor is never mistaken either way."""
    wrong = [
        f"{m.where}:{node.lineno} {ast.unparse(node.test)[:80]}"
        for m in _service_modules()
        for node in ast.walk(m.tree)
        if isinstance(node, ast.If | ast.IfExp | ast.While | ast.Assert)
        and _asks_is_staff(node.test)
    ]
    assert not wrong, "use gpuplatform.ops.is_ops / require_ops:\n" + "\n".join(wrong)

"""The subset of Go text/template that `docker ... --format` callers use.

Supported actions: `{{.}}`, `{{.A.B}}`, `{{json X}}`, `{{index X "k"}}`, `{{join X ","}}`,
`{{upper X}}`, `{{lower X}}`, `{{len X}}`, `{{printf "%s" X}}`, `{{.Label "k"}}` (docker
ps), pipelines (`{{.Config | json}}`) and the `table` prefix (handled by the caller).
"""

from __future__ import annotations

import json
import re
from typing import Any

_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)
_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|`[^`]*`|\||[^\s|]+')


class TemplateError(ValueError):
    pass


class Missing:
    def __str__(self) -> str:
        return "<no value>"


MISSING = Missing()


def go_json(value: Any, indent: int | None = None) -> str:
    """json.Marshal: compact, HTML-escaped like Go's encoder."""
    text = json.dumps(
        value,
        ensure_ascii=False,
        indent=indent,
        separators=(",", ":") if indent is None else (",", ": "),
    )
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def go_str(value: Any) -> str:
    if isinstance(value, Missing):
        return "<no value>"
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if value != int(value) else str(int(value))
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_str(v)}" for k, v in sorted(value.items())) + "]"
    if isinstance(value, list | tuple):
        return "[" + " ".join(go_str(v) for v in value) + "]"
    return str(value)


def _path(data: Any, path: str) -> Any:
    cur = data
    for part in [p for p in path.split(".") if p]:
        cur = cur.get(part, MISSING) if isinstance(cur, dict) else getattr(cur, part, MISSING)
        if cur is MISSING:
            return MISSING
    return cur


def _literal(tok: str) -> Any:
    if tok.startswith('"'):
        return json.loads(tok)
    if tok.startswith("`"):
        return tok[1:-1]
    if tok in ("true", "false"):
        return tok == "true"
    if tok == "nil":
        return None
    try:
        return int(tok)
    except ValueError:
        pass
    try:
        return float(tok)
    except ValueError as e:
        raise TemplateError(f'function "{tok}" not defined') from e


def _printf(fmt: str, *args: Any) -> str:
    out = []
    it = iter(args)
    i = 0
    while i < len(fmt):
        c = fmt[i]
        if c == "%" and i + 1 < len(fmt):
            verb = fmt[i + 1]
            i += 2
            if verb == "%":
                out.append("%")
            elif verb == "q":
                out.append(json.dumps(go_str(next(it, ""))))
            else:
                out.append(go_str(next(it, "")))
            continue
        out.append(c)
        i += 1
    return "".join(out)


class _Eval:
    def __init__(self, data: Any, methods: dict[str, Any]):
        self.data = data
        self.methods = methods

    def arg(self, tok: str) -> Any:
        if tok == ".":
            return self.data
        if tok.startswith("."):
            return _path(self.data, tok)
        return _literal(tok)

    def command(self, toks: list[str], piped: list[Any]) -> Any:
        head, rest = toks[0], toks[1:]
        if head.startswith("."):
            name = head[1:]
            if name in self.methods and "." not in name:
                return self.methods[name](*[self.arg(t) for t in rest], *piped)
            if rest:
                raise TemplateError(f"can't give argument to non-function {head}")
            return self.arg(head)
        args = [self.arg(t) for t in rest] + piped
        if head == "json":
            return go_json(args[0] if args else None)
        if head == "index":
            cur = args[0]
            for key in args[1:]:
                if isinstance(cur, dict):
                    cur = cur.get(key, MISSING)
                elif isinstance(cur, list | tuple):
                    cur = cur[int(key)]
                else:
                    raise TemplateError("can't index item")
            return cur
        if head == "join":
            return str(args[1]).join(go_str(x) for x in args[0] or [])
        if head == "upper":
            return go_str(args[0]).upper()
        if head == "lower":
            return go_str(args[0]).lower()
        if head == "title":
            return go_str(args[0]).title()
        if head == "len":
            return len(args[0])
        if head == "printf":
            return _printf(str(args[0]), *args[1:])
        if head == "println":
            return " ".join(go_str(a) for a in args) + "\n"
        if head == "print":
            return "".join(go_str(a) for a in args)
        if len(toks) == 1 and not piped:
            return self.arg(head)
        raise TemplateError(f'function "{head}" not defined')

    def pipeline(self, expr: str) -> Any:
        tokens = _TOKEN.findall(expr)
        if not tokens:
            raise TemplateError("missing value for command")
        cmds: list[list[str]] = [[]]
        for t in tokens:
            if t == "|":
                cmds.append([])
            else:
                cmds[-1].append(t)
        value: Any = None
        for k, cmd in enumerate(cmds):
            if not cmd:
                raise TemplateError("missing command in pipeline")
            value = self.command(cmd, [] if k == 0 else [value])
        return value


def render(template: str, data: Any, methods: dict[str, Any] | None = None) -> str:
    ev = _Eval(data, methods or {})
    out: list[str] = []
    pos = 0
    for m in _ACTION.finditer(template):
        text = template[pos : m.start()]
        if m.group(1):
            text = text.rstrip()
        out.append(text)
        expr = m.group(2)
        if expr.startswith("/*"):
            pass
        else:
            out.append(go_str(ev.pipeline(expr)))
        pos = m.end()
        if m.group(3):
            while pos < len(template) and template[pos].isspace():
                pos += 1
    out.append(template[pos:])
    return "".join(out)


def unescape_format(fmt: str) -> str:
    """docker turns literal `\\t` / `\\n` in --format into tabs/newlines."""
    return fmt.replace("\\t", "\t").replace("\\n", "\n")

"""A small POSIX-shell look-alike: how an SSH exec string is run on an emulated node.

sshd hands the exec string to the user's login shell (`bash -c`), so the emulator does
what a shell does with it: it splits on UNQUOTED operators (`;`, `&`, `&&`, `||`, `|`,
newlines, parentheses), runs command substitutions (`$(...)`, backticks, also inside
double quotes), expands `$VAR`, applies simple redirections (`>`, `>>`, `<`, `2>&1`) and
runs every resulting simple command. Each executed simple command is reported to an audit
callback, so a quoting bug in the caller (tenant input reaching the shell unquoted) shows
up as extra commands. Single quotes protect everything, as in a real shell.

This is deliberately shell-LIKE parsing (the emulator plays the far end of SSH); nothing
here ever reaches a real shell or `subprocess`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

# --- lexing

_OPERATORS = ("&&", "||", ";;", ">>", ">&", "<&", "&>", "<<", "|", "&", ";", "(", ")", "<", ">")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class ShellSyntaxError(Exception):
    pass


@dataclass
class Lit:
    text: str
    quoted: bool


@dataclass
class Sub:
    script: str
    quoted: bool


@dataclass
class Var:
    name: str
    quoted: bool
    default: str | None = None


Part = Lit | Sub | Var


@dataclass
class Word:
    parts: list[Part] = field(default_factory=list)

    def add_lit(self, text: str, quoted: bool) -> None:
        last = self.parts[-1] if self.parts else None
        if isinstance(last, Lit) and last.quoted == quoted:
            last.text += text
        else:
            self.parts.append(Lit(text, quoted))

    def plain(self) -> str | None:
        """The word's text if it is a single unquoted literal, else None."""
        if len(self.parts) == 1 and isinstance(self.parts[0], Lit) and not self.parts[0].quoted:
            return self.parts[0].text
        return None


@dataclass
class Op:
    op: str


def _find_closing_paren(src: str, i: int) -> int:
    """`src[i]` is just after `$(`: index of the matching `)`."""
    depth = 1
    n = len(src)
    while i < n:
        c = src[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            j = src.find("'", i + 1)
            if j < 0:
                raise ShellSyntaxError("unexpected EOF while looking for matching `''")
            i = j + 1
            continue
        if c == '"':
            i += 1
            while i < n and src[i] != '"':
                if src[i] == "\\":
                    i += 1
                elif src[i] == "$" and src[i + 1 : i + 2] == "(":
                    i = _find_closing_paren(src, i + 2)
                i += 1
            i += 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ShellSyntaxError("unexpected EOF while looking for matching `)'")


def _find_backtick(src: str, i: int) -> tuple[str, int]:
    """`src[i]` is just after a backtick: (inner script, index of the closing backtick)."""
    out = []
    n = len(src)
    while i < n:
        c = src[i]
        if c == "\\" and i + 1 < n and src[i + 1] in "`$\\":
            out.append(src[i + 1])
            i += 2
            continue
        if c == "`":
            return "".join(out), i
        out.append(c)
        i += 1
    raise ShellSyntaxError("unexpected EOF while looking for matching ``'")


def _lex_dollar(src: str, i: int, word: Word, quoted: bool) -> int:
    """`src[i] == '$'`: adds the expansion to `word`, returns the next index."""
    nxt = src[i + 1 : i + 2]
    if nxt == "(":
        if src[i + 2 : i + 3] == "(":  # $(( arithmetic )): not evaluated
            end = _find_closing_paren(src, i + 3)
            end2 = src.find(")", end + 1)
            word.add_lit("0", quoted)
            return (end2 if end2 >= 0 else end) + 1
        end = _find_closing_paren(src, i + 2)
        word.parts.append(Sub(src[i + 2 : end], quoted))
        return end + 1
    if nxt == "{":
        end = src.find("}", i + 2)
        if end < 0:
            raise ShellSyntaxError("bad substitution")
        body = src[i + 2 : end]
        default = None
        if ":-" in body:
            body, default = body.split(":-", 1)
        word.parts.append(Var(body, quoted, default))
        return end + 1
    m = _NAME_RE.match(src, i + 1)
    if m:
        word.parts.append(Var(m.group(0), quoted))
        return m.end()
    if nxt and nxt in "?$#@*!-0123456789":
        word.parts.append(Var(nxt, quoted))
        return i + 2
    word.add_lit("$", quoted)
    return i + 1


def lex(src: str) -> list[Word | Op]:
    return _Lexer(src).run()


class _Lexer:
    """One pass over a script: words (literal, quoted and expanded parts) and operators."""

    def __init__(self, src: str) -> None:
        self.src = src
        self.n = len(src)
        self.i = 0
        self.tokens: list[Word | Op] = []
        self.word: Word | None = None  # the word being read, if any

    def run(self) -> list[Word | Op]:
        while self.i < self.n:
            self._step(self.src[self.i])
        self._flush()
        return self.tokens

    def _flush(self) -> None:
        if self.word is not None:
            self.tokens.append(self.word)
            self.word = None

    def _current(self) -> Word:
        if self.word is None:
            self.word = Word()
        return self.word

    def _step(self, c: str) -> None:
        src, i = self.src, self.i
        if c in " \t\r":
            self._flush()
            self.i += 1
        elif c == "\n":
            self._flush()
            self.tokens.append(Op("\n"))
            self.i += 1
        elif c == "#" and self.word is None:
            j = src.find("\n", i)
            self.i = self.n if j < 0 else j
        elif c == "\\":
            if i + 1 < self.n and src[i + 1] == "\n":  # a line continuation
                self.i += 2
                return
            self._current().add_lit(src[i + 1 : i + 2] or "\\", True)
            self.i += 2
        elif c == "'":
            j = src.find("'", i + 1)
            if j < 0:
                raise ShellSyntaxError("unexpected EOF while looking for matching `''")
            self._current().add_lit(src[i + 1 : j], True)
            self.i = j + 1
        elif c == '"':
            self._double_quoted()
        elif c == "$":
            self.i = _lex_dollar(src, i, self._current(), False)
        elif c == "`":
            word = self._current()
            inner, j = _find_backtick(src, i + 1)
            word.parts.append(Sub(inner, False))
            self.i = j + 1
        elif c in ";&|()<>":
            self._operator()
        else:
            self._current().add_lit(c, False)
            self.i += 1

    def _double_quoted(self) -> None:
        """From an opening double quote past its closing one: `$` and backticks expand,
        a backslash escapes only what it escapes in a shell."""
        src, n = self.src, self.n
        word = self._current()
        word.add_lit("", True)
        i = self.i + 1
        buf: list[str] = []
        while True:
            if i >= n:
                raise ShellSyntaxError("unexpected EOF while looking for matching `\"'")
            d = src[i]
            if d == '"':
                i += 1
                break
            if d == "\\" and i + 1 < n and src[i + 1] in '$`"\\\n':
                if src[i + 1] != "\n":
                    buf.append(src[i + 1])
                i += 2
            elif d == "$":
                word.add_lit("".join(buf), True)
                buf = []
                i = _lex_dollar(src, i, word, True)
            elif d == "`":
                word.add_lit("".join(buf), True)
                buf = []
                inner, j = _find_backtick(src, i + 1)
                word.parts.append(Sub(inner, True))
                i = j + 1
            else:
                buf.append(d)
                i += 1
        word.add_lit("".join(buf), True)
        self.i = i

    def _operator(self) -> None:
        op = next(o for o in _OPERATORS if self.src.startswith(o, self.i))
        # `2>file`, `2>&1`: a word of digits right before a redirection is its fd
        fd = self.word.plain() if self.word is not None else None
        if op[0] in "<>" and fd is not None and fd.isdigit():
            self.tokens.append(Op("fd:" + fd))
            self.word = None
        self._flush()
        self.tokens.append(Op(op))
        self.i += len(op)


# --- parsing


@dataclass
class Redirect:
    fd: int
    op: str  # ">", ">>", "<", ">&", "&>"
    target: Word


@dataclass
class Simple:
    words: list[Word] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)


Pipeline = list[Simple]
AndOr = list[tuple[str | None, Pipeline]]


def parse(src: str) -> list[AndOr]:
    tokens = lex(src)
    script: list[AndOr] = []
    andor: AndOr = []
    pipeline: Pipeline = []
    simple = Simple()
    connector: str | None = None
    pending_fd: int | None = None
    i = 0

    def end_simple() -> None:
        nonlocal simple
        if simple.words or simple.redirects:
            pipeline.append(simple)
        simple = Simple()

    def end_pipeline(next_connector: str | None) -> None:
        nonlocal pipeline, connector
        end_simple()
        if pipeline:
            andor.append((connector, pipeline))
        pipeline = []
        connector = next_connector

    def end_andor() -> None:
        nonlocal andor, connector
        end_pipeline(None)
        if andor:
            script.append(andor)
        andor = []
        connector = None

    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if isinstance(tok, Word):
            simple.words.append(tok)
            continue
        op = tok.op
        if op.startswith("fd:"):
            pending_fd = int(op[3:])
            continue
        if op == "|":
            end_simple()
        elif op in ("&&", "||"):
            end_pipeline(op)
        elif op in (";", "&", "\n", "(", ")", ";;"):
            end_andor()
        elif op in (">", ">>", "<", ">&", "<&", "&>", "<<"):
            target = tokens[i] if i < len(tokens) else None
            if not isinstance(target, Word):
                raise ShellSyntaxError("syntax error near unexpected token `newline'")
            i += 1
            fd = pending_fd if pending_fd is not None else (0 if op in ("<", "<&", "<<") else 1)
            simple.redirects.append(Redirect(fd, op, target))
        pending_fd = None
    end_andor()
    return script


# --- running


class StdinSource:
    """The exec channel's stdin, read lazily (only when a command actually reads stdin)."""

    def __init__(self, reader: Callable[[], bytes] | None = None, data: bytes | None = None):
        self._reader = reader
        self._data = data

    def read(self) -> bytes:
        if self._data is None:
            self._data = self._reader() if self._reader else b""
        data, self._data = self._data, b""  # a stream: the first reader consumes it
        return data


@dataclass
class Invocation:
    argv: list[str]
    env: dict[str, str]
    stdin: StdinSource
    stdout: bytearray
    stderr: bytearray
    shell: Shell

    def out(self, text: str | bytes) -> None:
        self.stdout += text.encode() if isinstance(text, str) else text

    def err(self, text: str | bytes) -> None:
        self.stderr += text.encode() if isinstance(text, str) else text


Handler = Callable[[Invocation], int]


class ExitShell(Exception):  # noqa: N818 - control flow, like the `exit` builtin
    def __init__(self, status: int):
        self.status = status


@dataclass
class Result:
    status: int
    stdout: bytes
    stderr: bytes


class Shell:
    """One shell session (one exec). `lookup(name)` returns the handler of a command."""

    MAX_DEPTH = 8

    def __init__(
        self,
        lookup: Callable[[str], Handler | None],
        env: dict[str, str],
        audit: Callable[[list[str]], None],
        files: dict[str, bytes],
        *,
        max_output: int = 4 * 1024 * 1024,
    ):
        self.lookup = lookup
        self.vars = dict(env)
        self.audit = audit
        self.files = files
        self.max_output = max_output
        self.last_status = 0
        self.depth = 0

    # ---------------------------------------------------------------- entry points
    def run(self, script: str, stdin: StdinSource) -> Result:
        out, err = bytearray(), bytearray()
        try:
            status = self._run_script(script, stdin, out, err)
        except ExitShell as e:
            status = e.status
        return Result(status, bytes(out[: self.max_output]), bytes(err[: self.max_output]))

    def run_nested(self, script: str, inv: Invocation) -> int:
        """`sh -c SCRIPT` and friends: a child shell with the same node."""
        if self.depth >= self.MAX_DEPTH:
            inv.err("bash: maximum nesting level exceeded\n")
            return 1
        self.depth += 1
        try:
            return self._run_script(script, inv.stdin, inv.stdout, inv.stderr)
        except ExitShell as e:
            return e.status
        finally:
            self.depth -= 1

    def run_argv(self, argv: list[str], inv: Invocation, env: dict[str, str] | None = None) -> int:
        """Run an argv directly (what `timeout`, `env`, `exec` do): not a new shell command."""
        sub = Invocation(argv, env or inv.env, inv.stdin, inv.stdout, inv.stderr, self)
        return self._dispatch(sub)

    # ---------------------------------------------------------------- internals
    def _run_script(self, script: str, stdin: StdinSource, out: bytearray, err: bytearray) -> int:
        try:
            ast = parse(script)
        except ShellSyntaxError as e:
            err += f"bash: -c: line 1: {e}\n".encode()
            self.last_status = 2
            return 2
        status = 0
        for andor in ast:
            for connector, pipeline in andor:
                if connector == "&&" and status != 0:
                    continue
                if connector == "||" and status == 0:
                    continue
                status = self._run_pipeline(pipeline, stdin, out, err)
                self.last_status = status
        return status

    def _run_pipeline(
        self, pipeline: Pipeline, stdin: StdinSource, out: bytearray, err: bytearray
    ) -> int:
        source = stdin
        status = 0
        for k, simple in enumerate(pipeline):
            last = k == len(pipeline) - 1
            buf = out if last else bytearray()
            status = self._run_simple(simple, source, buf, err)
            # output past the limit is dropped (the commands still run, as on a real host)
            for buf_ in (out, err):
                if len(buf_) > self.max_output:
                    del buf_[self.max_output :]
            if not last:
                source = StdinSource(data=bytes(buf))
        return status

    def _run_simple(
        self, simple: Simple, stdin: StdinSource, out: bytearray, err: bytearray
    ) -> int:
        fields: list[str] = []
        assigns: dict[str, str] = {}
        for w in simple.words:
            plain0 = w.parts[0].text if w.parts and isinstance(w.parts[0], Lit) else ""
            if (
                not fields
                and w.parts
                and isinstance(w.parts[0], Lit)
                and not w.parts[0].quoted
                and _ASSIGN_RE.match(plain0)
            ):
                name, _, rest = plain0.partition("=")
                value_word = Word([Lit(rest, True), *w.parts[1:]])
                assigns[name] = "".join(self._expand(value_word, stdin, err))
                continue
            fields.extend(self._expand(w, stdin, err))
        cmd_out, cmd_err = bytearray(), bytearray()
        routes: dict[int, tuple[str, str | None, bool]] = {
            1: ("out", None, False),
            2: ("err", None, False),
        }
        cmd_stdin = stdin
        for r in simple.redirects:
            target = "".join(self._expand(r.target, stdin, err))
            if r.op in (">&", "<&") and target.isdigit():
                routes[r.fd] = routes.get(int(target), ("out", None, False))
            elif r.op == "&>":
                routes[1] = routes[2] = ("file", target, False)
            elif r.op in (">", ">>", ">&"):
                routes[r.fd] = ("file", target, r.op == ">>")
            elif r.op in ("<", "<<"):
                source = self._path(target)
                if source not in self.files and source != "/dev/null":
                    err += f"bash: {target}: No such file or directory\n".encode()
                    return 1
                cmd_stdin = StdinSource(data=self.files.get(source, b""))
        if not fields:
            self.vars.update(assigns)
            status = 0
        else:
            self.audit(list(fields))
            env = {**self.vars, **assigns} if assigns else self.vars
            inv = Invocation(fields, env, cmd_stdin, cmd_out, cmd_err, self)
            status = self._dispatch(inv)
        written: set[str] = set()
        for fd, data in ((1, cmd_out), (2, cmd_err)):
            kind, path, append = routes.get(fd, ("out", None, False))
            if kind == "out":
                out += data
            elif kind == "err":
                err += data
            elif path is not None:  # `> file` with no output still creates the file
                self._write_file(path, bytes(data), append or path in written)
                written.add(path)
        self.last_status = status
        return status

    def _dispatch(self, inv: Invocation) -> int:
        name = inv.argv[0]
        handler = self.lookup(name)
        if handler is None:
            inv.err(f"bash: {name}: command not found\n")
            return 127
        try:
            return handler(inv)
        except ExitShell:
            raise
        except Exception as e:  # an emulator bug must not kill the SSH server
            inv.err(f"{name}: emulator error: {type(e).__name__}: {e}\n")
            return 1

    def _expand(self, word: Word, stdin: StdinSource, err: bytearray) -> list[str]:
        fields = [""]
        quoted_any = False
        for k, part in enumerate(word.parts):
            if isinstance(part, Lit):
                text = part.text
                if k == 0 and not part.quoted and (text == "~" or text.startswith("~/")):
                    text = self.vars.get("HOME", "/") + text[1:]
                fields[-1] += text
                quoted_any = quoted_any or part.quoted
                continue
            if isinstance(part, Var):
                value = self._var(part.name)
                if not value and part.default is not None:
                    value = part.default
            else:
                sub_out = bytearray()
                self.depth += 1
                try:
                    if self.depth > self.MAX_DEPTH:
                        err += b"bash: maximum nesting level exceeded\n"
                    else:
                        self._run_script(part.script, stdin, sub_out, err)
                except ExitShell:
                    pass
                finally:
                    self.depth -= 1
                value = sub_out.decode(errors="replace").rstrip("\n")
            if part.quoted:
                fields[-1] += value
                quoted_any = True
            else:
                pieces = value.split()
                if not pieces:
                    continue
                if value[:1].isspace() and fields[-1]:
                    fields.append("")
                fields[-1] += pieces[0]
                for p in pieces[1:]:
                    fields.append(p)
                if value[-1:].isspace():
                    fields.append("")
        if fields[-1] == "" and len(fields) > 1:
            fields.pop()
        if fields == [""] and not quoted_any:
            return []
        return fields

    def _var(self, name: str) -> str:
        if name == "?":
            return str(self.last_status)
        if name == "$":
            return self.vars.get("__PID", "4242")
        if name in ("#", "@", "*"):
            return "0" if name == "#" else ""
        if name == "0":
            return "bash"
        return self.vars.get(name, "")

    def _path(self, path: str) -> str:
        if not path.startswith("/"):
            path = self.vars.get("HOME", "/").rstrip("/") + "/" + path
        parts: list[str] = []
        for p in path.split("/"):
            if p in ("", "."):
                continue
            if p == "..":
                if parts:
                    parts.pop()
            else:
                parts.append(p)
        return "/" + "/".join(parts)

    def _write_file(self, path: str, data: bytes, append: bool) -> None:
        p = self._path(path)
        if p in ("/dev/null", "/dev/stdout", "/dev/stderr"):
            return
        self.files[p] = (self.files.get(p, b"") if append else b"") + data

    def path(self, path: str) -> str:
        return self._path(path)

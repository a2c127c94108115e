"""Whether a launch command sets, unsets or clears a variable on the reserved list
(nodes.isolation): `env NAME=v prog`, `env -u NAME`, `env -i`, `NAME=v prog`, `export`,
`unset`, `declare -x`, `readonly`... in the argv itself and in the scripts it hands a shell
(`sh -c '...'`, `bash -lc`, `busybox sh -c`, nested ones too).

This is a courtesy, not the boundary. It refuses the plain ways of writing it, so a tenant
learns why at launch rather than from a refused allocation; a process can always change
its own environment in ways no reading of its command foresees (a script in the image,
`python -c`, a shell opened inside the slice). What holds is on the node: the quota
library takes its settings from a read-only file the node provides and is loaded by a
read-only /etc/ld.so.preload, so nothing a process does to its environment lifts its quota.

Names are matched exactly: the shell, the loader and the quota library all read them so,
and lower-case names are a script's ordinary locals (the environment field of a launch is
case-blind instead, because there a near-miss spelling can only be a mistake or a probe).
Pure Python: no Django.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Sequence
from typing import NamedTuple

from . import isolation


class CommandRefusal(NamedTuple):
    name: str  # the variable, as the command writes it
    reason: str  # why no tenant may set it: nodes.isolation's reason
    how: str  # the part of the command that does it

    @property
    def message(self) -> str:
        return f"{self.name} cannot be set or unset by the command ({self.how}): {self.reason}."


SHELLS = frozenset(
    {"sh", "bash", "rbash", "dash", "ash", "hush", "zsh", "ksh", "ksh93", "mksh", "lksh"}
    | {"pdksh", "oksh", "loksh", "yash", "posh"}
)
# Builtins whose operands are variables they set, export, un-export or shadow.
DECLARERS = frozenset({"export", "readonly", "declare", "typeset", "local"})
# Shell words after which the next word is again a command.
KEYWORDS = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "while", "until"})
KEYWORDS |= {"!", "{", "}", "time", "esac", "coproc"}
# With an empty environment the quota library's variables go too; the loader's is the
# one every dynamically linked program depends on.
CLEARED = "LD_PRELOAD"
DYNAMIC = "a name made when the command runs could be any reserved one"
MAX_DEPTH = 24  # commands inside commands; deeper ones are only read word by word

_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?\+?=")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `${NAME=value}` and `${NAME:=value}` assign NAME when it is unset or empty.
_DEFAULT_ASSIGNMENT = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?=")
_PUNCTUATION = ";&|()<>\n"
_WORD_BREAKS = frozenset(" \t\r" + _PUNCTUATION)  # an escaped one is a chunk of two
_SHELL_SYNTAX = re.compile(r"[\s;&|]")
# GNU env's long options (any unambiguous prefix is accepted, as getopt_long does).
_ENV_LONG = (
    "ignore-environment",
    "null",
    "unset",
    "chdir",
    "split-string",
    "argv0",
    "debug",
    "help",
    "version",
    "block-signal",
    "default-signal",
    "ignore-signal",
    "list-signal-handling",
)
_ENV_LONG_VALUE = frozenset({"unset", "chdir", "split-string", "argv0"})
_ENV_SHORT_VALUE = frozenset("uCSaP")  # -P: BSD env's search path


# Every argv the platform runs in a container (a launch's command, an image's default, the
# preflight probe's) is run without a shell: $(...) and backticks there would not be
# expanded, so they are refused in all of them alike.
UNEXPANDED = ("$(", "`")
UNEXPANDED_REFUSAL = (
    "The command runs without a shell, so $(...) and backticks would not be expanded: "
    "put the script in your image and call it instead."
)


def unexpanded_syntax(argv: Sequence[str]) -> bool:
    """Whether an argument holds shell syntax that nothing would expand."""
    return any(mark in item for item in argv for mark in UNEXPANDED)


def command_reserved(argv: Sequence[str]) -> CommandRefusal | None:
    """The first reserved variable the command sets, unsets or clears, or None.

    The argv runs without a shell, but the image's entrypoint may be one: a first
    argument that reads as a script is also read as one."""
    words = [str(word) for word in argv]
    if not words:
        return None
    found = _simple(words, expands=False, depth=0)
    if found is None and _SHELL_SYNTAX.search(words[0]):
        found = _script(words[0], depth=1)
    return found


def _short(word: str) -> str:
    return word if len(word) <= 60 else word[:57] + "..."


def _named(name: str, how: str, *, expands: bool) -> CommandRefusal | None:
    if expands and "$" in name:
        return CommandRefusal(name, DYNAMIC, how)
    reason = isolation.reserved_reason(name)
    return CommandRefusal(name, reason, how) if reason else None


def _cleared(how: str) -> CommandRefusal:
    return CommandRefusal(
        CLEARED,
        isolation.reserved_reason(CLEARED) or "",
        f"{how} clears the whole environment, {CLEARED} with it",
    )


def _simple(words: list[str], *, expands: bool, depth: int) -> CommandRefusal | None:
    """One simple command: its leading assignments, then what its program does."""
    if depth > MAX_DEPTH:
        return _loose(" ".join(words))
    while words and (words[0] in KEYWORDS or words[0] == "function"):
        words = words[2:] if words[0] == "function" else words[1:]
    while words and (match := _ASSIGNMENT.match(words[0])):
        found = _named(match.group(1), f"{_short(words[0])} before a command", expands=expands)
        if found:
            return found
        words = words[1:]
    if not words:
        return None
    program, args = posixpath.basename(words[0]), words[1:]
    if program == "env":
        return _env(args, expands=expands, depth=depth)
    if program in SHELLS:
        script = _shell_script(args)
        return None if script is None else _script(script, depth=depth + 1)
    if program in DECLARERS:
        return _declare(program, args, expands=expands)
    if program == "unset":
        return _unset(args, expands=expands)
    if program in ("eval", "trap"):
        # eval runs its words as a script; trap runs its first operand as one later
        operands = [w for w in args if w != "--"]
        if program == "trap":
            operands = operands[:1] if operands and not operands[0].startswith("-") else []
        return _script(" ".join(operands), depth=depth + 1) if operands else None
    if program in ("command", "builtin", "exec"):
        return _prefix(program, args, expands=expands, depth=depth)
    if program in ("for", "select") and args:
        return _named(args[0], f"{program} {_short(args[0])} in ...", expands=expands)
    if program in ("read", "printf", "getopts", "let"):
        return _assigning_builtin(program, args, expands=expands)
    # Any other program may run another with its remaining words (nohup, timeout, nice,
    # tini --, busybox, chroot...): the first `env` or shell among them is read as one.
    for at in range(1, len(words)):
        if posixpath.basename(words[at]) in SHELLS | {"env"}:
            return _simple(words[at:], expands=expands, depth=depth + 1)
    return None


def _env(args: list[str], *, expands: bool, depth: int) -> CommandRefusal | None:
    words = list(args)
    at = 0
    while at < len(words):
        word = words[at]
        if word == "-":
            return _cleared("env -")
        if word == "--":
            at += 1
            break
        if not word.startswith("-"):
            break
        value: str | None = None
        option = ""
        if word.startswith("--"):
            name, eq, given = word[2:].partition("=")
            known = [o for o in _ENV_LONG if o == name] or [
                o for o in _ENV_LONG if o.startswith(name)
            ]
            if "ignore-environment" in known:  # an ambiguous prefix fails; refused anyway
                return _cleared(f"env {_short(word)}")
            option = known[0] if len(known) == 1 else ""
            if option in _ENV_LONG_VALUE:
                value = given if eq else (words[at + 1] if at + 1 < len(words) else "")
                at += 0 if eq else 1
        else:
            for index, letter in enumerate(word[1:], 1):
                if letter == "i":
                    return _cleared(f"env {_short(word)}")
                if letter in _ENV_SHORT_VALUE:
                    option = {"u": "unset", "S": "split-string"}.get(letter, letter)
                    value = word[index + 1 :]
                    if not value:
                        value = words[at + 1] if at + 1 < len(words) else ""
                        at += 1
                    break
        at += 1
        if option == "unset" and value is not None:
            found = _named(value, f"env -u {_short(value)}", expands=expands)
            if found:
                return found
        if option == "split-string" and value:
            words[at:at] = _split(value)  # env -S splits its string into more arguments
    while at < len(words) and "=" in words[at]:
        name = words[at].partition("=")[0]
        found = _named(name, f"env {_short(words[at])}", expands=expands)
        if found:
            return found
        at += 1
    if at >= len(words):  # an option's value can be the last word, or missing
        return None
    if expands and words[at].startswith("$"):
        return CommandRefusal(words[at], DYNAMIC, f"env {_short(words[at])}")
    return _simple(words[at:], expands=expands, depth=depth + 1)


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def _shell_script(args: list[str]) -> str | None:
    """The script of `sh [options] -c SCRIPT [name [args...]]`, or None (a script file,
    or standard input, which no check at launch can read)."""
    given = False
    at = 0
    while at < len(args):
        word = args[at]
        if word in ("--", "-"):
            at += 1
            break
        if word.startswith("--"):
            at += 2 if word in ("--rcfile", "--init-file") else 1
            continue
        if len(word) > 1 and word[0] in "-+":
            given = given or (word[0] == "-" and "c" in word)
            at += 2 if ("o" in word or "O" in word) else 1  # -o/-O take the next word
            continue
        break
    return args[at] if given and at < len(args) else None


def _declare(program: str, args: list[str], *, expands: bool) -> CommandRefusal | None:
    flags: list[str] = []
    operands: list[str] = []
    for word in args:
        if not operands and len(word) > 1 and word[0] in "-+" and word != "--":
            flags.append(word)
        elif operands or word != "--":
            operands.append(word)
    options = "".join(flag[1:] for flag in flags)
    if "f" in options or "F" in options:
        return None  # functions, not variables
    if "p" in options and not any("=" in w for w in operands):
        return None  # it only prints
    said = " ".join([program, *flags])
    for word in operands:
        name, eq, value = word.partition("=")
        name = name.rstrip("+").split("[", 1)[0]
        found = _named(name, f"{said} {_short(word)}", expands=expands)
        if found is None and "n" in options and eq:  # a nameref: `declare -n r=NAME`
            found = _named(value, f"{said} {_short(word)}", expands=expands)
        if found:
            return found
    return None


def _unset(args: list[str], *, expands: bool) -> CommandRefusal | None:
    options = "".join(w[1:] for w in args if w.startswith("-") and w != "--")
    if "f" in options:
        return None
    for word in args:
        if word.startswith("-"):
            continue
        found = _named(word, f"unset {_short(word)}", expands=expands)
        if found:
            return found
    return None


def _prefix(program: str, args: list[str], *, expands: bool, depth: int) -> CommandRefusal | None:
    """`command`, `builtin` and `exec` run the rest as a command (builtins included)."""
    at = 0
    while at < len(args) and args[at].startswith("-") and args[at] != "-":
        word = args[at]
        at += 1
        if word == "--":
            break
        if program == "command" and ("v" in word or "V" in word):
            return None  # only says what the name is
        if program == "exec" and "c" in word:
            return _cleared(f"exec {_short(word)}")
        if program == "exec" and word.endswith("a"):
            at += 1  # -a NAME: the program's argv[0]
    return _simple(args[at:], expands=expands, depth=depth + 1) if at < len(args) else None


def _assigning_builtin(program: str, args: list[str], *, expands: bool) -> CommandRefusal | None:
    """read NAME..., printf -v NAME, getopts OPTSTRING NAME, let NAME=EXPR."""
    names: list[str] = []
    if program == "let":
        names = [m.group() for w in args if (m := _NAME.match(w))]
    elif program == "getopts":
        names = args[1:2]
    else:
        value_options = "v" if program == "printf" else "adinNptu"
        at = 0
        while at < len(args) and args[at].startswith("-") and args[at] != "--":
            word = args[at]
            at += 1
            for index, letter in enumerate(word[1:], 1):
                if letter in value_options:
                    value = word[index + 1 :]
                    if not value and at < len(args):
                        value, at = args[at], at + 1
                    if letter in "av":  # read -a NAME, printf -v NAME
                        names.append(value)
                    break
        if program == "read":
            names += [w for w in args[at:] if w != "--"]
    for name in names:
        found = _named(name, f"{program} {_short(name)}", expands=expands)
        if found:
            return found
    return None


def _tokens(script: str) -> list[str]:
    lexer = shlex.shlex(script, posix=True, punctuation_chars=_PUNCTUATION)
    lexer.whitespace = " \t\r"  # a newline ends a command, like ;
    lexer.whitespace_split = True
    # Comments are gone already: shlex would also swallow the newline that ends one,
    # joining the next line's command onto the comment.
    lexer.commenters = ""
    return list(lexer)


def _without_comments(script: str) -> str:
    """The script without its comments: a # that starts a word outside quotes, to the end
    of its line (the newline stays: it ends a command)."""
    out: list[str] = []
    quote = ""
    at = 0
    while at < len(script):
        char = script[at]
        if char == "\\" and quote != "'":
            out.append(script[at : at + 2])
            at += 2
            continue
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (not out or out[-1] in _WORD_BREAKS):
            end = script.find("\n", at)
            at = len(script) if end < 0 else end
            continue
        out.append(char)
        at += 1
    return "".join(out)


def _script(script: str, *, depth: int) -> CommandRefusal | None:
    """Each simple command of a shell script, between ; && || | & newlines and brackets."""
    script = script.replace("\\\n", "")  # a line continuation joins the words it splits
    if depth > MAX_DEPTH:
        return _loose(script)
    for match in _DEFAULT_ASSIGNMENT.finditer(script):
        found = _named(match.group(1), _short(match.group(0)) + "...}", expands=True)
        if found:
            return found
    try:
        tokens = _tokens(_without_comments(script))
    except ValueError:  # quoting shlex cannot follow; the shell might
        return _loose(script)
    if "$'" in script or '$"' in script:
        # bash's $'...' quoting is not shlex's: what shlex reads as quoted may be code
        found = _loose(script)
        if found:
            return found
    command: list[str] = []
    target = False
    for token in [*tokens, ";"]:
        if token and all(c in _PUNCTUATION for c in token):
            if ("<" in token or ">" in token) and "(" not in token:
                if command and command[-1].isdigit():
                    command.pop()  # the descriptor of `2>&1`
                target = True  # the word after a redirection is its file
                continue
            found = _simple(command, expands=True, depth=depth)
            if found:
                return found
            command, target = [], False
        elif target:
            target = False
        else:
            command.append(token)
    return None


def _loose(script: str) -> CommandRefusal | None:
    """A script read word by word: any reserved name in it, any env that clears."""
    how = "in a script whose quoting the check cannot follow"
    for match in _NAME.finditer(script):
        reason = isolation.reserved_reason(match.group())
        if reason:
            return CommandRefusal(match.group(), reason, how)
    clearing = re.search(r"(?:^|[\s;&|(])(?:\S*/)?env\s+(-\w*i\w*|--ig\S*|-)(?:\s|$)", script)
    return _cleared(f"env {clearing.group(1)}") if clearing else None

"""`re` for code steps (SPEC §17): Python's functions on RE2 (`google-re2`), an engine
that matches in linear time and cannot backtrack, as JSON Schema patterns' Rust `regex`
crate cannot either (same syntax but for a few classes). The sandbox's own `re` is never
reached: a code step's `import re` binds this module (code_sandbox.py rewrites the
import), whose functions run here, in the host, on the strings the sandbox passes.

Bounded, since they run in the server's process: a string of at most `TEXT_MAX`
characters, a pattern of at most `PATTERN_MAX`, RE2's own compile memory (`MAX_MEM`),
and at most `MATCHES_MAX` matches per call (findall, finditer, sub, split); past a bound
the call raises ValueError naming it. (flpc, the Rust crate's binding, was tried first:
its finditer copies the whole text into every match — 10,000 matches of a 10 KB text
took 100 MB, a 1 MiB text exhausted the machine.)

What Python's `re` has and this has: `compile` (a pattern object with the same
methods), `search`, `match`, `fullmatch`, `findall`, `finditer` (a list), `sub`, `subn`,
`split`, `escape`, the flags `I`/`IGNORECASE`, `M`/`MULTILINE`, `S`/`DOTALL`, and Match
objects with `group` (by number or name), `groups`, `groupdict`, `start`, `end`, `span`.
A replacement may use `\\1`, `\\g<1>` and `\\g<name>`; a callable replacement is not
supported. A backreference or lookaround raises ValueError naming the pattern.
"""

from __future__ import annotations

import functools
from typing import Any

import pydantic_monty as monty
import re2

NO_BACKTRACKING = ("code steps' patterns run on a regular-expression engine that cannot "
                   "backtrack: no backreferences (\\1) and no lookaround ((?=…), (?!…), (?<=…), (?<!…))")
FLAGS = {"I": 2, "IGNORECASE": 2, "M": 8, "MULTILINE": 8, "S": 16, "DOTALL": 16}
_INLINE = ((2, "i"), (8, "m"), (16, "s"))
TEXT_MAX = 1024 * 1024  # characters of a string searched
PATTERN_MAX = 10_000  # characters of a pattern
MATCHES_MAX = 10_000  # matches one call may find
MAX_MEM = 8 * 1024 * 1024  # RE2's memory for one compiled pattern
_BACKTRACKING = ("invalid perl operator: (?=", "invalid perl operator: (?!", "invalid perl operator: (?<")


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False
    options.max_mem = MAX_MEM
    return options


_OPTIONS = _options()


@functools.lru_cache(maxsize=256)
def _compile(pattern: str, flags: int) -> Any:
    if not isinstance(pattern, str):
        raise TypeError(f"a pattern must be a string, not {type(pattern).__name__}")
    if len(pattern) > PATTERN_MAX:
        raise ValueError(f"a pattern may have at most {PATTERN_MAX:,} characters in a code step")
    if not isinstance(flags, int) or isinstance(flags, bool) or flags & ~sum(set(FLAGS.values())):
        raise ValueError("flags may be re.I, re.M and re.S in a code step")
    inline = "".join(letter for bit, letter in _INLINE if flags & bit)
    try:
        return re2.compile(f"(?{inline}){pattern}" if inline else pattern, _OPTIONS)
    except re2.error as exc:
        raw = exc.args[0] if exc.args else ""
        detail = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        if detail.startswith(_BACKTRACKING) or (detail.startswith("invalid escape sequence: \\")
                                                and detail[-1:].isdigit()):
            raise ValueError(f"the pattern {pattern[:200]!r} cannot be used: {NO_BACKTRACKING}") from None
        raise ValueError(f"the pattern {pattern[:200]!r} is not valid: {detail[:200]}") from None


def _text(string: Any) -> str:
    if not isinstance(string, str):
        raise TypeError(f"expected a string, not {type(string).__name__}")
    if len(string) > TEXT_MAX:
        raise ValueError(f"re searches strings of at most {TEXT_MAX:,} characters in a code step "
                         f"(this one has {len(string):,})")
    return string


def _matches(compiled: Any, string: str) -> list[Any]:
    found = []
    for match in compiled.finditer(_text(string)):
        if len(found) >= MATCHES_MAX:
            raise ValueError(f"the pattern {compiled.pattern[:200]!r} matched more than {MATCHES_MAX:,} "
                             "times in one call (a code step's bound)")
        found.append(match)
    return found


class Match:
    """What search, match and fullmatch give: the spans of one match."""

    def __init__(self, found: Any, string: str) -> None:
        self._found, self.string = found, string
        self.re = found.re.pattern

    def group(self, *groups: Any) -> Any:
        return self._found.group(*groups)

    def groups(self, default: Any = None) -> tuple:
        return self._found.groups(default)

    def groupdict(self, default: Any = None) -> dict[str, Any]:
        return self._found.groupdict(default)

    def span(self, group: Any = 0) -> tuple[int, int]:
        return tuple(self._found.span(group))

    def start(self, group: Any = 0) -> int:
        return self._found.start(group)

    def end(self, group: Any = 0) -> int:
        return self._found.end(group)


def _wrap(found: Any, string: str) -> Any:
    if found is None:
        return None
    return monty.ClassInstance(Match(found, string), eager_attrs=["string", "re"],
                               allowed_methods=["group", "groups", "groupdict", "span", "start", "end"])


def search(pattern: str, string: str, flags: int = 0) -> Any:
    return _wrap(_compile(pattern, flags).search(_text(string)), string)


def match(pattern: str, string: str, flags: int = 0) -> Any:
    return _wrap(_compile(pattern, flags).match(_text(string)), string)


def fullmatch(pattern: str, string: str, flags: int = 0) -> Any:
    return _wrap(_compile(pattern, flags).fullmatch(_text(string)), string)


def findall(pattern: str, string: str, flags: int = 0) -> list[Any]:
    compiled = _compile(pattern, flags)
    found = _matches(compiled, string)
    if compiled.groups == 0:
        return [m.group(0) for m in found]
    if compiled.groups == 1:
        return [m.group(1) or "" for m in found]
    return [tuple(g or "" for g in m.groups()) for m in found]


def finditer(pattern: str, string: str, flags: int = 0) -> list[Any]:
    return [_wrap(m, string) for m in _matches(_compile(pattern, flags), string)]


def subn(pattern: str, repl: str, string: str, count: int = 0, flags: int = 0) -> tuple[str, int]:
    if not isinstance(repl, str):
        raise TypeError("a replacement must be a string (a function is not supported in code steps)")
    compiled = _compile(pattern, flags)
    found = _matches(compiled, string)
    if count > 0:
        found = found[:count]
    pieces, last = [], 0
    for m in found:
        start, end = m.span()
        pieces += [string[last:start], m.expand(repl)]
        last = end
    pieces.append(string[last:])
    return "".join(pieces), len(found)


def sub(pattern: str, repl: str, string: str, count: int = 0, flags: int = 0) -> str:
    return subn(pattern, repl, string, count, flags)[0]


def split(pattern: str, string: str, maxsplit: int = 0, flags: int = 0) -> list[Any]:
    found = _matches(_compile(pattern, flags), string)
    if maxsplit > 0:
        found = found[:maxsplit]
    pieces, last = [], 0
    for m in found:
        start, end = m.span()
        pieces.append(string[last:start])
        pieces += list(m.groups())
        last = end
    pieces.append(string[last:])
    return pieces


def escape(pattern: str) -> str:
    return re2.escape(_text(pattern))


class Compiled:
    """What `re.compile` gives: the module's functions with the pattern and flags bound."""

    def __init__(self, pattern: str, flags: int = 0) -> None:
        _compile(pattern, flags)  # a pattern that cannot be used fails here, as in Python
        self.pattern, self.flags = pattern, flags

    def search(self, string: str) -> Any:
        return search(self.pattern, string, self.flags)

    def match(self, string: str) -> Any:
        return match(self.pattern, string, self.flags)

    def fullmatch(self, string: str) -> Any:
        return fullmatch(self.pattern, string, self.flags)

    def findall(self, string: str) -> list[Any]:
        return findall(self.pattern, string, self.flags)

    def finditer(self, string: str) -> list[Any]:
        return finditer(self.pattern, string, self.flags)

    def sub(self, repl: str, string: str, count: int = 0) -> str:
        return sub(self.pattern, repl, string, count, self.flags)

    def subn(self, repl: str, string: str, count: int = 0) -> tuple[str, int]:
        return subn(self.pattern, repl, string, count, self.flags)

    def split(self, string: str, maxsplit: int = 0) -> list[Any]:
        return split(self.pattern, string, maxsplit, self.flags)


def compile(pattern: str, flags: int = 0) -> Any:  # noqa: A001 - Python's name
    return monty.ClassInstance(Compiled(pattern, flags), eager_attrs=["pattern", "flags"],
                               allowed_methods=["search", "match", "fullmatch", "findall", "finditer",
                                                "sub", "subn", "split"])


def module() -> monty.ExternalModule:
    """The module a code step imports as `re`."""
    return monty.ExternalModule({
        "compile": compile, "search": search, "match": match, "fullmatch": fullmatch, "findall": findall,
        "finditer": finditer, "sub": sub, "subn": subn, "split": split, "escape": escape, **FLAGS})

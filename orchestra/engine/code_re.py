"""`re` for code steps (SPEC §17): Python's functions on the engine JSON Schema patterns
use, the Rust `regex` crate (here through `flpc`), which matches in linear time and
cannot backtrack. The sandbox's own `re` is never reached: a code step's `import re`
binds this module (code_sandbox.py rewrites the import), whose functions run here, in
the host, on the strings the sandbox passes.

What Python's `re` has and this has: `compile` (a pattern object with the same
methods), `search`, `match`, `fullmatch`, `findall`,
`finditer` (a list), `sub`, `subn`, `split`, `escape`, the flags `I`/`IGNORECASE`,
`M`/`MULTILINE`, `S`/`DOTALL`, `X`/`VERBOSE`, and Match objects with `group` (by number
or name), `groups`, `groupdict`, `start`, `end`, `span`. A replacement may use `\\1`,
`\\g<1>` and `\\g<name>`; a callable replacement is not supported. A backreference or
lookaround raises ValueError naming the pattern.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import flpc
import pydantic_monty as monty

NO_BACKTRACKING = ("code steps' patterns run on a regular-expression engine that cannot "
                   "backtrack: no backreferences (\\1) and no lookaround ((?=…), (?!…), (?<=…), (?<!…))")
FLAGS = {"I": 2, "IGNORECASE": 2, "M": 8, "MULTILINE": 8, "S": 16, "DOTALL": 16, "X": 64, "VERBOSE": 64}
_INLINE = ((2, "i"), (8, "m"), (16, "s"), (64, "x"))
_NAMED = re.compile(r"\(\?P?<([A-Za-z_][A-Za-z0-9_]*)>")
_TEMPLATE = re.compile(r"\\(?:g<([^>]*)>|(\d{1,2})|(.))", re.S)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a", "\\": "\\"}


class Pattern:
    __slots__ = ("compiled", "groups", "names", "text")

    def __init__(self, text: str, compiled: Any, names: dict[str, int], groups: int) -> None:
        self.text, self.compiled, self.names, self.groups = text, compiled, names, groups


@functools.lru_cache(maxsize=256)
def _compile(pattern: str, flags: int) -> Pattern:
    if not isinstance(pattern, str):
        raise TypeError(f"a pattern must be a string, not {type(pattern).__name__}")
    inline = "".join(letter for bit, letter in _INLINE if flags & bit)
    text = f"(?{inline}){pattern}" if inline else pattern
    try:
        compiled = flpc.compile(text)
    except ValueError as exc:
        detail = str(exc)
        if "not supported" in detail:
            raise ValueError(f"the pattern {pattern[:200]!r} cannot be used: {NO_BACKTRACKING}") from None
        last = [line.strip() for line in detail.splitlines() if line.strip().startswith("error:")]
        raise ValueError(f"the pattern {pattern[:200]!r} is not valid: "
                         f"{last[-1].removeprefix('error:').strip() if last else detail[:200]}") from None
    names, groups = _groups(pattern)
    return Pattern(pattern, compiled, names, groups)


def _groups(pattern: str) -> tuple[dict[str, int], int]:
    """Capture groups by name and how many there are, counted as the engine numbers them
    (each unescaped `(` outside a class that is not `(?…)`, or is a named group)."""
    names: dict[str, int] = {}
    count, i, in_class = 0, 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "]":
                i += 1
        elif char == "(":
            named = _NAMED.match(pattern, i)
            if named:
                count += 1
                names[named.group(1)] = count
            elif pattern[i + 1:i + 2] != "?":
                count += 1
        i += 1
    return names, count


class Match:
    """What search, match and fullmatch give: the spans of one match."""

    def __init__(self, found: Any, pattern: Pattern, string: str) -> None:
        self._found, self._pattern, self.string = found, pattern, string
        self.re = pattern.text

    def _index(self, group: Any) -> int:
        if isinstance(group, str):
            if group not in self._pattern.names:
                raise IndexError(f"no such group: {group!r}")
            return self._pattern.names[group]
        if not isinstance(group, int) or not 0 <= group <= self._pattern.groups:
            raise IndexError("no such group")
        return group

    def group(self, *groups: Any) -> Any:
        if len(groups) <= 1:
            return self._found.group(self._index(groups[0] if groups else 0))
        return tuple(self._found.group(self._index(g)) for g in groups)

    def groups(self, default: Any = None) -> tuple:
        return tuple(default if g is None else g for g in self._found.groups())

    def groupdict(self, default: Any = None) -> dict[str, Any]:
        return {name: (value if (value := self._found.group(i)) is not None else default)
                for name, i in self._pattern.names.items()}

    def span(self, group: Any = 0) -> tuple[int, int]:
        found = self._found.span(self._index(group))
        return (-1, -1) if found is None else tuple(found)

    def start(self, group: Any = 0) -> int:
        return self.span(group)[0]

    def end(self, group: Any = 0) -> int:
        return self.span(group)[1]


def _wrap(found: Any, pattern: Pattern, string: str) -> Any:
    if found is None:
        return None
    return monty.ClassInstance(Match(found, pattern, string), eager_attrs=["string", "re"],
                               allowed_methods=["group", "groups", "groupdict", "span", "start", "end"])


def _text(string: Any) -> str:
    if not isinstance(string, str):
        raise TypeError(f"expected a string, not {type(string).__name__}")
    return string


def search(pattern: str, string: str, flags: int = 0) -> Any:
    compiled = _compile(pattern, flags)
    return _wrap(flpc.search(compiled.compiled, _text(string)), compiled, string)


def match(pattern: str, string: str, flags: int = 0) -> Any:
    compiled = _compile(pattern, flags)
    return _wrap(flpc.fmatch(compiled.compiled, _text(string)), compiled, string)


def fullmatch(pattern: str, string: str, flags: int = 0) -> Any:
    compiled = _compile(pattern, flags)
    return _wrap(flpc.fullmatch(compiled.compiled, _text(string)), compiled, string)


def _all(pattern: str, string: str, flags: int) -> tuple[Pattern, list[Any]]:
    compiled = _compile(pattern, flags)
    return compiled, list(flpc.finditer(compiled.compiled, _text(string)))


def findall(pattern: str, string: str, flags: int = 0) -> list[Any]:
    compiled, found = _all(pattern, string, flags)
    if compiled.groups == 0:
        return [m.group(0) for m in found]
    if compiled.groups == 1:
        return [m.group(1) or "" for m in found]
    return [tuple(g or "" for g in m.groups()) for m in found]


def finditer(pattern: str, string: str, flags: int = 0) -> list[Any]:
    compiled, found = _all(pattern, string, flags)
    return [_wrap(m, compiled, string) for m in found]


def _expand(template: str, found: Any, compiled: Pattern) -> str:
    def one(part: re.Match) -> str:
        name, number, other = part.groups()
        if other is not None:
            if other in _ESCAPES:
                return _ESCAPES[other]
            if other.isalpha():
                raise ValueError(f"bad escape \\{other} in the replacement")
            return "\\" + other
        key = name if name is not None else number
        index = int(key) if key.isdigit() else compiled.names.get(key)
        if index is None or index > compiled.groups:
            raise IndexError(f"invalid group reference {key!r} in the replacement")
        return found.group(index) or ""
    return _TEMPLATE.sub(one, template)


def subn(pattern: str, repl: str, string: str, count: int = 0, flags: int = 0) -> tuple[str, int]:
    if not isinstance(repl, str):
        raise TypeError("a replacement must be a string (a function is not supported in code steps)")
    compiled, found = _all(pattern, string, flags)
    if count > 0:
        found = found[:count]
    pieces, last = [], 0
    for m in found:
        start, end = m.span(0)
        pieces += [string[last:start], _expand(repl, m, compiled)]
        last = end
    pieces.append(string[last:])
    return "".join(pieces), len(found)


def sub(pattern: str, repl: str, string: str, count: int = 0, flags: int = 0) -> str:
    return subn(pattern, repl, string, count, flags)[0]


def split(pattern: str, string: str, maxsplit: int = 0, flags: int = 0) -> list[Any]:
    compiled, found = _all(pattern, string, flags)
    if maxsplit > 0:
        found = found[:maxsplit]
    pieces, last = [], 0
    for m in found:
        start, end = m.span(0)
        pieces.append(string[last:start])
        pieces += list(m.groups())
        last = end
    pieces.append(string[last:])
    return pieces


def escape(pattern: str) -> str:
    return flpc.escape(_text(pattern))


class Compiled:
    """What `re.compile` gives: the module's functions with the pattern and flags bound."""

    def __init__(self, pattern: str, flags: int) -> None:
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

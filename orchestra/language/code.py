"""Save-time checks of a code step's source (SPEC §17): its size, its syntax (line and
column, 1-based) and the constructs a code step may not use.

The source is only parsed here (`ast.parse`, never compiled or run): the interpreter
that runs it is a sandboxed subset of Python (engine/code_sandbox.py), so this check is
a first fence that gives clear words at save; the sandbox refuses the same things at
run time whatever reaches it. Refused: imports other than json, math, datetime and re,
relative imports, the builtins that reach for code or the host (`open`, `eval`, `exec`,
`compile`, `__import__`, `globals`, `locals`, `vars`, `getattr`, `setattr`, `delattr`,
`breakpoint`, `input()` as a call — `input` is the run's input), and every dunder
attribute (`().__class__`).
"""

from __future__ import annotations

import ast
import functools
import warnings

from orchestra.language.model import CODE_SOURCE_MAX

MODULES = ("json", "math", "datetime", "re")
_FORBIDDEN = frozenset({"open", "eval", "exec", "compile", "__import__", "globals", "locals", "vars",
                        "getattr", "setattr", "delattr", "breakpoint", "exit", "quit", "help",
                        "memoryview", "__builtins__", "__loader__", "__spec__"})
_PROBLEMS_MAX = 5


def source_problems(source: str) -> list[str]:
    """Every problem of a code step's source, in words (the caller names the field)."""
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > CODE_SOURCE_MAX:
        return [f"is {size} bytes; a code step's source may be at most {CODE_SOURCE_MAX:,} bytes"]
    if not source.strip():
        return ["must not be blank"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an invalid escape in a string is no error here
            tree = ast.parse(source, filename="code", mode="exec")
    except SyntaxError as exc:
        return [f"line {exc.lineno or 1}, column {exc.offset or 1}: {exc.msg}"]
    except (ValueError, MemoryError, RecursionError) as exc:  # a NUL byte; nesting too deep
        return [f"cannot be parsed: {str(exc)[:200]}"]
    found: list[str] = []
    for node in ast.walk(tree):
        problem = _refused(node)
        if problem and problem not in found:
            found.append(problem)
            if len(found) >= _PROBLEMS_MAX:
                break
    return found


def _refused(node: ast.AST) -> str | None:
    at = f"line {getattr(node, 'lineno', 1)}, column {getattr(node, 'col_offset', 0) + 1}"
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name not in MODULES:
                return f"{at}: imports {alias.name}; a code step may import only {', '.join(MODULES)}"
    elif isinstance(node, ast.ImportFrom):
        if node.level or (node.module or "") not in MODULES:
            name = "." * node.level + (node.module or "")
            return f"{at}: imports from {name}; a code step may import only {', '.join(MODULES)}"
    elif isinstance(node, ast.Name) and node.id in _FORBIDDEN:
        return f"{at}: {node.id} is not available in a code step"
    elif isinstance(node, ast.Attribute) and node.attr.startswith("__"):
        return f"{at}: the attribute {node.attr} is not available in a code step"
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "input"):
        return f"{at}: input is the run's input, not a function"
    return None


@functools.lru_cache(maxsize=512)
def step_reads(source: str) -> frozenset[str] | None:
    """The step ids a code step's source reads as `steps['id']` (a literal id); None when
    it reads `steps` any other way (it may read any step) or does not parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    found: set[str] = set()
    literal: set[int] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "steps"
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
            found.add(node.slice.value)
            literal.add(id(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "steps" and id(node) not in literal:
            return None
    return frozenset(found)

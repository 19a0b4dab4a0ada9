"""CEL expressions of the workflow language (SPEC §7): compile once, evaluate safely.

Expressions are CEL, run by `common-expression-language` (Python bindings of the Rust
`cel` crate): non-Turing-complete, no Python `eval`, no I/O, microseconds per
evaluation. A compiled program is cached per source text, so a template's expressions
are parsed once per process, not once per step.

Variables an expression may use: `input`; `steps` (a map from a step id to `{output,
status}`); `item` and `index` inside a foreach; `loop` (`iteration`, `previous`) inside
a loop. Save-time checks (`check`) cover length, parsing, unknown variables and the step
ids named through `steps.X` / `steps["X"]`; run-time failures raise `ExpressionError`
naming the expression.

Bounds (SPEC §15): what an expression is evaluated against is at most
`ORCHESTRA_EXPRESSION_INPUT_MAX_BYTES` of JSON. An expression without a comprehension
is linear in what it names, so when that is small (`INLINE_BYTES`, counting each
reference) it runs here, inline, in microseconds; anything else — a comprehension, or a
large context — runs in the engine's `sandbox.Sandbox`, with a deadline and a memory cap.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import cel

MAX_LENGTH = 1_000
# Inline evaluation's budget: JSON bytes of the context times the variable references.
# Without comprehensions the work is linear in that (~10 MB/s through the CEL bindings'
# conversions), so this keeps an inline evaluation to about 10 ms on the event loop.
INLINE_BYTES = 128 * 1024
VARIABLES = frozenset({"input", "steps", "item", "index", "loop"})
# A v1 placeholder (SPEC §4): `{{input}}` or `{{steps.<id>.output}}`, ids that CEL may not
# spell (`steps.fetch-data.output` would be a subtraction). They keep their v1 meaning.
LEGACY = re.compile(r"^(?:input|steps\.([A-Za-z0-9_-]{1,64})\.output)$")
PLACEHOLDER = re.compile(r"\{\{\s*(.*?)\s*\}\}", re.S)
_STRINGS = re.compile(
    r"""[rRbB]{0,2}(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")""",
    re.S,
)
_STEP_DOT = re.compile(r"(?<![\w.])steps\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")
_STEP_INDEX = re.compile(r"(?<![\w.])steps\s*\[\s*(?:'([^'\\]*)'|\"([^\"\\]*)\")\s*\]")
_STEPS_NAME = re.compile(r"(?<![\w.])steps\b")
# CEL reserves the word `loop`, which SPEC §8 names the loop variable: outside string
# literals it is spelled `_loop` for the library, and the context binds it by that name.
_LOOP_WORD = re.compile(r"(?<![\w.])loop(?!\w)")
LOOP_NAME = "_loop"
_MACRO_CALL = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(")
# Whether an expression may hold a comprehension, decided on the raw text, string literals
# and comments included: a false "yes" only sends it to the sandbox, a false "no" (a
# comprehension hidden from a lexer) would run it inline, unbounded.
_MACRO_WORD = re.compile(r"(?<!\w)(?:all|exists|exists_one|map|filter)(?!\w)")
_REFERENCE = re.compile(r"(?<![\w.])(?:input|steps|item|index|loop)(?!\w)")
_MACRO_VAR = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,")


class ExpressionError(Exception):
    """An expression that cannot be compiled or failed at run time; the text names it."""

    def __init__(self, source: str, problem: str) -> None:
        self.source = source
        self.problem = problem
        shown = source if len(source) <= 120 else source[:117] + "..."
        super().__init__(f"expression `{shown}`: {problem}")

    @property
    def message(self) -> str:
        return str(self)


@dataclass(frozen=True, slots=True)
class Compiled:
    """A parsed expression with what it references."""

    source: str
    program: Any
    variables: frozenset[str]  # free variables (macro-bound names excluded)
    step_refs: tuple[str, ...]  # ids named as steps.X or steps["X"], in order, distinct
    all_steps: bool = False  # uses `steps` other than through literal ids (size(steps), steps[k])
    macros: bool = False  # has a comprehension (all, exists, exists_one, map, filter)
    references: int = 0  # how many times variables are named (each may copy what it names)


def _parse_error(text: str) -> str:
    # cel's message repeats the whole source; keep its position line and caret.
    lines = [line for line in text.splitlines() if line.strip()]
    head = next((line for line in lines if "ERROR" in line), lines[0] if lines else text)
    head = head.split("ERROR:", 1)[-1].strip().removeprefix("<input>:")
    return f"does not parse: {head}"


def _spelled(source: str) -> str:
    """`source` with the variable `loop` renamed `_loop` outside string literals."""
    if "loop" not in source:
        return source
    out, last = [], 0
    for match in _STRINGS.finditer(source):
        out.append(_LOOP_WORD.sub(LOOP_NAME, source[last:match.start()]))
        out.append(match.group(0))
        last = match.end()
    out.append(_LOOP_WORD.sub(LOOP_NAME, source[last:]))
    return "".join(out)


def without_strings(source: str) -> str:
    """The expression with its string literals emptied (what names it uses, not says)."""
    return _STRINGS.sub('""', source)


@lru_cache(maxsize=4096)
def compile_expression(source: str) -> Compiled:
    """The compiled program of `source` (cached); ExpressionError if too long or invalid."""
    if len(source) > MAX_LENGTH:
        raise ExpressionError(source, f"is {len(source)} characters long; the limit is {MAX_LENGTH}")
    if not source.strip():
        raise ExpressionError(source, "is empty")
    try:
        program = cel.compile(_spelled(source))
    except (ValueError, RuntimeError) as exc:
        raise ExpressionError(source, _parse_error(str(exc))) from None
    code = _STRINGS.sub('""', source)  # names inside string literals are not references
    bound = set(_MACRO_VAR.findall(code))
    refs: list[str] = []
    for match in _STEP_DOT.finditer(code):
        refs.append(match.group(1))
    for match in _STEP_INDEX.finditer(source):
        refs.append(match.group(1) if match.group(1) is not None else match.group(2))
    literal = len(_STEP_DOT.findall(code)) + len(_STEP_INDEX.findall(source))
    variables = frozenset("loop" if v == LOOP_NAME else v for v in program.variables() if v not in bound)
    return Compiled(
        source=source,
        program=program,
        variables=variables,
        step_refs=tuple(dict.fromkeys(refs)),
        all_steps=len(_STEPS_NAME.findall(code)) > literal,
        macros=_MACRO_WORD.search(source) is not None,
        references=len(_REFERENCE.findall(source)),
    )


def nested_comprehension(source: str) -> bool:
    """Whether a comprehension (all, exists, exists_one, map, filter) sits inside another:
    over lists as large as a run's input that is quadratic work on the event loop, so the
    language allows one level (linear) only."""
    code = _STRINGS.sub('""', source)
    for match in _MACRO_CALL.finditer(code):
        depth, i = 1, match.end()
        while i < len(code) and depth:
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        if _MACRO_CALL.search(code, match.end(), i):
            return True
    return False


def check(source: str, *, allowed: frozenset[str] = VARIABLES) -> tuple[Compiled | None, list[str]]:
    """Save-time problems of one expression: parse errors, length, unknown variables,
    nested comprehensions."""
    try:
        compiled = compile_expression(source)
    except ExpressionError as exc:
        return None, [str(exc)]
    if nested_comprehension(source):
        return compiled, [f"expression `{source[:120]}`: a comprehension (map, filter, all, "
                          "exists, exists_one) inside another is not allowed (quadratic work)"]
    unknown = sorted(compiled.variables - allowed)
    problems = [
        f"expression `{source[:120]}`: unknown variable '{name}'; known: {', '.join(sorted(allowed))}"
        for name in unknown
    ]
    return compiled, problems


def to_json(value: Any) -> Any:
    """A CEL result as a JSON value: timestamps as RFC 3339 text, durations as seconds,
    bytes as text (UTF-8) or base64, maps with text keys."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(bytes(value)).decode("ascii")
    optional = getattr(value, "value", None)  # cel.OptionalValue
    if callable(optional):
        return to_json(optional())
    return str(value)


def _execute(compiled: Compiled, context: Any) -> Any:
    """Run a compiled program; its JSON value, or ExpressionError naming the expression."""
    try:
        result = compiled.program.execute(context)
    except KeyError as exc:
        raise ExpressionError(compiled.source, f"no such key or field {exc}") from None
    except (TypeError, ValueError, RuntimeError, OverflowError, ZeroDivisionError) as exc:
        problem = str(exc).split(". CEL does not coerce")[0]
        raise ExpressionError(compiled.source, problem or type(exc).__name__) from None
    return to_json(result)


def _context(values: dict[str, Any]) -> Any:
    if "loop" in values:  # see _spelled
        values = {LOOP_NAME if k == "loop" else k: v for k, v in values.items()}
    return cel.Context(values)


def evaluate_values(source: str, values: dict[str, Any]) -> Any:
    """`source` over exactly `values`, here and unbounded: the sandbox's worker runs this."""
    return _execute(compile_expression(source), _context(values))


def _encoded(values: dict[str, Any]) -> bytes:
    return json.dumps(values, ensure_ascii=False, separators=(",", ":"), default=str).encode()


class Scope:
    """The variables of one evaluation site (a step about to run). Each expression runs
    against only what it names — `input` if used, and only the steps it names (all of
    them when it uses `steps` otherwise) — measured and converted once and shared by
    every expression that names the same things. `sandbox` (the engine's) bounds the
    evaluations that do not run inline; without one they raise ExpressionError."""

    __slots__ = ("_prepared", "sandbox", "variables")

    def __init__(self, variables: dict[str, Any], sandbox: Any = None) -> None:
        self.variables = variables
        self.sandbox = sandbox
        self._prepared: dict[tuple, _Prepared] = {}

    def _prepare(self, compiled: Compiled) -> _Prepared:
        if compiled.all_steps:
            key: tuple = ("*",)
        else:
            key = (tuple(sorted(compiled.variables)), compiled.step_refs)
        found = self._prepared.get(key)
        if found is None:
            if key == ("*",):
                values = self.variables
            else:
                values = {name: self.variables[name] for name in compiled.variables
                          if name in self.variables and name != "steps"}
                if "steps" in compiled.variables:
                    steps = self.variables.get("steps") or {}
                    values["steps"] = {sid: steps[sid] for sid in compiled.step_refs if sid in steps}
            found = self._prepared[key] = _Prepared(values, _encoded(values))
        return found

    async def evaluate(self, source: str) -> Any:
        """The JSON value of `source` here; ExpressionError names it when it fails or
        passes a bound."""
        compiled = compile_expression(source)
        prepared = self._prepare(compiled)
        size = len(prepared.encoded)
        limit = self.sandbox.bounds.input_max_bytes if self.sandbox is not None else None
        if limit is not None and size > limit:
            raise ExpressionError(source, (
                f"is evaluated against {size} bytes of JSON; the limit is {limit} "
                "(ORCHESTRA_EXPRESSION_INPUT_MAX_BYTES)"))
        if not compiled.macros and size * max(1, compiled.references) <= INLINE_BYTES:
            if prepared.context is None:
                prepared.context = _context(prepared.values)
            return _execute(compiled, prepared.context)
        if self.sandbox is None:
            raise ExpressionError(source, "needs the engine's expression sandbox to run")
        return await self.sandbox.evaluate(source, prepared.encoded)

    async def truth(self, source: str) -> bool:
        """A condition (`when`, `until`): it must give a boolean."""
        value = await self.evaluate(source)
        if not isinstance(value, bool):
            raise ExpressionError(source, f"must give true or false, not {json.dumps(value)[:80]}")
        return value


class _Prepared:
    """What one set of named variables is, as JSON (measured, sent to the sandbox) and,
    once needed, as a CEL context (inline)."""

    __slots__ = ("context", "encoded", "values")

    def __init__(self, values: dict[str, Any], encoded: bytes) -> None:
        self.values = values
        self.encoded = encoded
        self.context: Any = None


def text_of(value: Any) -> str:
    """How a value appears inside a prompt: a string as it is, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


async def render(template: str, scope: Scope) -> str:
    """Fill every `{{ expr }}` of `template`. `{{input}}` and `{{steps.<id>.output}}` keep
    their v1 meaning (ids with '-' included): the output as text, or compact JSON (`null`
for a skipped or failed step)."""
    if "{{" not in template:
        return template
    parts: list[str] = []
    last = 0
    for match in PLACEHOLDER.finditer(template):
        parts.append(template[last:match.start()])
        last = match.end()
        expr = match.group(1)
        legacy = LEGACY.match(expr)
        if legacy:
            if legacy.group(1) is None:
                parts.append(text_of(scope.variables.get("input")))
            else:
                step = scope.variables.get("steps", {}).get(legacy.group(1))
                parts.append("" if step is None else text_of(step.get("output")))
        else:
            parts.append(text_of(await scope.evaluate(expr)))
    parts.append(template[last:])
    return "".join(parts)


def placeholders(template: str) -> list[str]:
    """The expressions inside `{{ }}` of a prompt, in order."""
    return [m.group(1) for m in PLACEHOLDER.finditer(template)]


def step_refs(expr: str) -> tuple[str, ...]:
    """Step ids an expression (or v1 placeholder) names; () if it does not compile."""
    legacy = LEGACY.match(expr)
    if legacy:
        return (legacy.group(1),) if legacy.group(1) else ()
    try:
        return compile_expression(expr).step_refs
    except ExpressionError:
        return ()

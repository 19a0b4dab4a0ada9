"""JSON Schema (2020-12) in the workflow language: template `input_schema`, step
`output_schema`, human replies (SPEC §7, §15).

A schema is checked on save: a JSON object of at most 64 KiB, valid against the 2020-12
meta-schema, with no remote `$ref` (only `#…` references inside the schema itself; the
validator's retriever refuses every URI, so nothing is ever fetched), and every regular
expression in it (`pattern`, `patternProperties` keys, `propertyNames` patterns) one the
Rust `regex` crate accepts. Values are validated with every violation reported at a path
such as `input.topics.2`.

Everything runs in `jsonschema-rs` (Rust) with `RegexOptions`: the `regex` crate matches
in linear time and cannot backtrack, so a pattern such as `^(a+)+$` costs microseconds
on any input. Python's `re` never runs a user's pattern — not for the answer, not for
wording the violations, not for the meta-schema's `format: regex` (which the same crate
checks). A pattern that needs backtracking (backreferences, lookaround) is refused at
save with its path. One validator is built per schema and kept.
"""

from __future__ import annotations

import json
from functools import lru_cache
from itertools import islice
from typing import Any
from urllib.parse import unquote

import jsonschema_rs

MAX_BYTES = 64 * 1024
MAX_VIOLATIONS = 20
_COLLECTED = 200  # violations read before sorting by path (each is cheap; bounded anyway)
NO_BACKTRACKING = ("patterns run on a regular-expression engine that cannot backtrack: no "
                   "backreferences or lookaround, and a bounded compiled size")
_NOT_REGEX = ' is not a "regex"'  # jsonschema-rs's meta-schema `format: regex` violation


def _encoded(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _remote_refs(node: Any, where: str = "") -> list[str]:
    """Paths of `$ref`/`$dynamicRef` values that point outside this schema."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{where}.{key}" if where else key
            if key in ("$ref", "$dynamicRef") and isinstance(value, str) and not value.startswith("#"):
                found.append(here)
            else:
                found.extend(_remote_refs(value, here))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_remote_refs(value, f"{where}.{i}" if where else str(i)))
    return found


def _dotted(path: Any) -> str:
    return ".".join(str(p) for p in path)


def _schema_problem(exc: jsonschema_rs.ValidationError) -> tuple[str, str]:
    """A refused schema as (sub-path, problem): a regular expression the linear engine
    refuses, a meta-schema violation, or a reference that does not resolve."""
    message = str(getattr(exc, "message", exc))
    path = _dotted(getattr(exc, "instance_path", ()) or ())
    if message.endswith(_NOT_REGEX):
        return path, f"{message.removesuffix(_NOT_REGEX)[:200]} cannot be used: {NO_BACKTRACKING}"
    if isinstance(getattr(exc, "kind", None), jsonschema_rs.ValidationErrorKind.Referencing):
        return path, f"has a $ref that does not resolve: {message}"[:300]
    return path, f"is not a valid JSON Schema (2020-12): {message[:300]}"


def check_schema(schema: Any) -> list[tuple[str, str]]:
    """Problems of a schema as (sub-path, problem); [] when it may be stored."""
    if not isinstance(schema, (dict, bool)):
        return [("", "must be a JSON Schema (an object)")]
    size = len(_encoded(schema).encode("utf-8"))
    if size > MAX_BYTES:
        return [("", f"is {size} bytes of JSON; the limit is {MAX_BYTES} (64 KiB)")]
    problems = [(path, "remote $ref is not allowed; use '#/…' references inside the schema")
                for path in _remote_refs(schema)]
    if problems:
        return problems
    encoded = _encoded(schema)
    try:
        _validator(encoded)  # meta-schema, patterns and local references, in Rust
    except jsonschema_rs.ValidationError as exc:
        return [_schema_problem(exc)]
    except (ValueError, jsonschema_rs.ReferencingError) as exc:
        return [("", f"has a $ref that does not resolve: {exc}"[:300])]
    expanded = _expanded_of(encoded)[0]
    if MAX_EXPANDED < expanded < _UNBOUNDED:  # recursion is bounded by the value instead
        problem = (f"has $refs that expand to {expanded:,.0f} subschemas; at most "
                   f"{MAX_EXPANDED:,} may apply to one value")
        return [("", problem)]
    return []


def _no_fetch(uri: str) -> Any:
    raise ValueError(f"remote references are not fetched: {uri}")


@lru_cache(maxsize=1024)
def _validator(encoded: str) -> Any:
    """The Rust validator of a schema (its JSON text): linear-time regular expressions,
    formats as annotations (as the 2020-12 default), no retrieval."""
    return jsonschema_rs.Draft202012Validator(
        json.loads(encoded), retriever=_no_fetch, pattern_options=jsonschema_rs.RegexOptions())


# How much checking a value may cost on the event loop, in subschema applications: the
# subschemas that may apply to one value node (local $refs expanded) times the value's
# nodes. jsonschema-rs applies one in ~15-30 ns, and a violation costs ~30 µs plus a copy
# of the value it is about; past these, a check runs in the engine's sandbox, with a
# deadline (an exponential tree of $refs or a 1 MiB value x a large schema).
INLINE_CHECK = 1_000_000
INLINE_LISTING = 2_000  # every violation listed, else the first only
MAX_EXPANDED = 100_000  # subschemas that may apply to one value node (refused on save)
INLINE_LISTING_BYTES = 4 * 1024 * 1024  # subschemas x text bytes copied into violations
_UNBOUNDED = float("inf")


def _pointer(root: Any, pointer: str) -> Any:
    """The node a local JSON pointer (`/$defs/a`) names, or None."""
    node = root
    for part in pointer.split("/")[1:] if pointer else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


# Keywords whose values are subschemas applied to a value (2020-12); `$defs` apply only
# through a `$ref`, and other keywords (const, enum, annotations) apply none.
_ONE = frozenset({"additionalProperties", "items", "contains", "propertyNames", "if", "then",
                  "else", "not", "unevaluatedItems", "unevaluatedProperties", "contentSchema"})
_LIST = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_MAP = frozenset({"properties", "patternProperties", "dependentSchemas"})


def _expanded(schema: Any) -> tuple[float, bool]:
    """An upper bound of how many subschemas may apply to one value node, and whether the
    schema recurses. Every object of the schema counts, and a local `$ref` counts its
    target's again (a tree of refs that doubles at each level counts 2^depth); a `$ref`
    back into itself counts 1 (recursion moves down the value, so a value d levels deep
    may meet this bound to the power d + 1). Unbounded when a `$ref` is not a plain
    pointer, or a nested `$id` changes what references mean."""
    expansion = _Expansion(schema)
    return expansion.size(schema, top=True), expansion.recursive


class _Expansion:
    """`_expanded`'s walk: each local `$ref` target counted once (memo), a `$ref` back
    into one being counted marks the schema recursive."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self.memo: dict[str, float] = {}
        self.active: set[str] = set()
        self.recursive = False

    def size(self, node: Any, top: bool = False) -> float:
        if not isinstance(node, dict):
            return 1.0 if isinstance(node, bool) else 0.0
        if "$id" in node and not top or "$dynamicRef" in node:
            return _UNBOUNDED
        total = 1.0
        for key, value in node.items():
            total += self._part(key, value)
            if total > 1e15:
                return _UNBOUNDED
        return total

    def _part(self, key: str, value: Any) -> float:
        if key == "$ref" and isinstance(value, str):
            return self.target(value)
        if key in _ONE:
            return self.size(value)
        if key in _LIST and isinstance(value, list):
            return sum(self.size(v) for v in value)
        if key in _MAP and isinstance(value, dict):
            return sum(self.size(v) for v in value.values())
        return 0.0

    def target(self, ref: str) -> float:
        if not ref.startswith("#/") and ref != "#":
            return _UNBOUNDED
        if ref in self.memo:
            return self.memo[ref]
        if ref in self.active:
            self.recursive = True
            return 1.0
        node = _pointer(self.schema, ref[1:])
        if node is None:
            return _UNBOUNDED
        self.active.add(ref)
        self.memo[ref] = found = self.size(node, top=node is self.schema)
        self.active.discard(ref)
        return found


@lru_cache(maxsize=1024)
def _expanded_of(encoded: str) -> tuple[float, bool]:
    return _expanded(json.loads(encoded))


def _value_size(value: Any, most: float) -> tuple[int, int, int]:
    """(nodes, text bytes, depth) of a JSON value; counting stops past `most` nodes."""
    nodes = text = deepest = 0
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        deepest = max(deepest, depth)
        if nodes > most:
            break
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
            text += sum(len(k) for k in node)
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, str):
            text += len(node)
    return nodes, text, deepest


_BY_ID: dict[int, tuple[Any, Any, tuple[float, bool]]] = {}  # id(schema) -> (schema, validator, expanded)


def _compiled(schema: Any) -> tuple[Any, tuple[float, bool]]:
    """(validator, expanded size) of a schema, found by the schema object itself first (a
    run's steps keep theirs) and by its JSON text otherwise."""
    cached = _BY_ID.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1], cached[2]
    encoded = _encoded(schema)
    found = (_validator(encoded), _expanded_of(encoded))
    if len(_BY_ID) > 4096:
        _BY_ID.clear()
    _BY_ID[id(schema)] = (schema, *found)
    return found


class _Work:
    """How much checking one value against one schema may cost, measured only as far as
    needed: a schema with at most one subschema costs one step per value node (checked
    inline, like parsing the value); otherwise the value's compact JSON length bounds its
    nodes (a node takes two characters at least) — C-speed, unlike walking it; a
    recursive schema needs the value's depth, so its values are walked."""

    __slots__ = ("_size", "each", "recursive", "value")

    def __init__(self, value: Any, expanded: tuple[float, bool]) -> None:
        self.value = value
        self.each, self.recursive = expanded
        self._size: tuple[float, int] | None = None

    def size(self) -> tuple[float, int]:
        """(subschema applications at most, text characters)."""
        if self._size is None:
            if self.recursive:
                nodes, text, depth = _value_size(self.value, INLINE_CHECK)
                self._size = (self.each ** min(depth + 1, 64)) * nodes, text
            else:
                chars = len(json.dumps(self.value, ensure_ascii=False, separators=(",", ":"), default=str))
                self._size = self.each * (chars // 2 + 1), chars
        return self._size

    def too_much_here(self) -> bool:
        if self.each <= 1 and not self.recursive:
            return False
        return self.size()[0] > INLINE_CHECK

    def listing(self) -> bool:
        applications, text = self.size()
        return applications <= INLINE_LISTING and self.each * text <= INLINE_LISTING_BYTES


def _found(validator: Any, work: _Work, root: str) -> list[dict[str, str]]:
    value = work.value
    if validator.is_valid(value):
        return []
    if work.listing():
        errors = sorted(islice(validator.iter_errors(value), _COLLECTED),
                        key=lambda e: [str(p) for p in e.instance_path])
    else:  # many violations, or large values in them: the first costs one of each
        try:
            validator.validate(value)
            return []
        except jsonschema_rs.ValidationError as error:
            errors = [error]
    found = []
    for error in errors[:MAX_VIOLATIONS]:
        path = _dotted([root, *error.instance_path] if root else error.instance_path)
        found.append({"field": path or "value", "problem": error.message[:300]})
    return found


def needs_sandbox(value: Any, schema: Any) -> bool:
    """Whether checking `value` against `schema` is too much work for the event loop."""
    return _Work(value, _compiled(schema)[1]).too_much_here()


def violations(value: Any, schema: Any, *, root: str) -> list[dict[str, str]]:
    """Every way `value` breaks `schema`, as `{field, problem}` with paths under `root`
    (`input.topics.2`); [] when it validates. Checked here, on the event loop, so bounded:
    a check past INLINE_CHECK is one violation naming that (save-time callers; the others
    use `check`, which sends such a check to the sandbox)."""
    validator, expanded = _compiled(schema)
    work = _Work(value, expanded)
    if work.too_much_here():
        return [{"field": root or "value", "problem": (
            f"is too large to check against this schema here: up to {work.size()[0]:,.0f} "
            f"subschema checks; at most {INLINE_CHECK:,}")}]
    return _found(validator, work, root)


def violations_anywhere(schema: Any, value: Any, root: str) -> list[dict[str, str]]:
    """`violations` without the event loop's bound: the sandbox's worker runs this."""
    validator, expanded = _compiled(schema)
    return _found(validator, _Work(value, expanded), root)


async def check(value: Any, schema: Any, *, root: str, sandbox: Any) -> list[dict[str, str]]:
    """`violations`, with a check too large for the event loop run in `sandbox` (the
    engine's), under its deadline."""
    if sandbox is None or not needs_sandbox(value, schema):
        return violations(value, schema, root=root)
    return await sandbox.violations(_encoded(schema), value, root)


def describe(found: list[dict[str, str]], limit: int = 5) -> str:
    """Violations as one readable sentence."""
    text = "; ".join(f"{v['field']}: {v['problem']}" for v in found[:limit])
    return text + (f" (and {len(found) - limit} more)" if len(found) > limit else "")

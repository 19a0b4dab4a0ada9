"""The shape of the code: no import cycle in orchestra/, imports only down the layers, and
no module over 600 lines.

The import graph is read with `ast` from every module of the package, counting every
import wherever it stands — at the top, inside a function, under `TYPE_CHECKING` — since
an import inside a function ties two modules just as much (it only hides the tie).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "orchestra"
LINES_MAX = 600


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(node: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The orchestra modules an import statement names (a `from m import x` names `m.x`
    when that is a module, else `m`)."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                   for alias in node.names]
    else:
        return set()
    found = set()
    for target in targets:
        while target and target not in known:  # `import orchestra.a.b.c` where c is a name
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


@functools.cache
def import_graph() -> dict[str, set[str]]:
    known = modules()
    names = set(known)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: set[str] = set()
        for node in ast.walk(tree):
            edges |= imported(node, name, path.name == "__init__.py", names)
        graph[name] = edges
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for child in graph[todo.pop()]:
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The groups of modules that import one another, directly or not (the strongly
    connected components of more than one module)."""
    reach = {name: reachable(graph, name) for name in graph}
    found: list[frozenset[str]] = []
    for name in sorted(graph):
        component = frozenset({name} | {other for other in reach[name] if name in reach[other]})
        if len(component) > 1 and component not in found:
            found.append(component)
    return found


def describe(cycle: frozenset[str], graph: dict[str, set[str]]) -> str:
    ties = [f"{a} -> {b}" for a in sorted(cycle) for b in sorted(graph[a] & cycle)]
    return "{" + ", ".join(sorted(cycle)) + "}: " + "; ".join(ties)


def test_the_graph_sees_function_level_and_relative_imports():
    source = "def f():\n    from orchestra.core import Core\n    from . import shared\n"
    tree = ast.parse(source)
    known = {"orchestra.core", "orchestra.services", "orchestra.services.shared", "orchestra.services.x"}
    found = set()
    for node in ast.walk(tree):
        found |= imported(node, "orchestra.services.x", False, known)
    assert found == {"orchestra.core", "orchestra.services.shared"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_no_import_cycle_in_orchestra():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(c, graph) for c in found)


def test_the_composition_root_is_imported_only_by_entry_points():
    """orchestra.core stands above services and engine: only the process owner, the web
    app and the CLI (and tests) import it."""
    graph = import_graph()
    importers = sorted(name for name, edges in graph.items() if "orchestra.core" in edges)
    assert all(name.startswith(("orchestra.process", "orchestra.web", "orchestra.cli"))
               for name in importers), importers


def test_no_module_over_600_lines():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > LINES_MAX}
    assert not long, f"modules over {LINES_MAX} lines: {long}"


# The layers, bottom first: a module imports its own package or one of a lower layer,
# never one beside or above it. The base is the leaf modules any layer may use (and one
# another); `language` is the pure workflow language, used at save time by services and
# at run time by the engine; `core` is the composition root and `process` the owner of a
# server process's parts (it is given the web layer's MCP host to build); `client` is the CLI's HTTP
# client (it reads only the vocabulary); `testing` holds the fakes. A package not named here fails the test until it is given its place.
LAYERS: list[tuple[str, ...]] = [
    ("orchestra", "orchestra.errors", "orchestra.settings", "orchestra.egress", "orchestra.tls",
     "orchestra.redaction", "orchestra.secret_hosts", "orchestra.timestamps", "orchestra.json_body",
     "orchestra.backoff", "orchestra.vocabulary"),
    ("orchestra.db", "orchestra.money", "orchestra.observability"),
    ("orchestra.language",),
    ("orchestra.engine",),
    ("orchestra.services",),
    ("orchestra.core", "orchestra.client"),
    ("orchestra.process",),
    ("orchestra.web",),
    ("orchestra.cli", "orchestra.testing"),
    ("orchestra.__main__",),
]


def unit_of(name: str) -> str:
    """The layer entry a module belongs to: the longest entry that is it or holds it."""
    entries = [entry for layer in LAYERS for entry in layer]
    found = [e for e in entries if name == e or (e != "orchestra" and name.startswith(e + "."))]
    return max(found, key=len) if found else (name if name == "orchestra" else "")


def rank_of(unit: str) -> int:
    return next(n for n, layer in enumerate(LAYERS) if unit in layer)


def against_the_layers(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes sideways or up: `a -> b (layer m -> layer n)`."""
    found = []
    for name in sorted(graph):
        unit = unit_of(name)
        if not unit:
            found.append(f"{name}: in no layer")
            continue
        for target in sorted(graph[name]):
            other = unit_of(target)
            if other == unit or not other:
                continue
            here, there = rank_of(unit), rank_of(other)
            if there < here or (here == there == 0):
                continue
            found.append(f"{name} -> {target} ({unit}, layer {here} -> {other}, layer {there})")
    return found


def test_the_layer_rule_sees_an_import_upwards_and_sideways():
    graph = {
        "orchestra.engine.x": {"orchestra.db.models", "orchestra.language.model", "orchestra.errors"},
        "orchestra.services.hooks": {"orchestra.web.json_body", "orchestra.engine.x"},
        "orchestra.db.models": {"orchestra.money.amounts"},
        "orchestra.language.model": {"orchestra.engine.instances"},
        "orchestra.settings": {"orchestra.egress"},
        "orchestra.shiny": set(),
    }
    assert against_the_layers(graph) == [
        "orchestra.db.models -> orchestra.money.amounts (orchestra.db, layer 1 -> orchestra.money, layer 1)",
        "orchestra.language.model -> orchestra.engine.instances"
        " (orchestra.language, layer 2 -> orchestra.engine, layer 3)",
        "orchestra.services.hooks -> orchestra.web.json_body (orchestra.services, layer 4 -> orchestra.web, layer 7)",
        "orchestra.shiny: in no layer",
    ]


def test_imports_go_down_the_layers():
    """db, money, observability < language < engine < services < core, client < process < web < cli."""
    found = against_the_layers(import_graph())
    assert not found, "imports against the layers:\n" + "\n".join(found)


# `a.b.c = …` in orchestra/: a part is given its collaborators in its constructor, never
# wired afterwards by whoever built it (`engine.store.events.outbox = …`). The few left
# set a field of the code's own record or of a framework's context, not a part:
OWN_RECORDS = {
    "orchestra.cli.render": {"self.outcome", "self.live"},  # the watched run's summary; rich's Live
    "orchestra.engine.provider_gate": {"ticket.slot"},  # the gate's own slot record
    "orchestra.services.uploads": {"self.current"},  # the multipart part being received
    "orchestra.engine.store.postgres": {"self.lease_db"},  # the pool it just made, marked its own
}
FRAMEWORK_CONTEXTS = ("app.config", "app.ctx", "request.ctx")  # Sanic's, in orchestra.web


def wired_late(tree: ast.AST) -> list[str]:
    """Every assignment to an attribute of another object's attribute: `x.y.z = v`."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for item in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(item, ast.Attribute) and isinstance(item.value, ast.Attribute):
                    found.append(ast.unparse(item.value))
    return found


def test_the_wiring_scan_sees_a_late_assignment():
    source = "engine.store.events.outbox = o\nself.x = 1\nself.a.b, c = 1, 2\nx.y += 1\n"
    assert wired_late(ast.parse(source)) == ["engine.store.events", "self.a"]


def test_no_part_is_wired_after_it_was_built():
    found = {}
    for name, path in modules().items():
        allowed = OWN_RECORDS.get(name, set())
        hits = [target for target in wired_late(ast.parse(path.read_text(encoding="utf-8")))
                if target not in allowed
                and not (name.startswith("orchestra.web") and target in FRAMEWORK_CONTEXTS)]
        if hits:
            found[name] = hits
    assert not found, f"collaborators assigned after construction (give them to the constructor): {found}"

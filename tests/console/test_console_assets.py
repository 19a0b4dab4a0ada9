"""The console's pages as served: the strict CSP on every file, nothing fetched from any
other host, the assets a browser loads all present, and `ORCHESTRA_CONSOLE=0` turning it off.
No browser needed: the page is crawled the way a browser would load it."""

from __future__ import annotations

import re

import pytest

from orchestra.web.blueprints.console import CONSOLE_DIR

# Everything a page makes a browser load: src/href attributes (HTML), url() (CSS),
# static and dynamic ES module imports (JS).
HTML_REFERENCE = re.compile(r"""\b(?:src|href)\s*=\s*["']([^"']+)["']""")
CSS_REFERENCE = re.compile(r"""url\(\s*["']?([^"')]+)["']?\s*\)|@import\s+["']([^"']+)["']""")
JS_REFERENCE = re.compile(r"""\bfrom\s*["']([^"']+)["']|\bimport\s*\(?\s*["']([^"']+)["']""")
OUTSIDE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)
CSP_NEEDS = ["default-src 'self'", "script-src 'self'", "connect-src 'self'", "object-src 'none'",
             "frame-ancestors 'none'", "base-uri 'none'"]


def references(path: str, text: str) -> list[str]:
    """What the file at `path` makes a browser load."""
    pattern = CSS_REFERENCE if path.endswith(".css") else JS_REFERENCE if path.endswith(".js") else HTML_REFERENCE
    return [next(g for g in m.groups() if g) for m in pattern.finditer(text)]


def resolve(base: str, ref: str) -> str:
    """`ref` as a path on this origin, relative to the file at `base`."""
    if ref.startswith("/"):
        return ref.split("#")[0]
    parts = base.rsplit("/", 1)[0].split("/")
    for piece in ref.split("/"):
        if piece == "..":
            parts.pop()
        elif piece != ".":
            parts.append(piece)
    return "/".join(parts)


def assert_strict_csp(response) -> None:
    policy = response.headers.get("content-security-policy", "")
    for directive in CSP_NEEDS:
        assert directive in policy, (response.request.url, policy)
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert response.headers["x-content-type-options"] == "nosniff"


async def test_every_loaded_file_is_local_and_carries_the_csp(client):
    index = await client.get("/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert_strict_csp(index)
    assert "<script>" not in index.text and "style=" not in index.text  # no inline script or style
    seen, queue, outside = set(), [("/", index.text)], []
    while queue:
        path, text = queue.pop()
        for ref in references(path if path != "/" else "/index.html", text):
            if ref.startswith(("data:", "#")):
                continue
            if OUTSIDE.match(ref):
                outside.append((path, ref))
                continue
            target = resolve(path if path != "/" else "/index.html", ref)
            if target in seen:
                continue
            seen.add(target)
            response = await client.get(target)
            assert response.status_code == 200, (path, ref, response.text)
            assert_strict_csp(response)
            if target.endswith((".js", ".css", ".html")):
                queue.append((target, response.text))
    assert outside == []
    # The crawl reached every module and style sheet that ships (nothing dead, nothing missing).
    shipped = {"/console/" + p.relative_to(CONSOLE_DIR).as_posix()
               for p in CONSOLE_DIR.rglob("*") if p.suffix in {".js", ".css"}}
    assert shipped <= seen, shipped - seen


async def test_no_shipped_file_names_an_outside_host_to_load(client):
    for path in CONSOLE_DIR.rglob("*"):
        if path.suffix in {".js", ".css", ".html"}:
            for ref in references(path.name, path.read_text()):
                assert not OUTSIDE.match(ref), (path, ref)


async def test_files_outside_the_console_folder_are_not_served(client):
    for probe in ["/console/../settings.py", "/console/%2e%2e/app.py", "/console/js/",
                  "/console/nothing.js", "/console/vendor/../../console.py"]:
        response = await client.get(probe)
        assert response.status_code == 404, probe
        assert response.json()["error"] == "NotFoundError"


async def test_unchanged_files_answer_304_to_their_etag(client):
    first = await client.get("/console/js/app.js")
    assert first.headers["content-type"].startswith("text/javascript")
    again = await client.get("/console/js/app.js", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and again.content == b""


async def test_the_api_keeps_its_json_errors_next_to_the_console(client):
    response = await client.get("/api/v1/nothing")
    assert response.status_code == 404 and response.json()["error"] == "NotFoundError"
    for path in ["/index.html", "/runs", "/console"]:  # no catch-all: only / and the files
        response = await client.get(path)
        assert response.status_code == 404 and response.json()["error"] == "NotFoundError", path


async def test_the_console_is_not_in_the_api_document(client):
    paths = (await client.get("/api/v1/docs/openapi.json")).json()["paths"]
    assert paths and all(path.startswith("/api/v1/") for path in paths)


@pytest.mark.parametrize("settings_overrides", [{"console": False}])
async def test_console_off_answers_404_json_at_the_root(client):
    for path in ["/", "/console/js/app.js"]:
        response = await client.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"] == "NotFoundError"


def test_the_wheel_ships_every_console_file():
    """Each file of the console folder matches a package-data glob of pyproject.toml."""
    import fnmatch
    import tomllib

    pyproject = CONSOLE_DIR.parents[2] / "pyproject.toml"
    globs = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["orchestra.web"]
    web = CONSOLE_DIR.parent
    for path in CONSOLE_DIR.rglob("*"):
        if path.is_file():
            relative = path.relative_to(web).as_posix()
            assert any(fnmatch.fnmatch(relative, g) and relative.count("/") == g.count("/") for g in globs), relative


def test_orchestra_console_0_turns_it_off():
    from orchestra.settings import Settings

    assert Settings.from_env(env={}).console is True
    assert Settings.from_env(env={"ORCHESTRA_CONSOLE": "0"}).console is False


def test_the_stream_listens_for_every_kind_of_event():
    """An EventSource hears only the event names it listens for: a kind missing from
    stream.js's KINDS never reaches a run's page (a workflow step's child link did not)."""
    from orchestra.vocabulary import EventKind

    text = (CONSOLE_DIR / "js" / "stream.js").read_text()
    listed = re.search(r"export const KINDS = \[(.*?)\];", text, re.DOTALL).group(1)
    assert set(re.findall(r"'([a-z_]+)'", listed)) == {kind.value for kind in EventKind}


def test_every_module_is_preloaded():
    """docs/console.md: every module is a `<link rel="modulepreload">` of index.html (the
    page's own script aside), so none is found only by a waterfall of imports."""
    page = (CONSOLE_DIR / "index.html").read_text(encoding="utf-8")
    preloaded = set(re.findall(r'<link rel="modulepreload" href="([^"]+)">', page))
    modules = {f"/console/{path.relative_to(CONSOLE_DIR).as_posix()}"
               for path in CONSOLE_DIR.rglob("*.js")} - {"/console/js/app.js"}
    assert modules - preloaded == set()
    assert preloaded - modules == set()  # nor a file that is gone

"""`build_document(app)`: the OpenAPI 3.1 document, from the router and the handlers' models.

Every route under `/api/v1` (the docs pages aside) must carry `@documented`, or the
build fails: a route cannot exist without its description. Request schemas come from
the pydantic models the handlers validate with; what the guards add (`@protected`,
`@rate_limited`) is read from the handlers themselves.
"""

from __future__ import annotations

import re
from typing import Any

import pydantic
from pydantic.json_schema import models_json_schema
from sanic import Sanic

from orchestra import __version__
from orchestra.services.roles import Role
from orchestra.web.apidoc import models
from orchestra.web.apidoc.operation import Link, Operation, operation_of
from orchestra.web.apidoc.rules import AMENDMENTS, NO_NUL, REF, REFERENCED_MODELS
from orchestra.web.validation import STR_MAX, Body

API_PREFIX = "/api/v1/"
DOCS_PREFIX = "/api/v1/docs"
SKIPPED_METHODS = {"HEAD", "OPTIONS"}  # answered for every route; not operations of their own

ERROR_TEXT = {
    400: "BadRequestError: the body is not a JSON object, or a malformed request.",
    401: "AuthenticationRequiredError, TokenInvalidError or TokenExpiredError.",
    403: "PermissionDeniedError: the role does not allow this.",
    404: "NotFoundError: no such resource (or not yours).",
    409: "ConflictError: the request conflicts with the current state.",
    413: "PayloadTooLargeError: the body is over its limit.",
    422: "ValidationError: the body does not match its schema; detail lists {field, problem}.",
    429: "RateLimitedError: too many requests from this client; see Retry-After.",
    431: "RequestHeaderFieldsTooLargeError: a header, or all of them, over the limit.",
    502: "ProviderError: the model provider refused or could not be reached.",
    503: "OverloadedError: the server is busy; or StoreUnavailableError: the store cannot "
         "be reached for a moment. See Retry-After.",
}
_RATE_HEADERS = {
    name: {"description": text, "required": True, "schema": {"type": "integer", "minimum": 0}}
    for name, text in (
        ("RateLimit-Limit", "Requests allowed in the window."),
        ("RateLimit-Remaining", "Requests left in the window."),
        ("RateLimit-Reset", "Seconds until the window resets."),
    )
}
_RETRY_AFTER = {"description": "Seconds to wait.", "schema": {"type": "integer", "minimum": 0}}


class DocumentError(RuntimeError):
    """The document cannot be built as the code stands."""


class UndocumentedRoute(DocumentError):
    """A route under /api/v1 without `@documented`, or a link to an unknown operation."""


def api_routes(app: Sanic) -> list[tuple[str, str, Any, str]]:
    """(OpenAPI path, method, handler, operationId) of every API route of `app`."""
    found = []
    for route in app.router.routes:
        path = "/" + route.path.lstrip("/")
        if not path.startswith(API_PREFIX) or path.startswith(DOCS_PREFIX):
            continue
        name = route.name.split(".", 1)[1] if "." in route.name else route.name
        openapi_path = re.sub(r"<(\w+)(?::[^>]*)?>", r"{\1}", path)
        for method in sorted(route.methods - SKIPPED_METHODS):
            found.append((openapi_path, method.lower(), route.handler, name))
    return found


def build_document(app: Sanic) -> dict[str, Any]:
    """The whole document; UndocumentedRoute when a route lacks its description."""
    routes = api_routes(app)
    missing = [f"{m.upper()} {p}" for p, m, h, _ in routes if operation_of(h) is None]
    if missing:
        raise UndocumentedRoute("routes without @documented: " + ", ".join(missing))
    schemas = _component_schemas([operation_of(h) for _, _, h, _ in routes],
                                 getattr(app.ctx, "settings", None))
    operation_ids = {name for *_, name in routes}
    paths: dict[str, dict[str, Any]] = {}
    for path, method, handler, name in routes:
        paths.setdefault(path, {})[method] = _operation(path, handler, name, operation_ids)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "orchestra",
            "version": __version__,
            "description": "Agent-orchestration backend: auth, agent platform, workflow runs. "
            "Every error is {message, error, detail?} (the Error schema). A JSON body is at "
            "most 1 MiB (413) and none of its strings may be longer than "
            f"{STR_MAX} characters (422).",
        },
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                    "description": "An access token (JWT), or an API key (`orc_…`, POST /auth/key) on "
                    "the routes whose `x-api-key-scope` names the scope it needs.",
                },
                "access_token": {
                    "type": "apiKey",
                    "in": "query",
                    "name": "access_token",
                    "description": "The access token in the query, for a browser's EventSource (SSE only).",
                },
            },
        },
    }


# --- operations ---------------------------------------------------------------------


def _operation(path: str, handler, name: str, operation_ids: set[str]) -> dict[str, Any]:
    op: Operation = operation_of(handler)
    role: Role | None = getattr(handler, "required_role", None)
    rate_limit = getattr(handler, "rate_limit", None)
    path_params = re.findall(r"{(\w+)}", path)
    result: dict[str, Any] = {
        "operationId": name,
        "summary": op.summary,
        "tags": [name.split(".")[0]],
    }
    if op.description:
        result["description"] = op.description
    parameters = [
        {"name": p, "in": "path", "required": True, "schema": op.path.get(p, {"type": "string"})}
        for p in path_params
    ]
    parameters += [
        {"name": p.name, "in": p.where, "required": p.required, "description": p.description, "schema": p.schema}
        for p in op.params
    ]
    if parameters:
        result["parameters"] = parameters
    if op.body is not None:
        result["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(op.body)}},
        }
    elif op.request_content is not None:
        result["requestBody"] = {"required": True, "content": _content(op.request_content)}
    if role is not None:
        # which scope an API key needs here; null: keys are refused (403)
        result["x-api-key-scope"] = getattr(handler, "key_scope", None)
        result["security"] = [{"bearer": []}]
        if getattr(handler, "token_in_query", False):
            result["security"].append({"access_token": []})
    else:
        result["security"] = []
    result["responses"] = _responses(op, role, rate_limit, bool(path_params), name, operation_ids)
    return result


def _responses(op: Operation, role, rate_limit, has_path_params: bool, name: str, ids: set[str]) -> dict:
    success: dict[str, Any] = {"description": op.summary}
    if op.response is not None:
        success["content"] = {"application/json": {"schema": _ref(op.response)}}
    elif op.response_content is not None:
        success["content"] = op.response_content
    if rate_limit:
        success["headers"] = dict(_RATE_HEADERS)
    if op.links:
        success["links"] = {key: _link(link, name, ids) for key, link in op.links.items()}
    responses: dict[str, Any] = {str(op.status): success}
    for status, text in op.extra_responses.items():
        responses[str(status)] = {"description": text}
    statuses = {431: None, 503: None}
    if role is not None:
        statuses[401] = None
        if role is not Role.USER:
            statuses[403] = f"PermissionDeniedError: this needs the role {role.value} or above."
    if has_path_params:
        statuses[404] = None
    if op.body is not None:
        statuses.update({400: None, 413: None, 422: None})
    if rate_limit:
        statuses[429] = None
    statuses.update(op.errors)
    for status in sorted(statuses):
        responses[str(status)] = _error_response(status, statuses[status], rate_limit)
    return responses


def _error_response(status: int, text: str | None, rate_limit: str | None) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": text or ERROR_TEXT[status],
        "content": {"application/json": {"schema": _ref(models.Error)}},
    }
    headers = {}
    if rate_limit:  # answers made before the handler runs (431, 413 …) carry none of them
        required = status == 429
        headers = {name: {**spec, "required": required} for name, spec in _RATE_HEADERS.items()}
    if status == 429:
        headers["Retry-After"] = {**_RETRY_AFTER, "required": True}
    if status == 503:
        headers["Retry-After"] = _RETRY_AFTER
    if headers:
        response["headers"] = headers
    return response


def _link(link: Link, source: str, ids: set[str]) -> dict[str, Any]:
    if link.target not in ids:
        raise UndocumentedRoute(f"{source} links to unknown operation {link.target}")
    result: dict[str, Any] = {"operationId": link.target}
    if link.parameters:
        result["parameters"] = dict(link.parameters)
    if link.request_body is not None:
        result["requestBody"] = link.request_body
    if link.description:
        result["description"] = link.description
    return result


def _content(content: dict[str, Any]) -> dict[str, Any]:
    """Media types whose `schema` may be a model class."""
    out = {}
    for media, spec in content.items():
        spec = dict(spec)
        if isinstance(spec.get("schema"), type):
            spec["schema"] = _ref(spec["schema"])
        out[media] = spec
    return out


def _ref(model: type[pydantic.BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


# --- component schemas -------------------------------------------------------------


def _models_of(operations: list[Operation]) -> list[type[pydantic.BaseModel]]:
    found: list[type[pydantic.BaseModel]] = [models.Error]
    for op in operations:
        found += [m for m in (op.body, op.response) if m is not None]
        for spec in (op.request_content or {}).values():
            if isinstance(spec.get("schema"), type):
                found.append(spec["schema"])
    return list(dict.fromkeys(found))


def _component_schemas(operations: list[Operation], settings: Any = None) -> dict[str, Any]:
    """Every model's JSON Schema (2020-12, which OpenAPI 3.1 uses), cleaned for the document.
    A model class placed in a field's documented rule (`items=Step`) is added as well; a
    model with a `settings_schema(schema, settings)` hook states the rules this server's
    settings make (the stdio commands it allows)."""
    wanted = _models_of(operations)
    while True:
        pairs = [(m, "validation") for m in wanted]
        _, top = models_json_schema(pairs, ref_template=REF)
        defs = top.get("$defs", {})
        clashes = [m.__name__ for m in wanted if m.__name__ not in defs]
        if clashes:  # two models of one name get module-qualified names: references would dangle
            raise DocumentError(f"model names used twice: {', '.join(clashes)}")
        embedded = [REFERENCED_MODELS[n] for n in _refs(defs) if n not in defs and n in REFERENCED_MODELS]
        if not embedded:
            break
        wanted += embedded
    by_name = _all_models(wanted)
    refusing = _refusing_nul(defs, {name for name, model in by_name.items() if _refuses_nul(model)})
    schemas = {name: _clean(schema, refuse_nul=name in refusing) for name, schema in sorted(defs.items())}
    if any(_refs(schema) & {JSON_TEXT} for schema in schemas.values()):
        schemas[JSON_TEXT] = _json_text()
    for name, schema in schemas.items():
        if name in AMENDMENTS:
            AMENDMENTS[name](schema)
        hook = getattr(by_name.get(name), "settings_schema", None)
        if hook is not None and settings is not None:
            hook(schema, settings)
    return schemas


def _refusing_nul(defs: dict[str, Any], roots: set[str]) -> set[str]:
    """The components whose strings refuse NUL: those of bodies that refuse it, and every
    component such a body refers to (a template's Step, Foreach, Loop …)."""
    found = set(roots)
    while True:
        more = set().union(*(_refs(defs[name]) for name in found if name in defs)) - found
        if not more:
            return found
        found |= more


JSON_TEXT = "JsonWithoutNul"


def _json_text() -> dict[str, Any]:
    """Any JSON value whose strings and keys hold no NUL (a body's free-form fields)."""
    ref = {"$ref": REF.format(model=JSON_TEXT)}
    return {
        "description": "Any JSON value without the NUL character in a string or key.",
        "anyOf": [
            {"type": "string", "pattern": NO_NUL},
            {"type": ["number", "boolean", "null"]},
            {"type": "array", "items": ref},
            {"type": "object", "propertyNames": {"pattern": NO_NUL}, "additionalProperties": ref},
        ],
    }


def _refs(value: Any) -> set[str]:
    """The component names `value` refers to."""
    if isinstance(value, dict):
        found = {value["$ref"].rsplit("/", 1)[-1]} if isinstance(value.get("$ref"), str) else set()
        return found.union(*(_refs(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_refs(v) for v in value))
    return set()


def _embedded_models(value: Any) -> list[type[pydantic.BaseModel]]:
    if isinstance(value, type) and issubclass(value, pydantic.BaseModel):
        return [value]
    if isinstance(value, list):
        return [m for item in value for m in _embedded_models(item)]
    return []


def _all_models(roots: list[type[pydantic.BaseModel]]) -> dict[str, type[pydantic.BaseModel]]:
    """Every model reachable from `roots` through fields, by class name."""
    seen: dict[str, type[pydantic.BaseModel]] = {}
    stack = list(roots)
    while stack:
        model = stack.pop()
        if model.__name__ in seen:
            continue
        seen[model.__name__] = model
        for field in model.model_fields.values():
            stack += _embedded_models(list(_walk_types(field.annotation)))
    return seen


def _walk_types(annotation: Any):
    yield annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        yield from _walk_types(arg)


def _refuses_nul(model: type | None) -> bool:
    return bool(model and issubclass(model, Body) and not getattr(model, "accepts_nul", False))


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")


def _clean(schema: Any, *, refuse_nul: bool) -> Any:
    """Drop pydantic's titles and impossible `default: null`s, and (for bodies that refuse
    NUL) state it on every free string."""
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k != "title"}
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = _clean(out[key], refuse_nul=refuse_nul)
    for key in _SUBSCHEMA_LISTS:
        if key in out:
            out[key] = [_clean(s, refuse_nul=refuse_nul) for s in out[key]]
    if "properties" in out:
        out["properties"] = {k: _clean(v, refuse_nul=refuse_nul) for k, v in out["properties"].items()}
    if out.get("maxLength") == STR_MAX:  # every body string's cap; the 1 MiB body limit comes first
        del out["maxLength"]
    if out.get("propertyNames") == {}:  # a key's cap (STR_MAX) only: nothing left to say
        del out["propertyNames"]
    if refuse_nul:
        _refuse_nul(out)
    if "default" in out and out["default"] is None and not _allows_null(out):
        del out["default"]
    return out


def _refuse_nul(out: dict) -> None:
    """State on a cleaned schema of a body that refuses NUL that its free strings, free
    maps' keys and free values cannot hold one."""
    if out.get("type") == "object" and "propertyNames" not in out and _is_free_map(out):
        out["propertyNames"] = {"pattern": NO_NUL}  # a key is a string of the body too
        if out.get("additionalProperties", True) is True:
            out["additionalProperties"] = {"$ref": REF.format(model=JSON_TEXT)}
    if _is_any(out):
        out["$ref"] = REF.format(model=JSON_TEXT)
    if _is_free_string(out):
        out["pattern"] = NO_NUL


def _allows_null(schema: dict) -> bool:
    if schema.get("type") == "null" or "null" in (schema.get("type") or []):
        return True
    return any(_allows_null(s) for s in schema.get("anyOf", []) + schema.get("oneOf", []))


_SHAPING = ("type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const", "properties", "not")


def _is_any(schema: dict) -> bool:
    """A schema that allows any JSON value (pydantic's `Any`)."""
    return not any(key in schema for key in _SHAPING)


def _is_free_map(schema: dict) -> bool:
    """An object whose keys the model does not name (a dict field)."""
    return "properties" not in schema and schema.get("additionalProperties", True) is not False


def _is_free_string(schema: dict) -> bool:
    return (
        schema.get("type") == "string"
        and "pattern" not in schema
        and "enum" not in schema
        and "const" not in schema
    )

"""`/api/v1/workflow`: template versions, their diff and restore, and forks (SPEC §13)."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from sanic import Blueprint, Request
from sanic.response import json

from orchestra.errors import NotFoundError, PermissionDeniedError
from orchestra.observability import tracing
from orchestra.services import forks, runs, templates, versions
from orchestra.services.roles import Role
from orchestra.vocabulary import RunStatus
from orchestra.web.apidoc import version_models as out
from orchestra.web.apidoc.operation import Link, documented, header, query
from orchestra.web.apidoc.rules import rule
from orchestra.web.auth import protected
from orchestra.web.paging import count_arg
from orchestra.web.responses import SUCCESS
from orchestra.web.validation import Body, parse_body

bp = Blueprint("versions", url_prefix="/workflow")

VERSION_MAX = 2**31 - 1
_TRACE = {"trace_id": "$response.body#/trace_id"}
_NUMBER = {"type": "string", "pattern": "^[1-9][0-9]{0,9}$",
           "description": "A version number (1, 2, …); anything else names no version (404)."}


class ForkBody(Body):
    from_step: str | None = rule(None, description="Run this step again (and whatever reads it); "
                                 "an unknown step is a 422.", maxLength=128)
    input: Any = rule(None, description="The fork's input (default: the source run's); steps whose "
                      "rendered prompt or conditions read a changed part run again.")
    outputs: dict[str, Any] | None = rule(
        None, description="{step_id: output}: these top-level steps are not run; their outputs are "
        "these values, checked against each step's output_schema (422 with the path).")
    version: int | None = Field(None, ge=1, le=VERSION_MAX,
                                description="Run the fork on this version of the template "
                                "(default: the source run's steps); unchanged steps are reused.")


def _who(request: Request) -> dict[str, Any]:
    principal = request.ctx.principal
    return {"user_id": principal.user_id, "is_admin": principal.is_admin}


def _number(raw: str) -> int:
    """A version number in a path; anything else names no version (404)."""
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 10 or not 1 <= int(raw) <= VERSION_MAX:
        raise NotFoundError(f"No version '{raw[:40]}': versions are numbered 1, 2, …")
    return int(raw)


@bp.get("/template/<template_id:str>/versions")
@documented("List a template's versions, newest first", response=out.VersionList,
            description="Every save made one; no content is read (see GET …/versions/{version}).")
@protected(Role.USER, scope="template:read")
async def list_versions(request: Request, template_id: str):
    rows = await versions.list_versions(request.app.ctx.core, template_id=template_id, **_who(request))
    return json({"message": SUCCESS, "template_id": template_id,
                 "versions": rows})


@bp.get("/template/<template_id:str>/versions/<number:str>")
@documented("Read one version of a template", response=out.Version, path={"number": _NUMBER},
            errors={404: "NotFoundError: no template you may read has this id, or it has no such version."})
@protected(Role.USER, scope="template:read")
async def get_version(request: Request, template_id: str, number: str):
    template, row = await versions.read_version(
        request.app.ctx.core, template_id=template_id, number=_number(number), **_who(request))
    core = request.app.ctx.core
    view = templates.with_worker_names(versions.version_view(template, row), await templates.worker_names(core, row.steps))
    return json({"message": SUCCESS, "template_id": template.id, "version": view})


@bp.get("/template/<template_id:str>/diff")
@documented(
    "The structural diff of two versions", response=out.VersionDiff,
    description="Steps matched by id, inner steps of foreach and loop by their own ids; a step's "
    "`fields` are its own top-level keys that differ (a container's inner steps are not its own).",
    errors={404: "NotFoundError: no such template or version.",
            422: "ValidationError: from or to is not a whole number."},
    params=(query("from", "The older version (default: the one before `to`).", type="integer",
                  minimum=1, maximum=VERSION_MAX),
            query("to", "The newer version (default: the latest).", type="integer", minimum=1,
                  maximum=VERSION_MAX)),
)
@protected(Role.USER, scope="template:read")
async def diff(request: Request, template_id: str):
    def arg(name: str) -> int | None:
        if request.args.get(name) is None:
            return None
        return count_arg(request, name, default=1, low=1, high=VERSION_MAX)

    body = await versions.diff_versions(request.app.ctx.core, template_id=template_id,
                                        from_version=arg("from"), to_version=arg("to"), **_who(request))
    return json({"message": SUCCESS, **body})


@bp.post("/template/<template_id:str>/versions/<number:str>/restore")
@documented(
    "Restore a version: save its content as the newest version", response=out.Restored, status=201,
    path={"number": _NUMBER},
    description="Checked like any save: a worker since deleted is a 422, a name since taken a 409 "
    "(then no version is made).",
    errors={403: "PermissionDeniedError: a shared template, restored by a non-administrator.",
            404: "NotFoundError: no such template or version.",
            409: "ConflictError: another of your templates has that version's name now."},
)
@protected(Role.USER, scope="template:write")
async def restore(request: Request, template_id: str, number: str):
    restored = _number(number)
    template = await versions.restore(request.app.ctx.core, template_id=template_id, number=restored,
                                      **_who(request))
    return json({"message": SUCCESS, "template_id": template.id, "version": template.version,
                 "restored_from": restored,
                 "template": await templates.named_view(request.app.ctx.core, template)}, status=201)


@bp.post("/run/<trace_id:str>/fork")
@documented(
    "Fork a run: a new run that reuses what the source run finished", body=ForkBody,
    response=out.RunForked, status=202,
    description="Every step instance of the source that succeeded is reused (`reused: true`, its "
    "output copied, its provider never called, a `step_reused` event) unless it is from_step, "
    "reads from_step or a changed input (directly or through other steps), reads an overridden "
    "output, or its definition differs in `version`. foreach items and loop iterations are "
    "reused one by one. The source may still be running.",
    errors={403: "PermissionDeniedError: an API key limited to other templates; `version`, `input` or "
                 "`outputs` sent by anyone but the run's owner.",
            404: "NotFoundError: no run you may read has this id, or no such version.",
            413: "PayloadTooLargeError: an output is larger than a step's output may be.",
            422: "ValidationError: unknown from_step; an output of an unknown step, of from_step or "
                 "a step downstream of it, or not of the step's kind (its output_schema; an HTTP "
                 "step's {status, headers, body}; a foreach's list; a child's output_schema; "
                 "detail has the path); "
                 "an input the template's input_schema refuses."},
    links={"Read": Link("workflow.get_run", _TRACE), "Stream": Link("workflow.stream", _TRACE)},
    params=(header("traceparent", "W3C trace context: the fork's spans join this trace."),),
)
@protected(Role.USER, scope="run:start")
async def fork(request: Request, trace_id: str):
    body = parse_body(request, ForkBody) if (request.body or b"").strip() else ForkBody()
    sent = body.model_fields_set
    key = request.ctx.principal.key
    if key is not None and key.templates is not None:  # a key limited to some templates
        source = await runs.get_run(request.app.ctx.core, trace_id=trace_id, **_who(request))
        if not key.allows_template(source.template_id):
            raise PermissionDeniedError("This API key may not start runs of that template.")
    run = await forks.fork_run(
        request.app.ctx.core, trace_id=trace_id, from_step=body.from_step,
        input=body.input if "input" in sent else forks.UNSET, outputs=body.outputs,
        version=body.version, trace_parent=tracing.parent_for_run(request.headers), **_who(request),
    )
    return json({"message": SUCCESS, "trace_id": run.trace_id, "status": RunStatus.QUEUED,
                 "forked_from": trace_id}, status=202)

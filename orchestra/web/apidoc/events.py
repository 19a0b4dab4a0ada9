"""The SSE event kinds and their fields, as the document describes the stream."""

from __future__ import annotations

from orchestra.vocabulary import EventKind

# kind -> the fields its `data` carries besides trace_id, seq, ts (and step_id for steps)
EVENT_FIELDS: dict[EventKind, str] = {
    EventKind.RUN_STARTED: '`status: "running"`, `input`, `steps: [ids]`',
    EventKind.STEP_STARTED: "`agent`, `prompt` (rendered; an agent step's: a human step's question is "
                    "stored once, in its `reply_requested`); an http step's `http: {method, url}` (the "
                    "URL as written, secrets as placeholders); a workflow step's `workflow`",
    EventKind.TOKEN: "`text`: streamed model text, coalesced about every 50 ms",
    EventKind.TOOL_CALL: "`call_id`, `name`, `arguments` (object)",
    EventKind.TOOL_RESULT: "`call_id`, `name`, `result` (string or null), `error` (only on failure)",
    EventKind.REPLY_REQUESTED: "`request_id`, `prompt`, `schema` (a human step with output_schema); "
                       "a child run's question shown on its parent adds `child_trace_id` and "
                       "`child_step_id` (answer it on the child's trace)",
    EventKind.REPLY_RECEIVED: "`request_id`, `content` (text, or the JSON value)",
    EventKind.REPLY_WITHDRAWN: "`request_id`: a question of an earlier attempt that the restarted step "
                       "did not ask again; a reply to it is 409",
    EventKind.REPLY_TIMED_OUT: "`request_id`, `content`: the human step's `default`, now its output",
    EventKind.STEP_FINISHED: "`output` (text or JSON value), `usage: {prompt_tokens, completion_tokens, "
                     "cached_tokens?}` (null for human steps), `cost_usd` (exact decimal string; "
                     "null when its model has no known price; absent for a step that called no "
                     "model); `reused: true` for a step copied by a retried run",
    EventKind.STEP_FAILED: "`error` (the provider's message, where it gave one; `timed out after N s`)",
    EventKind.STEP_SKIPPED: '`reason`: `"when"` (its condition was false) or `"dependencies"` (all skipped)',
    EventKind.STEP_RETRYING: "`attempt` (the one that failed), `error`, `delay_seconds`",
    EventKind.CHILD_STARTED: "`child_trace_id`, `path`, `template_id`: a workflow step started its child run",
    EventKind.CHILD_FINISHED: "`child_trace_id`, `path`, `status`: that child run ended",
    EventKind.STEP_REUSED: "`source_trace_id`, `output`, `path`: a fork's instance copied from the run it forks, "
                   "its provider not called (announced at the start, or when reached for a call decided at "
                   "run time); `overridden: true` when the fork's `outputs` set it; `source_path` when the "
                   "source's call was at another path (an item that moved in the mapped list)",
    EventKind.RUN_RESUMED: "`attempt`, `restarted_steps`: another server process took the run over; `reason: \"budget\"`: it goes on after a top-up (SPEC §15b)",
    EventKind.RUN_FINISHED: '`status: "succeeded"`, `output` (the template\'s `output`, else the last step\'s)',
    EventKind.RUN_FAILED: '`status: "failed"`, `error`, `failed_step`; or `status: "interrupted"`, `reason`',
    EventKind.RUN_CANCELLED: '`status: "cancelled"`, `reason`',
    EventKind.BUDGET_EXCEEDED: "`budget_usd`, `spent_usd`, `budget_trace_id` (whose budget: the run's, or a run "
                       "above it, SPEC §14): the next model call's reservation did not fit "
                       "(`on_budget: fail` of that run); `run_failed` follows",
    EventKind.BUDGET_EXHAUSTED: '`status: "waiting_budget"`, `budget_usd`, `spent_usd`, `budget_trace_id`: the run '
                        "waits, held by no process, until `POST /run/{trace_id}/budget` (`on_budget: pause`); "
                        "on a parent, with `child_trace_id`: a run below it waits",
}


def stream_description() -> str:
    rows = "\n".join(f"| `{kind}` | {fields} |" for kind, fields in EVENT_FIELDS.items())
    return (
        "`text/event-stream`: each event is `id: <seq>`, `event: <kind>`, `data: <json>`. "
        "Stored events after `Last-Event-ID` come first, then live ones, with no gap and no "
        "duplicate; a `: ping` comment keeps the connection alive; the stream ends after the "
        "terminal event (`run_finished`, `run_failed`, `run_cancelled`). A browser's "
        "`EventSource` may send the token as `?access_token=`.\n\n"
        "Every `data` has `trace_id`, `seq`, `ts` and, for step events, `step_id`; a step's "
        "events from its second attempt on carry `attempt` (a client resets that step's text).\n\n"
        "| kind | fields |\n|---|---|\n" + rows
    )


def event_schema() -> dict:
    """One event of the stream, as an SSE client parses it (`{event, id, data}`; comments
    and the data-less `retry:` of a stream deadline are no events). `data` is the text of a
    JSON object; `contentSchema` says which (OpenAPI 3.1 reads `schema` of an event stream
    as the schema of each event)."""
    return {
        "type": "object",
        "required": ["event", "id", "data"],
        "properties": {
            "event": {"type": "string", "enum": list(EVENT_FIELDS),
                      "description": "The event kind (see the table above)."},
            "id": {"type": "string", "pattern": "^[1-9][0-9]{0,17}$",
                   "description": "The event's seq: send it back as Last-Event-ID to resume."},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": {
                    "type": "object",
                    "required": ["trace_id", "seq", "ts"],
                    "properties": {
                        "trace_id": {"type": "string"},
                        "seq": {"type": "integer", "minimum": 1},
                        "ts": {"type": "string", "format": "date-time"},
                        "step_id": {"type": "string"},
                    },
                },
                "pattern": r'^\{[\s\S]*"seq":',
                "description": "A JSON object: trace_id, seq, ts (step_id for step events) and the kind's fields.",
            },
            "retry": {"type": "integer", "minimum": 0},
        },
    }

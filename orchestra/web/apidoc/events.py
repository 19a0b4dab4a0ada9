"""The SSE event kinds and their fields, as the document describes the stream."""

from __future__ import annotations

# kind -> the fields its `data` carries besides trace_id, seq, ts (and step_id for steps)
EVENT_FIELDS: dict[str, str] = {
    "run_started": '`status: "running"`, `input`, `steps: [ids]`',
    "step_started": "`agent`, `prompt` (rendered)",
    "token": "`text`: streamed model text, coalesced about every 50 ms",
    "tool_call": "`call_id`, `name`, `arguments` (object)",
    "tool_result": "`call_id`, `name`, `result` (string or null), `error` (only on failure)",
    "reply_requested": "`request_id`, `prompt`",
    "reply_received": "`request_id`, `content`",
    "reply_withdrawn": "`request_id`: a question of an earlier attempt that the restarted step "
                       "did not ask again; a reply to it is 409",
    "step_finished": "`output`, `usage: {prompt_tokens, completion_tokens}` (null for human steps)",
    "step_failed": "`error` (the provider's message, where it gave one)",
    "run_resumed": "`attempt`, `restarted_steps`: another server process took the run over",
    "run_finished": '`status: "succeeded"`, `output` (the last step\'s output)',
    "run_failed": '`status: "failed"`, `error`, `failed_step`; or `status: "interrupted"`, `reason`',
    "run_cancelled": '`status: "cancelled"`, `reason`',
}


def stream_description() -> str:
    rows = "\n".join(f"| `{kind}` | {fields} |" for kind, fields in EVENT_FIELDS.items())
    return (
        "`text/event-stream`: each event is `id: <seq>`, `event: <kind>`, `data: <json>`. "
        "Stored events after `Last-Event-ID` come first, then live ones, with no gap and no "
        "duplicate; a `: ping` comment keeps the connection alive; the stream ends after the "
        "terminal event (`run_finished`, `run_failed`, `run_cancelled`). A browser's "
        "`EventSource` may send the token as `?access_token=`.\n\n"
        "Every `data` has `trace_id`, `seq`, `ts` and, for step events, `step_id`.\n\n"
        "| kind | fields |\n|---|---|\n" + rows
    )

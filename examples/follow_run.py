"""Start a workflow run and follow its event stream: a client in ~60 lines of httpx + httpx-sse.

    python examples/follow_run.py --server http://127.0.0.1:8000 --token "$TOKEN" \
        --template TEMPLATE_ID --input "the moon landing"

--server defaults to $ORCHESTRA_SERVER, else http://127.0.0.1:$ORCHESTRA_PORT (8000);
--token to $ORCHESTRA_TOKEN. A server that cannot be reached is one line and exit 1.

Prints one line per event. If the connection drops it reconnects with `Last-Event-ID`
(the server then sends only what was missed); it stops after the run's terminal event
or when the server answers 204. A run that asks a question is answered with
`POST /api/v1/workflow/reply/{trace_id}` (here: `orchestra workflow reply …`).
"""

import argparse
import json
import os
import sys
import time

import httpx
from httpx_sse import connect_sse

TERMINAL = {"run_finished", "run_failed", "run_cancelled"}


def follow(client: httpx.Client, trace_id: str) -> None:
    last_id = None
    while True:
        headers = {"Last-Event-ID": last_id} if last_id else {}
        try:
            with connect_sse(client, "GET", f"/workflow/sse/{trace_id}", headers=headers) as source:
                if source.response.status_code == 204:  # nothing more will come
                    return
                source.response.raise_for_status()
                for sse in source.iter_sse():
                    last_id = sse.id
                    print(line(sse.id, sse.event, json.loads(sse.data)), flush=True)
                    if sse.event in TERMINAL:
                        return
        except httpx.TransportError as exc:
            print(f"(connection lost: {exc}; resuming after event {last_id})", flush=True)
            time.sleep(1)


def line(seq: str, kind: str, data: dict) -> str:
    """`  12 tool_call        [numbers] calculator({"expression": "12*7+1"})`; the lines of a
    multi-line text are indented under the first, so the columns stay put."""
    step = f"[{data['step_id']}] " if "step_id" in data else ""
    if kind == "tool_call":
        detail = f"{data.get('name')}({json.dumps(data.get('arguments', {}))})"
    elif kind == "tool_result":
        detail = f"{data.get('name')} → {data.get('error') or data.get('result')}"
    else:
        detail = str(data.get("text") or data.get("output") or data.get("prompt") or data.get("content") or "")
    head = f"{seq:>4} {kind:<16} {step}"
    return (head + detail.replace("\n", "\n" + " " * len(head))).rstrip()


def default_server() -> str:
    return os.environ.get("ORCHESTRA_SERVER") or f"http://127.0.0.1:{os.environ.get('ORCHESTRA_PORT') or 8000}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=default_server(), help="default: $ORCHESTRA_SERVER or $ORCHESTRA_PORT")
    parser.add_argument("--token", default=os.environ.get("ORCHESTRA_TOKEN"), help="an access token")
    parser.add_argument("--template", required=True, help="template_id to run")
    parser.add_argument("--input", default="", help="the run's input text")
    args = parser.parse_args()

    headers = {"Authorization": f"Bearer {args.token}"}
    timeout = httpx.Timeout(10.0, read=60.0)  # the server pings every 15 s
    server = args.server.rstrip("/")
    with httpx.Client(base_url=f"{server}/api/v1", headers=headers, timeout=timeout) as client:
        try:
            started = client.post("/workflow/run", json={"template_id": args.template, "input": args.input})
        except httpx.TransportError as exc:
            reason = "connection refused" if "refused" in str(exc).lower() else str(exc) or type(exc).__name__
            sys.exit(f"cannot reach the server at {server} ({reason}); "
                     "is it running? (--server, ORCHESTRA_SERVER or ORCHESTRA_PORT)")
        if started.status_code != 202:
            sys.exit(f"could not start the run: {started.json().get('message')}")
        trace_id = started.json()["trace_id"]
        print(f"run {trace_id}", flush=True)
        follow(client, trace_id)


if __name__ == "__main__":
    main()

"""`orchestra usage`, `orchestra workflow budget` and the costs `workflow show` / `watch`
print (SPEC §12), run as a terminal would against a real server process and a fake model
with prices: a run paused by its budget, topped up from the CLI, and what it cost."""

from __future__ import annotations

import datetime as dt
import json
import time
from decimal import Decimal

import httpx
import pytest

from orchestra.cli.console import ExitCode
from tests.cli.cli_harness import PASSWORD, ClientCLI, setup_world
from tests.conftest import ServerProcess
from tests.fakes.fake_llm import FakeLLM
from tests.web.conftest import PRICES

pytestmark = pytest.mark.e2e

# Each call reserves $0.12 (an upper bound of 100 prompt tokens and 10 answer tokens) and
# costs $0.01 (tests/web/test_spend_routes.py): a budget of $0.125 pays for one call.
PROMPT = "Say {{input}} fake:cached=2"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A server (answers capped at 10 tokens), a priced provider, a tool-less worker, a
    three-step template under a $0.125 pausing budget, and root's CLI, logged in."""
    with FakeLLM() as llm:
        server = ServerProcess(tmp_path_factory.mktemp("srv"), env={
            "ORCHESTRA_LLM_MAX_TOKENS": "10", "ORCHESTRA_LLM_RETRIES": "0"}).start()
        try:
            info = setup_world(server, llm.base_url)
            api = httpx.Client(base_url=f"{server.base_url}/api/v1",
                               headers={"Authorization": f"Bearer {info['token']}"})
            priced = api.put(f"/provider/{info['provider_id']}", json={"prices": PRICES})
            assert priced.status_code == 200, priced.text
            worker = api.post("/agent/worker", json={"name": "bare", "provider_id": info["provider_id"],
                                                     "tools": []}).json()["worker_id"]
            steps = [{"id": f"s{i}", "agent": {"worker": worker}, "prompt": PROMPT,
                      "depends_on": [f"s{i - 1}"] if i else []} for i in range(3)]
            made = api.post("/workflow/template", json={
                "name": "paid", "steps": steps, "limits": {"budget_usd": "0.125", "on_budget": "pause"}})
            assert made.status_code == 201, made.text
            cli = ClientCLI(tmp_path_factory.mktemp("client"))
            done = cli("login", "--server", server.base_url, "--user", "root", "--password-stdin",
                       input=PASSWORD + "\n")
            assert done.returncode == 0, done.stderr
            yield {**info, "cli": cli, "api": api, "llm": llm, "template": made.json()["template_id"]}
            api.close()
        finally:
            server.stop()


def wait_status(api: httpx.Client, trace_id: str, status: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = api.get(f"/workflow/run/{trace_id}").json()
        if run["status"] == status or time.monotonic() > deadline:
            assert run["status"] == status, run
            return run
        time.sleep(0.1)


def test_a_paused_run_is_topped_up_from_the_cli_and_shows_what_it_cost(world):
    cli, api = world["cli"], world["api"]
    started = cli("workflow", "run", world["template"], "--input", "hi")
    assert started.returncode == 0, started.stderr
    trace_id = started.stdout.strip()
    wait_status(api, trace_id, "waiting_budget")

    shown = cli("workflow", "show", trace_id)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"run {trace_id}: waiting_budget · cost $0.01 · budget $0.125"
    assert "s0 · succeeded · $0.01" in lines and "s2 · pending" in lines

    refused = cli("workflow", "budget", trace_id, "--add", "-1")
    assert refused.returncode != 0 and "add_usd" in refused.stderr, refused.stderr
    raised = cli("workflow", "budget", trace_id, "--add", "1")
    assert raised.returncode == 0, raised.stderr
    assert raised.stderr.strip() == f"✓ run {trace_id}: budget now $1.125 (spent $0.01); it is queued again"

    run = wait_status(api, trace_id, "succeeded")
    assert run["cost_usd"] == "0.03" and [s["cost_usd"] for s in run["steps"]] == ["0.01"] * 3
    assert len([r for r in world["llm"].chat_requests if r["messages"][0]["content"] == "Say hi fake:cached=2"]) == 3
    shown = cli("workflow", "show", trace_id)
    assert shown.stdout.splitlines()[0] == f"run {trace_id}: succeeded · cost $0.03 · budget $1.125"

    # the live view, replayed: the pause with the command that goes on, each step's cost
    watched = cli("workflow", "watch", trace_id)
    assert watched.returncode == 0, watched.stderr
    lines = watched.stdout.splitlines()
    # what the next call may cost ($0.12) and the least top-up that pays for it
    assert (f"budget exhausted ($0.01 of $0.125; the next call may cost up to $0.12): the run "
            f"waits; raise it with orchestra workflow budget {trace_id} --add 0.01") in lines
    assert sum(1 for line in lines if line.startswith("[s") and " finished in " in line
               and line.endswith(" · $0.01")) == 3, lines

    again = cli("workflow", "budget", trace_id, "--add", "1")
    assert again.returncode == ExitCode.CONFLICT, (again.returncode, again.stderr)
    assert "not waiting for budget" in again.stderr


def paid_run(world) -> str:
    """A run of the world's template that pauses for its budget, topped up to succeed."""
    cli, api = world["cli"], world["api"]
    started = cli("workflow", "run", world["template"], "--input", "hi", "--json")
    assert started.returncode == 0, started.stderr
    # a run's own budget_usd is not a CLI option: this one pauses like the first; top it up
    trace_id = json.loads(started.stdout)["trace_id"]
    wait_status(api, trace_id, "waiting_budget")
    assert cli("workflow", "budget", trace_id, "--add", "5").returncode == 0
    wait_status(api, trace_id, "succeeded")
    return trace_id


def test_usage_groups_what_runs_cost_as_the_api_does(world):
    cli, api = world["cli"], world["api"]
    paid_run(world)

    expected = api.get("/usage", params={"group_by": "model"}).json()["rows"]
    assert len(expected) == 1 and expected[0]["key"] == "fake-model" and expected[0]["calls"] >= 3
    listed = cli("usage", "--by", "model", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == expected
    runs = sum(1 for r in api.get("/workflow/run").json()["runs"] if r["cost_usd"] is not None)
    assert expected[0]["runs"] == runs
    total = sum(Decimal(r["cost_usd"]) for r in api.get("/workflow/run").json()["runs"] if r["cost_usd"])
    assert Decimal(expected[0]["cost_usd"]) == total

    table = cli("usage", "--by", "model")
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if "fake-model" in line)
    cells = [c.strip() for c in row.strip("│┃| ").replace("┃", "│").split("│")]
    assert cells == ["fake-model", str(runs), str(expected[0]["calls"]), str(expected[0]["input_tokens"]),
                     str(expected[0]["output_tokens"]), expected[0]["cost_usd"]]

    today = dt.datetime.now(dt.UTC).date().isoformat()
    by_day = json.loads(cli("usage", "--by", "day", "--from", today, "--to", today, "--json").stdout)
    assert [r["key"] for r in by_day] == [today] and by_day[0]["cost_usd"] == expected[0]["cost_usd"]
    assert json.loads(cli("usage", "--to", "2000-01-01", "--json").stdout) == []

    bad = cli("usage", "--by", "planet")
    assert bad.returncode == ExitCode.USAGE and "group_by" in bad.stderr, (bad.returncode, bad.stderr)
    bad = cli("usage", "--from", "yesterday")
    assert bad.returncode == ExitCode.USAGE and "from" in bad.stderr, (bad.returncode, bad.stderr)


def test_usage_of_one_workspace_is_what_the_api_gives_for_it(world):
    """`usage --workspace` (by name or id) asks `GET /usage?workspace_id=`: the personal
    workspace holds every run so far, a new team workspace none; an unknown one is exit 3."""
    cli, api = world["cli"], world["api"]
    paid_run(world)  # whichever of this module's tests ran before, there is usage to group
    made = api.post("/workspace", json={"name": "usage-team"})
    assert made.status_code == 201, made.text
    [personal] = [w["workspace_id"] for w in api.get("/workspace").json()["workspaces"] if w["personal"]]
    everything = api.get("/usage", params={"group_by": "model"}).json()["rows"]
    assert everything and everything[0]["calls"] >= 3
    mine = json.loads(cli("usage", "--by", "model", "--workspace", personal, "--json").stdout)
    assert mine == api.get("/usage", params={"group_by": "model", "workspace_id": personal}).json()["rows"]
    assert mine == everything
    assert json.loads(cli("usage", "--by", "model", "--workspace", "usage-team", "--json").stdout) == []
    assert json.loads(cli("--workspace", "usage-team", "usage", "--json").stdout) == []
    unknown = cli("usage", "--workspace", "no-such-team")
    assert unknown.returncode == ExitCode.NOT_FOUND, (unknown.returncode, unknown.stderr)
    assert "no workspace of yours" in unknown.stderr

"""Engine part: what each model call costs, and a run's budget (SPEC §12).

Before a model call of a run with a budget, the owner *reserves* the call's worst case
in the store, under its fence, in one conditional statement (`spent + reservation <=
budget`, on the run's row): an upper bound of the prompt's tokens (its UTF-8 bytes plus
a per-message overhead: no tokenizer makes more tokens than bytes) at the input price,
plus `max_tokens` at the output price. A call whose reservation does not fit is not
made. After the call, the reservation becomes the call's actual cost; that change is
kept in the run store and stored with the run's next fenced write (by its fence
statement: the step's end, or the next reservation), so a call costs one extra store
transaction at most. A call whose outcome is lost (a crash, a cancel mid-stream) keeps
its whole reservation as spent.

(Carrying the reservation in the step's start write instead was tried: it saved that
transaction in one process, but the run then waits for its writer before each call, its
writes stop piling up into groups, and the peer benchmark committed more transactions
per step, 3.2 against 2.3.)

A run of a workspace with a monthly budget (SPEC §16) reserves under the workspace's
month as well, one more level above its chain (store/workspace_month.py), in the same
one transaction; whether the workspace has a cap is known in the process without a
store round (a workspace without one costs its calls nothing more).

The ledger (`workflow_run.spent_pusd`) is in whole pico-dollars, rounded up; each
step instance keeps its exact cost (`run_step.cost_usd`, decimal text). Runs without a
budget add their calls' costs to the ledger the same way, without reserving.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from orchestra.engine.live import LiveRun, StepFailure
from orchestra.engine.provider_gate import ProviderGate
from orchestra.engine.records import Records
from orchestra.engine.sizes import utf8_size
from orchestra.engine.store import RunStore
from orchestra.engine.store.workspace_month import MonthKey, month_of
from orchestra.money.amounts import from_pico, to_pico, usd_text
from orchestra.money.prices import Price, find_price
from orchestra.observability import metrics

BASE_TOKENS = 64  # a request's own framing (roles, the chat template's markers)
PER_MESSAGE_TOKENS = 16  # each message's framing
SCHEMA_MARGIN_BYTES = 1024  # the words a client wraps an output schema in


class BudgetStop(Exception):
    """A call's reservation does not fit in a budget of the run's chain (its own, or an
    ancestor's: `trace_id`) or its workspace's month (`workspace_id`, `month`), and no
    call of the run is in flight to give room back: the run stops (`fail`) or waits for
    a top-up (`pause`), as that budget's run (or workspace) says. `next_call`: the worst
    case of the call that did not fit (None: not known here)."""

    def __init__(self, budget: Decimal | None, spent: Decimal | None, *, trace_id: str | None,
                 on_budget: str, next_call: Decimal | None = None, workspace_id: str | None = None,
                 workspace_name: str = "", month: str | None = None) -> None:
        super().__init__("budget exhausted")
        self.budget, self.spent, self.next_call = budget, spent, next_call
        self.trace_id, self.on_budget = trace_id, on_budget
        self.workspace_id, self.workspace_name, self.month = workspace_id, workspace_name, month

    def again(self) -> BudgetStop:
        """The same stop, for another call of the run that asks after it was decided."""
        return BudgetStop(self.budget, self.spent, trace_id=self.trace_id, on_budget=self.on_budget,
                          next_call=self.next_call, workspace_id=self.workspace_id,
                          workspace_name=self.workspace_name, month=self.month)

    def data(self) -> dict[str, Any]:
        """`budget_exceeded` / `budget_exhausted` data: the budget, what is spent, whose
        (a workspace's month: `workspace_id`, `month`, and no `budget_trace_id`), and the
        next call's worst case."""
        data = {"budget_usd": usd_text(self.budget), "spent_usd": usd_text(self.spent),
                "budget_trace_id": self.trace_id, "next_call_usd": usd_text(self.next_call)}
        if self.workspace_id is not None:
            data |= {"budget_trace_id": None, "workspace_id": self.workspace_id, "month": self.month}
        return data

    def whose(self, trace_id: str) -> str:
        """Whose budget it is, as the run's error names it (the run is `trace_id`)."""
        if self.workspace_id is not None:
            name = f"workspace '{self.workspace_name}'" if self.workspace_name else "its workspace"
            return f"The monthly budget of {name} for {self.month}"
        if self.trace_id == trace_id:
            return "The run's budget"
        return f"The budget of run {self.trace_id} above it"

    def message(self, whose: str) -> str:
        """What the run's error says: the budget, what is left, what the next call may cost."""
        if self.budget is None or self.spent is None:
            return f"{whose} cannot pay for its next model call."
        left = max(self.budget - self.spent, Decimal(0))
        text = f"{whose} of ${usd_text(self.budget)} cannot pay for its next model call: ${usd_text(left)} left"
        if self.next_call is None:
            return text + "."
        return (text + f"; the next call may cost up to ${usd_text(self.next_call)} (its prompt's "
                "bound and ORCHESTRA_LLM_MAX_TOKENS answer tokens, at its prices).")


@dataclass
class Reservation:
    """One call's price and what was reserved for it (0 without a budget)."""

    price: Price | None
    pico: int
    when: dt.datetime
    month: MonthKey | None = None  # the workspace's month it was reserved under


@dataclass
class StepSpend:
    """What one step instance's calls cost so far (its failed attempts included)."""

    provider_id: str | None = None
    provider_name: str = ""
    model: str | None = None
    calls: int = 0
    cost: Decimal | None = None

    def fields(self) -> dict[str, Any]:
        return {"cost_usd": usd_text(self.cost), "provider_id": self.provider_id,
                "model": self.model, "calls": self.calls}


def prompt_upper_bound(messages: list, tools: list, output_schema: Any) -> int:
    """At least as many tokens as the request's prompt can be, whatever the tokenizer."""
    size = BASE_TOKENS
    for message in messages:
        size += PER_MESSAGE_TOKENS + utf8_size(message.content or "") + utf8_size(message.name or "")
        for call in message.tool_calls:
            size += PER_MESSAGE_TOKENS + utf8_size(call.name) + utf8_size(
                json.dumps(call.arguments, ensure_ascii=False))
    for tool in tools:
        size += PER_MESSAGE_TOKENS + utf8_size(json.dumps(
            {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
            ensure_ascii=False))
    if output_schema is not None:
        size += SCHEMA_MARGIN_BYTES + utf8_size(json.dumps(output_schema, ensure_ascii=False))
    return size


class Spending:
    """Reserve before a model call, settle after it, each instance's cost: for AgentSteps
    (the one place a model is called) and Calls (which store an instance's end)."""

    def __init__(self, *, store: RunStore, records: Records, gate: ProviderGate,
                 max_tokens: int) -> None:
        self.store = store
        self.records = records
        self.gate = gate
        self.max_tokens = max_tokens

    @staticmethod
    def _spend_of(live: LiveRun, path: str) -> StepSpend:
        return live.spends.setdefault(path, StepSpend())

    async def wait_for_room(self, live: LiveRun, config: Any, messages: list, tools: list,
                            output_schema: Any, *, requested_at: float | None = None) -> Any:
        """Wait until the provider's limits let this call through (engine/provider_gate.py);
        its pass, or None for a provider without limits. `requested_at`: when the call
        first asked (tried again after a 429, it keeps its place)."""
        if not config.provider_limits:
            return None
        bound = prompt_upper_bound(messages, tools, output_schema)
        estimate = self.gate.estimate(config.provider_id, bound // 4 + 16)
        began = time.monotonic()
        ticket = await self.gate.enter(config.provider_id, config.provider_limits, live.trace_id, estimate,
                                       requested_at=requested_at)
        metrics.provider_wait(config.provider_name or "", time.monotonic() - began)
        return ticket

    async def reserve(self, live: LiveRun, path: str, config: Any, messages: list, tools: list,
                      output_schema: Any) -> Reservation:
        """Price the call and, under a budget, reserve its worst case (StepFailure when its
        model has no known price). A reservation that does not fit while other calls of
        the run are in flight here (or a write carries a settled change) waits for them,
        holding no store connection: they give back what they did not use. BudgetStop
        only when it does not fit with nothing in flight (SPEC §15b); from then on no
        other call of the run reserves."""
        when = dt.datetime.now(dt.UTC)
        bound = prompt_upper_bound(messages, tools, output_schema)
        price = find_price(kind=config.provider_kind, model=config.model,
                           base_url=config.provider_base_url, prices=config.provider_prices,
                           when=when, prompt_tokens=bound)
        spend = self._spend_of(live, path)
        spend.provider_id, spend.model = config.provider_id, config.model
        spend.provider_name = config.provider_name or ""
        budgeted = await self._budgeted(live)  # a child's chain is read here (its costs roll up)
        month = await self._month(live, when)
        if month is None and not budgeted:
            return Reservation(price, 0, when)
        if price is None:
            whose = "The run" if budgeted else "The run's workspace"
            raise StepFailure(
                f"{whose} has a budget, and the model '{config.model}' of provider "
                f"'{config.provider_name}' has no known price: set the provider's prices "
                f"(PUT /api/v1/provider/{config.provider_id} with prices).")
        pico = to_pico(price.cost(bound, self.max_tokens))
        ledger = self.store.ledger
        while True:
            await self.store.release()  # nothing held while waiting for the run's turn
            async with live.reserving:  # one decision at a time: none sees another's half
                if live.budget_stop is not None:
                    raise live.budget_stop.again()
                change = ledger.changed(live.trace_id)  # a call settles, a write lands
                if await ledger.reserve(live.trace_id, pico, month):
                    live.reserved_calls += 1
                    break
                if change.done():  # something settled meanwhile: look again at once
                    continue
                if not live.reserved_calls and not ledger.in_transit(live.trace_id):
                    live.budget_stop = await self._stop(live, pico, month)
                    ledger.wake(live.trace_id)  # the run's other waiting calls stop too
                    raise live.budget_stop.again()
            await self.store.release()  # no pooled connection held through the wait
            await change
        await self.store.release()  # no connection held through the call
        return Reservation(price, pico, when, month)

    async def _stop(self, live: LiveRun, pico: int, month: MonthKey | None) -> BudgetStop:
        """The budget the reservation `pico` does not fit under, with nothing in flight
        that could give room back: the run's stop."""
        short = await self.store.ledger.shortfall(live.trace_id, pico, month)
        if short.workspace is not None:  # the workspace's month: its `on_budget` decides
            return BudgetStop(from_pico(short.budget_pusd), from_pico(short.spent_pusd), trace_id=None,
                              on_budget=short.workspace.on_budget, next_call=from_pico(pico),
                              workspace_id=short.workspace.workspace_id, workspace_name=short.workspace.name,
                              month=short.month)
        on_budget = live.options.on_budget if short.trace_id == live.trace_id else next(
            (a.on_budget for a in live.ancestors or () if a.trace_id == short.trace_id), "fail")
        return BudgetStop(from_pico(short.budget_pusd), from_pico(short.spent_pusd),
                          trace_id=short.trace_id, on_budget=on_budget, next_call=from_pico(pico))

    async def _month(self, live: LiveRun, when: dt.datetime) -> MonthKey | None:
        """The workspace's month the call reserves under: its workspace has a monthly
        budget (known in the process, store/workspace_month.py), else None."""
        if not live.workspace_id:
            return None
        cap = await self.store.ledger.months.cap(live.workspace_id)
        await self.store.release()
        return None if cap.budget_pusd is None else (live.workspace_id, month_of(when))

    async def _budgeted(self, live: LiveRun) -> bool:
        """Whether the run's calls reserve: it has a budget, or a run above it has one
        (a child's calls count against its ancestors' budgets, SPEC §14). The chain is
        read at the run's first call here, and its changes roll up from then on."""
        if live.ancestors is None:
            live.ancestors = (await self.store.ledger.ancestors(live.trace_id, live.parent_trace_id)
                              if live.parent_trace_id else [])
            await self.store.release()
        return live.budget_pusd is not None or any(a.budget_pusd is not None for a in live.ancestors)

    def settle(self, live: LiveRun, path: str, reservation: Reservation, usage: Any, *,
               billed: bool) -> None:
        """The call is over: its actual cost replaces its reservation (stored with the
        run's next write). `billed` False: the provider refused it before any work (an
        HTTP error), so it costs nothing; a lost outcome keeps its whole reservation."""
        spend = self._spend_of(live, path)
        spend.calls += 1
        if reservation.pico:  # a reservation less: calls waiting for room look again
            live.reserved_calls -= 1
            self.store.ledger.wake(live.trace_id)
        if usage is None:
            if not billed:
                self.store.ledger.spend(live.trace_id, -reservation.pico, reservation.month)
            return
        if reservation.price is None:
            return
        cost = reservation.price.cost(usage.prompt_tokens, usage.completion_tokens,
                                      usage.cached_tokens)
        spend.cost = cost if spend.cost is None else spend.cost + cost
        self.store.ledger.spend(live.trace_id, to_pico(cost) - reservation.pico, reservation.month)
        metrics.llm_cost(spend.provider_name, spend.model or "", cost)

    @staticmethod
    def child_ended(live: LiveRun, path: str, spent_pusd: int | None) -> None:
        """A workflow step's child run ended: what its tree cost is the step instance's
        cost (its attempts' children summed); the run's ledger has it already (rolled up,
        store/ledger.py), and the instance makes no model call of its own."""
        if spent_pusd is None:
            return
        spend = live.spends.setdefault(path, StepSpend())
        spend.cost = from_pico(spent_pusd) + (spend.cost or Decimal(0))

    @staticmethod
    def unfinished(live: LiveRun) -> dict[str, dict[str, Any]]:
        """The cost fields of instances the run leaves unfinished (a pause, an unhappy
        end), by path: what their calls cost so far is stored on their rows, so a run's
        cost stays its steps' sum (SPEC §15b). A resumed instance goes on from it."""
        return {path: spend.fields() for path, spend in live.spends.items()
                if spend.calls or spend.cost is not None}

    @staticmethod
    def resumed(live: LiveRun, path: str, row: Any) -> None:
        """An unfinished instance's stored cost, for its calls to add to (a resumed run)."""
        if row.calls or row.cost_usd is not None:
            live.spends[path] = StepSpend(provider_id=row.provider_id, model=row.model, calls=row.calls or 0,
                                          cost=None if row.cost_usd is None else Decimal(row.cost_usd))

    @staticmethod
    def fields(live: LiveRun, path: str) -> dict[str, Any]:
        """A finished instance's cost fields (its calls' costs, kept until now)."""
        spend = live.spends.pop(path, None)
        return spend.fields() if spend is not None and (spend.calls or spend.cost is not None) else {}

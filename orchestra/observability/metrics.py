"""Prometheus metrics (SPEC §10) and the small functions the rest of the code calls.

One process: the metrics live in prometheus-client's default registry and `/metrics`
shows them. Several worker processes sharing a port (`orchestra serve --workers N`):
a scrape reaches any one of them, so `serve` points every worker at one directory
(`PROMETHEUS_MULTIPROC_DIR`, prometheus-client's multiprocess mode) before they start,
and whichever worker answers sums the counters and histograms of all of them; gauges
are summed over live workers. Separate `orchestra serve` processes (other hosts, other
ports) each answer for themselves: scrape every one.

`orchestra_runs_queued` and `orchestra_runs_queued_oldest_seconds` describe the store,
not a process: they are read from it at scrape time (every process reports the same
value; aggregate them with `max`, not `sum`).

Every function here is cheap and never raises: instrumentation must not break the code
it watches. Labels are bounded: a route is its template, a provider is its kind.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"

disable_created_metrics()  # the `_created` series double every counter and help no alert

HTTP_REQUESTS = Counter(
    "orchestra_http_requests", "HTTP requests answered, by method, route template and status.",
    ["method", "route", "status"],
)
HTTP_DURATION = Histogram(
    "orchestra_http_request_duration_seconds",
    "Seconds from a request's arrival until its response head is sent (a stream: its start).",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RUNS_STARTED = Counter("orchestra_runs_started", "Runs that started (a resumed run is not counted again).")
RUNS_RESUMED = Counter("orchestra_runs_resumed", "Runs taken over or restarted from their stored steps.")
RUNS_ENDED = Counter("orchestra_runs_ended", "Runs that ended, by final status.", ["status"])
RUNS_IN_FLIGHT = Gauge(
    "orchestra_runs_in_flight", "Runs executing in this process (all processes: their sum).",
    multiprocess_mode="livesum",
)
STEPS = Counter("orchestra_steps", "Steps that ended, by status.", ["status"])
LLM_CALLS = Counter(
    "orchestra_llm_calls", "Streamed calls to a model provider, by provider kind and outcome "
    "(`ok`, `error`, `cancelled`); each retry is a call.", ["provider", "outcome"],
)
LLM_DURATION = Histogram(
    "orchestra_llm_call_duration_seconds", "Seconds of one streamed model call, to its last byte.",
    ["provider"], buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300),
)
LLM_TOKENS = Counter(
    "orchestra_llm_tokens", "Tokens the providers reported, by provider kind and `prompt`/`completion`.",
    ["provider", "kind"],
)
LLM_COST = Counter(
    "orchestra_llm_cost_usd", "USD the priced model calls cost, by provider name and model.",
    ["provider", "model"],
)
BUDGET_EXHAUSTED = Counter(
    "orchestra_budget_exhausted", "Runs stopped by their budget (failed, or waiting for a top-up).",
)
PROVIDER_WAIT = Histogram(
    "orchestra_provider_wait_seconds", "Seconds a model call waited for room under its provider's "
    "limits (requests/tokens per minute, concurrency), by provider name.", ["provider"],
    buckets=(0.005, 0.05, 0.25, 1, 2.5, 5, 10, 30, 60, 120),
)
PROVIDER_RATE_LIMITED = Counter(
    "orchestra_provider_rate_limited", "429 answers of a provider, waited out (Retry-After or "
    "backoff) and tried again without using a step's retry, by provider name.", ["provider"],
)
TOOL_CALLS = Counter(
    "orchestra_tool_calls", "Tool calls, by tool and outcome (`ok`, `error`).", ["tool", "outcome"],
)
SSE_SUBSCRIBERS = Gauge(
    "orchestra_sse_subscribers", "Open event streams (GET /workflow/sse/…).", multiprocess_mode="livesum",
)
LEASE_RENEWALS = Counter(
    "orchestra_lease_renewals", "Run lease renewals, by outcome: `renewed` (per run), `lost` "
    "(another process holds the run now), `failed` (the store did not answer).", ["outcome"],
)
STORE_UNAVAILABLE = Counter(
    "orchestra_store_unavailable_seconds", "Seconds this process found the store unavailable.",
)
STORE_DOWN = Gauge(
    "orchestra_store_down", "1 while this process finds the store unavailable.", multiprocess_mode="livemax",
)
HASH_QUEUE = Gauge(
    "orchestra_password_hash_queue", "Password hashes running or waiting for a hashing thread.",
    multiprocess_mode="livesum",
)


def _safe(fn):
    """Instrumentation never breaks the caller."""

    def wrapper(*args, **kwargs):
        try:  # noqa: SIM105 - per request: a try costs nothing, contextlib.suppress() a call
            fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - a metric is never worth a failed request or run
            pass

    wrapper.__doc__, wrapper.__name__ = fn.__doc__, fn.__name__
    return wrapper


# -- the hooks ------------------------------------------------------------------------------
_http_children: dict[tuple[str, str, int], tuple] = {}  # labels -> (count, duration)


@_safe
def http_request(method: str, route: str, status: int, seconds: float) -> None:
    """One answered request. Label sets are few (method x route template x status), and
    `labels()` costs more than the update itself, so each set's children are kept."""
    children = _http_children.get((method, route, status))
    if children is None:
        children = _http_children[(method, route, status)] = (
            HTTP_REQUESTS.labels(method, route, str(status)), HTTP_DURATION.labels(method, route))
    children[0].inc()
    children[1].observe(seconds)


@_safe
def run_started(*, resumed: bool = False) -> None:
    """A run's task began executing here (`resumed`: it had run before, elsewhere or here)."""
    (RUNS_RESUMED if resumed else RUNS_STARTED).inc()


@_safe
def run_ended(status: str) -> None:
    """A run's terminal event was stored (succeeded, failed, cancelled, interrupted)."""
    RUNS_ENDED.labels(status).inc()


@_safe
def runs_in_flight(delta: int) -> None:
    RUNS_IN_FLIGHT.inc(delta)


@_safe
def step_ended(status: str) -> None:
    STEPS.labels(status).inc()


@_safe
def llm_call(provider: str, outcome: str, seconds: float) -> None:
    LLM_CALLS.labels(provider, outcome).inc()
    LLM_DURATION.labels(provider).observe(seconds)


@_safe
def llm_cost(provider: str, model: str, usd) -> None:
    """A priced model call's cost (SPEC §12), by provider name and model."""
    LLM_COST.labels(provider, model).inc(float(usd))


@_safe
def budget_exhausted() -> None:
    """A run's budget could not hold its next call (it failed, or waits for a top-up)."""
    BUDGET_EXHAUSTED.inc()


@_safe
def provider_wait(provider: str, seconds: float) -> None:
    """A call of a provider with limits got its room after `seconds` (SPEC §12)."""
    PROVIDER_WAIT.labels(provider).observe(seconds)


@_safe
def provider_rate_limited(provider: str) -> None:
    """A provider answered 429: the call waits and tries again."""
    PROVIDER_RATE_LIMITED.labels(provider).inc()


@_safe
def llm_tokens(provider: str, *, prompt: int, completion: int) -> None:
    if prompt:
        LLM_TOKENS.labels(provider, "prompt").inc(prompt)
    if completion:
        LLM_TOKENS.labels(provider, "completion").inc(completion)


@_safe
def tool_call(tool: str, outcome: str) -> None:
    TOOL_CALLS.labels(tool, outcome).inc()


@_safe
def sse_subscribers(delta: int) -> None:
    SSE_SUBSCRIBERS.inc(delta)


@_safe
def lease_renewals(outcome: str, count: int = 1) -> None:
    """`renewed` (count: runs renewed), `lost` (a run another process holds now), or
    `failed` (the renewal did not reach the store)."""
    if count:
        LEASE_RENEWALS.labels(outcome).inc(count)


@_safe
def password_hashes(delta: int) -> None:
    HASH_QUEUE.inc(delta)


class _Outage:
    """The store-outage clock: seconds are added while failures keep being reported, so
    the counter grows during an outage (each report adds the time since the last), not
    only once it is over."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: float | None = None  # when the outage was last accounted; None: store up

    def failed(self) -> None:
        now = time.monotonic()
        with self.lock:
            if self.last is None:
                STORE_DOWN.set(1)
            else:
                STORE_UNAVAILABLE.inc(now - self.last)
            self.last = now

    def ok(self) -> None:
        now = time.monotonic()
        with self.lock:
            if self.last is None:
                return
            STORE_UNAVAILABLE.inc(now - self.last)
            self.last = None
            STORE_DOWN.set(0)


_outage = _Outage()


@_safe
def store_unavailable() -> None:
    """Call on every failed attempt to reach the store (a retry loop calls it each time)."""
    _outage.failed()


@_safe
def store_available() -> None:
    """Call when the store answered again (cheap when it never went away)."""
    _outage.ok()


# -- exposition ---------------------------------------------------------------------------
class StoreGauges:
    """The store-wide gauges, read by the scrape that shows them."""

    def __init__(self, queued: int, oldest_seconds: float) -> None:
        self.queued, self.oldest_seconds = queued, oldest_seconds

    def collect(self) -> Iterable[GaugeMetricFamily]:
        yield GaugeMetricFamily("orchestra_runs_queued", "Runs waiting to be claimed (in the store).",
                                value=self.queued)
        yield GaugeMetricFamily(
            "orchestra_runs_queued_oldest_seconds",
            "Age of the oldest run waiting to be claimed (0: none waits).", value=self.oldest_seconds,
        )


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROCESS_ENV) or None


def exposition(store: StoreGauges | None) -> bytes:
    """The text a scrape gets: this process's metrics (or every worker's, in multiprocess
    mode), then the store-wide gauges."""
    if multiprocess_dir():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        text = generate_latest(registry)
    else:
        from prometheus_client import REGISTRY

        text = generate_latest(REGISTRY)
    if store is not None:
        extra = CollectorRegistry(auto_describe=False)
        extra.register(store)
        text += generate_latest(extra)
    return text


def process_exited(pid: int) -> None:
    """Multiprocess mode: drop a stopped worker's live gauges."""
    if multiprocess_dir():
        with contextlib.suppress(Exception):  # best effort at shutdown
            multiprocess.mark_process_dead(pid)

"""The one backoff of the internal retries (orchestra/backoff.py) and the retries that use it."""

from __future__ import annotations

import ast
import asyncio

import pytest

from orchestra.backoff import Backoff
from orchestra.db.outage import STORE_RETRY
from orchestra.engine.llm.retry import backoff_delay
from orchestra.engine.store.events import SEQ_RACE, SeqRetry
from orchestra.services.deliveries import retry_delay
from tests.test_architecture import PACKAGE, modules


def test_a_delay_doubles_to_its_cap_between_80_percent_and_all_of_it():
    schedule = Backoff(base=0.5, cap=8.0)
    assert [schedule.ceiling(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    for attempt in range(1, 12):
        delays = [schedule.delay(attempt) for _ in range(300)]
        ceiling = schedule.ceiling(attempt)
        assert all(0.8 * ceiling <= d <= ceiling for d in delays)
        assert max(delays) - min(delays) > ceiling / 20  # jittered, not one value
    assert schedule.ceiling(0) == 0.5  # an attempt before the first counts as the first


@pytest.mark.parametrize("attempt", [64, 65, 1_100, 10**6])
def test_a_retry_counted_far_past_the_cap_waits_the_cap(attempt):
    """2 ** 1100 does not fit a float: the old store backoff and the delivery schedule
    raised OverflowError after that many failures instead of waiting."""
    assert 4.0 <= STORE_RETRY.delay(attempt) <= 5.0
    assert 2880.0 <= retry_delay(attempt) <= 3600.0
    assert 6.4 <= backoff_delay(attempt, base_delay=0.5, max_delay=8.0) <= 8.0


def test_every_internal_retry_keeps_to_the_one_rule():
    """The store's retries, the seq race, webhook deliveries and provider calls: each is
    its schedule's ceiling with the one jitter (a delivery's first retry 4–5 s, never
    past 5 s as the old ±10 % did)."""
    for n in range(1, 40):
        store = min(5.0, 0.2 * 2 ** (n - 1))
        assert all(0.8 * store <= STORE_RETRY.delay(n) <= store for _ in range(50))
        first = min(3600.0, 5.0 * 2 ** (n - 1))
        assert all(0.8 * first <= retry_delay(n) <= first for _ in range(50))
        provider = min(8.0, 0.5 * 2 ** (n - 1))
        assert all(0.8 * provider <= backoff_delay(n, base_delay=0.5, max_delay=8.0) <= provider for _ in range(50))
    assert SEQ_RACE.ceiling(1) == 0.005 and SEQ_RACE.ceiling(20) == 0.2


async def test_a_lost_seq_race_waits_the_schedule_then_gives_up_past_the_deadline(monkeypatch, core):
    from orchestra.engine.store import events

    retry = SeqRetry(core.db)
    started = asyncio.get_running_loop().time()
    for _ in range(3):
        await retry.again("t")
    waited = asyncio.get_running_loop().time() - started
    assert 0.8 * 0.035 <= waited < 0.5  # 5 + 10 + 20 ms, less at most a fifth
    monkeypatch.setattr(events, "APPEND_DEADLINE_SECONDS", -1.0)
    with pytest.raises(events.StoreContention):
        await SeqRetry(core.db).again("t")


def test_random_numbers_are_drawn_only_for_the_known_reasons():
    """Jitter lives in backoff.py; beside it only the user's step retry policy
    (language/policies.py) and the provider gate's poll spreading draw random numbers.
    A seventh hand-written backoff would import `random` again."""
    drawing = set()
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) else [])
            if "random" in names:
                drawing.add(name)
    assert PACKAGE.name == "orchestra"
    assert drawing == {"orchestra.backoff", "orchestra.language.policies", "orchestra.engine.provider_gate"}

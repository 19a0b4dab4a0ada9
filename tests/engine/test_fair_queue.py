"""The provider limits' decision (money/fair_queue.py): what fits is granted, what does
not waits (and when room comes by the clock), and the order is fair between runs."""

from __future__ import annotations

from orchestra.money.fair_queue import WINDOW, Limits, Slot, decide

NOW = 1_000_000.0


def waiting(sid, run, tokens=10, at=0.0):
    return Slot(sid, run, tokens, "waiting", NOW - 1 + at, expires_at=NOW + 5)


def done(sid, run, tokens=10, ago=1.0):
    return Slot(sid, run, tokens, "done", NOW - ago - 1, granted_at=NOW - ago, expires_at=NOW + 100)


def test_requests_per_minute_grants_up_to_the_limit_then_says_when():
    slots = [done("d1", "r", ago=50), waiting("a", "r", at=0.1), waiting("b", "r", at=0.2)]
    granted, wake = decide(slots, Limits(requests_per_minute=2), NOW)
    assert [s.id for s in granted] == ["a"]
    assert wake == NOW - 50 + WINDOW  # when d1 leaves the window


def test_tokens_per_minute_counts_the_window_and_lets_a_first_large_call_through():
    slots = [done("d1", "r", tokens=80, ago=10), waiting("a", "r", tokens=30)]
    granted, wake = decide(slots, Limits(tokens_per_minute=100), NOW)
    assert granted == [] and wake == NOW - 10 + WINDOW
    old = [Slot("d0", "r", 80, "done", NOW - 70, granted_at=NOW - 61, expires_at=0), waiting("a", "r", tokens=300)]
    granted, _ = decide(old, Limits(tokens_per_minute=100), NOW)  # an empty window: it goes
    assert [s.id for s in granted] == ["a"]


def test_max_concurrency_counts_calls_in_flight_until_their_lease_ends():
    held = Slot("h", "r", 10, "held", NOW - 3, granted_at=NOW - 2, expires_at=NOW + 30)
    granted, wake = decide([held, waiting("a", "r")], Limits(max_concurrency=1), NOW)
    assert granted == [] and wake is None  # only a call ending makes room
    dead = Slot("h", "r", 10, "held", NOW - 3, granted_at=NOW - 2, expires_at=NOW - 1)
    granted, _ = decide([dead, waiting("a", "r")], Limits(max_concurrency=1), NOW)
    assert [s.id for s in granted] == ["a"]  # a dead process's lease ran out


def test_a_busy_run_cannot_starve_another():
    busy = [done(f"d{i}", "busy", ago=i + 1) for i in range(5)]
    queue = [waiting(f"b{i}", "busy", at=i * 0.01) for i in range(10)] + [waiting("q", "quiet", at=0.5)]
    granted, _ = decide(busy + queue, Limits(requests_per_minute=7), NOW)
    assert granted[0].id == "q"  # it arrived last, but its run had no call in the window
    assert [s.id for s in granted] == ["q", "b0"]

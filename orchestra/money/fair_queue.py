"""Which waiting model calls a provider's limits let through now (SPEC §12).

A pure decision over a provider's *slots*: calls granted in the last minute (their
tokens: an estimate while in flight, the reported usage once done), calls in flight,
and calls waiting. Waiting calls are served in a fair order — first the calls of the
runs granted fewest calls in the window, then by arrival — and the first one that does
not fit stops the line, so one busy run (a 200-item foreach) cannot starve the others,
and no large call is passed over for ever by small ones. Used in process (SQLite) and,
under an advisory lock, by every process of a PostgreSQL store (engine/provider_gate.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

WINDOW = 60.0


@dataclass
class Slot:
    id: str
    run_id: str
    tokens: int
    state: str  # waiting | held | done
    requested_at: float
    granted_at: float | None = None
    expires_at: float = 0.0  # a waiting call's heartbeat, a held call's lease


@dataclass(frozen=True)
class Limits:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrency: int | None = None

    @classmethod
    def of(cls, stored: dict | None) -> Limits | None:
        if not stored:
            return None
        return cls(stored.get("requests_per_minute"), stored.get("tokens_per_minute"),
                   stored.get("max_concurrency"))


def decide(slots: list[Slot], limits: Limits, now: float) -> tuple[list[Slot], float | None]:
    """(the waiting slots to grant now, in order; when room may come next by the clock —
    None when only a call ending can make room)."""
    recent = [s for s in slots if s.granted_at is not None and s.granted_at > now - WINDOW]
    flying = sum(1 for s in slots if s.state == "held" and s.expires_at > now)
    requests, tokens = len(recent), sum(s.tokens for s in recent)
    per_run = Counter(s.run_id for s in recent)
    waiting = sorted((s for s in slots if s.state == "waiting"),
                     key=lambda s: (per_run[s.run_id], s.requested_at))
    granted: list[Slot] = []
    blocked_by_clock = False
    for slot in waiting:
        if limits.requests_per_minute and requests + 1 > limits.requests_per_minute:
            blocked_by_clock = True
            break
        if limits.tokens_per_minute and tokens and tokens + slot.tokens > limits.tokens_per_minute:
            blocked_by_clock = True
            break
        if limits.max_concurrency and flying + 1 > limits.max_concurrency:
            break
        granted.append(slot)
        requests, tokens, flying = requests + 1, tokens + slot.tokens, flying + 1
    wake = None
    if blocked_by_clock and recent:
        wake = min(s.granted_at for s in recent) + WINDOW
    return granted, wake

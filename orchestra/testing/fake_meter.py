"""The fake model's usage rules (SPEC §12): cached prompt tokens, `max_tokens`, and a
provider's tokens-per-minute limit answered with 429 and `Retry-After`.

`TokenMeter` counts the tokens of the last 60 seconds (a request's prompt when it is
admitted, its answer when it is sent); a request whose prompt does not fit under
`tokens_per_minute` is refused with the seconds until it would (whole seconds, at least
1, as real providers send them).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any

WINDOW = 60.0


class TokenMeter:
    def __init__(self, tokens_per_minute: int) -> None:
        self.limit = tokens_per_minute
        self._spent: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()
        self.refused = 0  # how many requests were answered 429
        self.admitted_tokens = 0  # every token counted, for benchmarks
        self.prompts: list[int] = []  # each admitted request's prompt tokens, in order (benchmarks)
        self.answers: list[int] = []  # each answer's tokens, in order

    def _trim(self, now: float) -> int:
        while self._spent and self._spent[0][0] <= now - WINDOW:
            self._spent.popleft()
        return sum(tokens for _, tokens in self._spent)

    def admit(self, tokens: int) -> float | None:
        """Count `tokens` now and answer None, or answer the seconds to wait (refused)."""
        with self._lock:
            now = time.monotonic()
            used = self._trim(now)
            if used + tokens <= self.limit:
                self._spent.append((now, tokens))
                self.admitted_tokens += tokens
                self.prompts.append(tokens)
                return None
            self.refused += 1
            freed, wait = used, 1.0
            for when, spent in self._spent:  # wait until enough has left the window
                freed -= spent
                wait = when + WINDOW - now
                if freed + tokens <= self.limit:
                    break
            return float(max(1, math.ceil(wait)))

    def add(self, tokens: int) -> None:
        """Count the tokens of an answer (they were produced, whatever the limit)."""
        if tokens > 0:
            with self._lock:
                self._spent.append((time.monotonic(), tokens))
                self.admitted_tokens += tokens
                self.answers.append(tokens)


def rate_limited_body(wait: float, limit: int) -> dict[str, Any]:
    return {"error": {"message": f"Rate limit reached for tokens per min (TPM): Limit {limit}. "
                                 f"Please try again in {wait:g}s.",
                      "type": "tokens", "code": "rate_limit_exceeded", "param": None}}


def max_tokens_of(body: dict[str, Any]) -> int | None:
    """The request's cap on answer tokens (`max_completion_tokens` or `max_tokens`)."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def usage_counts(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    """An OpenAI `usage` object; cached tokens are part of the prompt."""
    cached = max(0, min(cached, prompt))
    counts: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                              "total_tokens": prompt + completion}
    if cached:
        counts["prompt_tokens_details"] = {"cached_tokens": cached}
    return counts


def best_schedule(calls: list[tuple[int, int]], limit: int) -> list[float]:
    """When each call could start at the earliest, all asked at time 0, under this meter's
    own rule (a prompt is admitted while the last minute's tokens plus it fit; its answer
    counts as soon as it is admitted): the best any client could do, in seconds. Calls
    are (prompt tokens, answer tokens), served in order (they are alike in benchmarks;
    for alike calls no order does better)."""
    window: deque[tuple[float, int]] = deque()
    now, starts = 0.0, []
    for prompt, answer in calls:
        while True:
            while window and window[0][0] <= now - WINDOW:
                window.popleft()
            used = sum(tokens for _, tokens in window)
            if used + prompt <= limit:
                break
            if not window:
                raise ValueError(f"a prompt of {prompt} tokens is never admitted under {limit} a minute")
            now = window[0][0] + WINDOW  # the oldest entry leaves the minute
        window.append((now, prompt + answer))
        starts.append(now)
    return starts

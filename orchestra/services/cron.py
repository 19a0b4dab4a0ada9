"""Cron expressions and time zones of schedules (SPEC §11), through `cronsim`.

Why cronsim rather than croniter: croniter's maintainer declared it end-of-life (2024)
and its successor is still settling, while cronsim (Healthchecks.io's, in daily use on
millions of checks) is maintained, small, strict — it refuses at parse time a date that
can never come, such as `0 0 30 2 *` — and iterates in the given zone with the
daylight-saving rules of cronie: a local time skipped by a spring-forward fires at the
transition, one repeated by a fall-back fires once. We only count the fields (five;
cronsim also takes a leading sixth, seconds, which ORCHESTRA_CRON_SECONDS allows for
tests and demonstrations) and bound the work.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

CRON_MAX = 256  # characters of a cron expression
ZONE_MAX = 64  # characters of a zone name
NEXT_FIRES = 5
UTC = dt.UTC


class CronProblem(ValueError):
    """Why a cron expression or a zone is refused (a sentence for a 422's `problem`)."""


def zone(name: str) -> ZoneInfo:
    """The IANA zone `name` ("UTC", "America/New_York"); CronProblem when unknown."""
    if not isinstance(name, str) or not name or len(name) > ZONE_MAX or "\x00" in name \
            or name.startswith(("/", ".")) or ".." in name:
        raise CronProblem("is not a known IANA time zone (e.g. UTC, Europe/Paris)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise CronProblem(f"'{name}' is not a known IANA time zone (e.g. UTC, Europe/Paris)") from None


def check(expression: str, tz: ZoneInfo, *, seconds: bool = False) -> str:
    """The expression, normalized (single spaces), when it has five fields (or, with
    `seconds`, six: a leading seconds field), parses and fires at least once;
    CronProblem otherwise."""
    if not isinstance(expression, str) or len(expression) > CRON_MAX:
        raise CronProblem(f"must be a five-field cron expression of at most {CRON_MAX} characters")
    fields = expression.split()
    if len(fields) != 5 and not (seconds and len(fields) == 6):
        raise CronProblem(
            f"must have five fields (minute hour day-of-month month day-of-week), not {len(fields)}")
    normalized = " ".join(fields)
    try:
        upcoming = CronSim(normalized, dt.datetime.now(tz))
        next(upcoming)
    except CronSimError as exc:
        raise CronProblem(f"is not a valid cron expression: {exc}") from None
    except (StopIteration, ValueError, OverflowError):
        raise CronProblem("never fires (no date matches it)") from None
    return normalized


def _after(expression: str, tz: ZoneInfo, moment: dt.datetime) -> Iterator[dt.datetime]:
    """Due times strictly after the aware `moment`, as aware times in `tz`."""
    return CronSim(expression, moment.astimezone(tz).replace(microsecond=0))


def next_fires(expression: str, tz: ZoneInfo, after: dt.datetime, count: int = NEXT_FIRES) -> list[dt.datetime]:
    """The next `count` due times after the aware `after`, in the schedule's zone."""
    found: list[dt.datetime] = []
    try:
        for due in _after(expression, tz, after):
            found.append(due)
            if len(found) >= count:
                break
    except (CronSimError, StopIteration, ValueError, OverflowError):
        pass
    return found


def first_after(expression: str, tz: ZoneInfo, after: dt.datetime) -> dt.datetime | None:
    """The first due time strictly after the aware `after` (None: never again)."""
    fires = next_fires(expression, tz, after, 1)
    return fires[0] if fires else None


def due_between(expression: str, tz: ZoneInfo, first: dt.datetime, now: dt.datetime,
                most: int) -> tuple[list[dt.datetime], dt.datetime | None]:
    """Due times `first <= t <= now` (aware; at most the last `most` of them), and the
    first due time after `now`. `first` is itself a due time (a schedule's next_due_at)."""
    due: list[dt.datetime] = []
    following: dt.datetime | None = None
    try:
        for moment in _after(expression, tz, first - dt.timedelta(seconds=1)):
            if moment > now:
                following = moment
                break
            due.append(moment)
            if len(due) > most:
                del due[0]
    except (CronSimError, StopIteration, ValueError, OverflowError):
        pass
    return due, following


def to_naive_utc(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(UTC).replace(tzinfo=None)


def from_naive_utc(moment: dt.datetime, tz: ZoneInfo) -> dt.datetime:
    return moment.replace(tzinfo=UTC).astimezone(tz)


def iso_in(moment: dt.datetime | None, tz: ZoneInfo) -> str | None:
    """A stored (naive UTC) time as ISO 8601 with the offset of `tz` at that instant."""
    if moment is None:
        return None
    return from_naive_utc(moment, tz).isoformat()

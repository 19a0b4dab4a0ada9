"""Cron expressions and zones of schedules (services/cron.py, over cronsim)."""

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from orchestra.services import cron

NY = ZoneInfo("America/New_York")


def test_next_fires_change_offset_at_spring_forward():
    # 2026-03-08 02:00 EST becomes 03:00 EDT in New York.
    after = dt.datetime(2026, 3, 6, 12, 0, tzinfo=dt.UTC)
    fires = cron.next_fires("0 9 * * *", NY, after)
    assert [f.isoformat() for f in fires] == [
        "2026-03-06T09:00:00-05:00", "2026-03-07T09:00:00-05:00", "2026-03-08T09:00:00-04:00",
        "2026-03-09T09:00:00-04:00", "2026-03-10T09:00:00-04:00",
    ]


def test_a_skipped_local_time_fires_at_the_transition_and_a_repeated_one_once():
    spring = cron.next_fires("30 2 * * *", NY, dt.datetime(2026, 3, 7, 12, 0, tzinfo=dt.UTC), 2)
    assert [f.isoformat() for f in spring] == ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"]
    # 2026-11-01 01:30 happens twice in New York: it fires once.
    fall = cron.next_fires("30 1 * * *", NY, dt.datetime(2026, 10, 31, 12, 0, tzinfo=dt.UTC), 3)
    assert [f.isoformat() for f in fall] == [
        "2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00", "2026-11-03T01:30:00-05:00"]
    utc = [cron.to_naive_utc(f) for f in fall]
    assert utc[1] - utc[0] == dt.timedelta(hours=25)


@pytest.mark.parametrize("expression, problem", [
    ("0 0 30 2 *", "not a valid cron"),
    ("0 0 31 4 *", "not a valid cron"),
    ("0 0 * * * *", "five fields"),
    ("@daily", "five fields"),
    ("61 * * * *", "not a valid cron"),
    ("* * *", "five fields"),
    ("x" * 300, "at most"),
])
def test_refused_expressions(expression, problem):
    with pytest.raises(cron.CronProblem, match=problem):
        cron.check(expression, cron.zone("UTC"))


def test_normalized_and_unknown_zones():
    assert cron.check("  */5   *  * * 1-5 ", cron.zone("UTC")) == "*/5 * * * 1-5"
    for name in ("Mars/Olympus", "", "../../etc/passwd", "/etc/localtime", "UTC\x00"):
        with pytest.raises(cron.CronProblem):
            cron.zone(name)


def test_due_between_lists_the_due_times_and_the_next():
    tz = cron.zone("UTC")
    first = dt.datetime(2026, 1, 1, 10, 0, tzinfo=dt.UTC)
    now = dt.datetime(2026, 1, 1, 10, 3, 30, tzinfo=dt.UTC)
    due, following = cron.due_between("* * * * *", tz, first, now, 100)
    assert [d.minute for d in due] == [0, 1, 2, 3] and following.minute == 4
    due, _ = cron.due_between("* * * * *", tz, first, now, 2)
    assert [d.minute for d in due] == [2, 3]


def test_a_seconds_field_only_where_the_setting_allows_it():
    tz = cron.zone("UTC")
    with pytest.raises(cron.CronProblem, match="five fields"):
        cron.check("*/20 * * * * *", tz)
    assert cron.check(" */20  * * * * * ", tz, seconds=True) == "*/20 * * * * *"
    assert cron.check("0 9 * * *", tz, seconds=True) == "0 9 * * *"  # five still mean minutes
    with pytest.raises(cron.CronProblem, match="five fields"):
        cron.check("0 * * * * * *", tz, seconds=True)
    first = dt.datetime(2026, 1, 1, 10, 0, 20, tzinfo=dt.UTC)
    due, following = cron.due_between("*/20 * * * * *", tz, first, first + dt.timedelta(seconds=45), 100)
    assert [d.second for d in due] == [20, 40, 0] and (following.minute, following.second) == (1, 20)

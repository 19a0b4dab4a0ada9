"""`fake_meter.best_schedule`: the earliest each call could start under the fake's own
tokens-per-minute rule — what the provider-limits benchmark measures its runs against."""

import pytest

from orchestra.testing.fake_meter import TokenMeter, best_schedule


def test_alike_calls_go_a_minute_apart_in_what_a_minute_admits():
    starts = best_schedule([(31, 32)] * 100, 2500)
    # 40 calls of 63 tokens fit a minute (the 40th prompt: 39 x 63 + 31 = 2488 <= 2500)
    assert starts[:40] == [0.0] * 40
    assert starts[40:80] == [60.0] * 40
    assert starts[80:] == [120.0] * 20


def test_the_meter_admits_no_more_than_the_schedule_lets_through():
    meter = TokenMeter(2500)
    admitted = 0
    while meter.admit(31) is None:  # all at one instant, answers counted at once
        meter.add(32)
        admitted += 1
    assert admitted == best_schedule([(31, 32)] * 100, 2500).count(0.0) == 40
    assert meter.prompts == [31] * 40 and meter.answers == [32] * 40 and meter.refused == 1


def test_a_large_answer_delays_the_next_call_and_an_oversized_prompt_never_goes():
    assert best_schedule([(10, 3000), (10, 10)], 2500) == [0.0, 60.0]
    with pytest.raises(ValueError, match="never admitted"):
        best_schedule([(3000, 10)], 2500)

"""A bisect with a time budget: once it is spent no new point is started, and the answer is what the points
judged so far decide (``steady.server.stats.bisect.bisect``'s ``out_of_time``). The clock is the test's."""

from __future__ import annotations

from steady.server.stats.bisect import BAD, GOOD, PointOutcome, bisect


class Clock:
    """Minutes that pass only when a point is judged: each judged set of points takes ``per_call``."""

    def __init__(self, per_call: float) -> None:
        self.now, self.per_call = 0.0, per_call
        self.started: list[tuple[int, ...]] = []

    def judge(self, change: int):
        def judge(points, share):
            self.started.append(tuple(points))
            self.now += self.per_call
            return [PointOutcome(p, BAD if p >= change else GOOD, 2) for p in points]
        return judge


def test_no_point_is_started_once_the_minutes_are_spent():
    clock = Clock(per_call=10.0)
    result = bisect(17, clock.judge(11), budget_runs=400, alpha_point=0.01, out_of_time=lambda: clock.now >= 25.0)
    # the ends (10 minutes), one round (20), a second round (30, started at 20 < 25), then no more
    assert clock.started == [(0, 16), (8,), (12,)]
    assert result.state == "undecided" and result.time_spent and not result.budget_spent
    assert (result.last_good, result.first_bad) == (8, 12)  # what the judged points decide: the change is 9..12
    assert result.runs == 8 and result.decided == 4


def test_without_a_time_limit_the_same_search_finds_the_change():
    clock = Clock(per_call=10.0)
    result = bisect(17, clock.judge(11), budget_runs=400, alpha_point=0.01, out_of_time=lambda: False)
    assert result.state == "found" and result.first_bad == 11 and not result.time_spent
    assert clock.now == 50.0 and len(clock.started) == 5  # the ends and 4 rounds: a 25-minute budget ran 3

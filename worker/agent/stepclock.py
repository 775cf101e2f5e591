"""Step times of a run that does not log them, from when its steps were reported.

The cost of determinism compares step times between levels. A built-in workload and a script that
calls the SDK log them (the SDK times its ``log`` calls); a command that only prints ``step N loss X``
lines or writes TensorBoard events does not. For those the agent dates each reported step — a step
line by its arrival on the run's stdout (:mod:`steady.worker.agent.tee`), a TensorBoard event by its
``wall_time`` — and the time between two reported steps, divided by the steps between them, is the
step time of each of those steps (a script that prints every 10th step gets the mean over its 10).

Each source's times go to their own series (``step_time:stdout``, ``step_time:tensorboard``), never
to ``step_time``: the report prefers the run's own times, says which source it used, and a run that
logs ``step_time`` itself never sees a captured value beside its own.
"""

from __future__ import annotations

__all__ = ["StepClock"]


class StepClock:
    """Turns (step, time) reports of one source into per-step times."""

    def __init__(self) -> None:
        self._last: tuple[int, float] | None = None
        self._timed = -1  # the highest step given a time: each step is timed once (a value per run, key and step)

    def observe(self, step: int, at: float) -> float | None:
        """The step time that the report of ``step`` at ``at`` (seconds) closes, or None.

        A step reported again (an evaluation line, a second TensorBoard tag) changes nothing; a step
        below the last one (a counter that starts over each epoch) restarts the clock, and times only
        steps above every step already timed, so no step gets two different times; a report that
        arrived at the same instant as the last timed one (two lines in one read of the pipe) waits
        for the next later report, which is then divided over all the steps in between."""
        last = self._last
        if last is None or step < last[0]:
            self._last = (step, at)
            return None
        if step == last[0] or not at > last[1]:
            return None
        self._last = (step, at)
        if step <= self._timed:
            return None
        self._timed = step
        return (at - last[1]) / (step - last[0])

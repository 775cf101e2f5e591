"""overlapped(): items drawn on the calling thread, consumed on another, errors and early stops handed back."""

from __future__ import annotations

import threading
import time

import pytest

from steady.server.kit.overlap import overlapped


def test_the_consumer_gets_every_item_in_order_on_its_own_thread():
    caller = threading.get_ident()
    drawn_on, consumed_on = set(), set()

    def items():
        for i in range(50):
            drawn_on.add(threading.get_ident())
            yield i

    def consume(it):
        consumed_on.add(threading.get_ident())
        return list(it)

    assert overlapped(items(), consume) == [list(range(50))]
    assert drawn_on == {caller} and consumed_on and caller not in consumed_on


def test_at_most_depth_items_wait_between_the_two():
    drawn, gate, seen, result = [], threading.Event(), [], []

    def items():
        for i in range(10):
            drawn.append(i)
            yield i

    def consume(it):
        gate.wait()  # nothing is taken until the producer has drawn all it can
        seen.append(len(drawn))
        return list(it)

    runner = threading.Thread(target=lambda: result.append(overlapped(items(), consume, depth=3)))
    runner.start()
    deadline = time.monotonic() + 60
    while len(drawn) < 4 and time.monotonic() < deadline:  # 3 queued, a 4th drawn and waiting for room
        threading.Event().wait(0.01)
    gate.set()
    runner.join()
    assert seen == [4]
    assert result == [[list(range(10))]]


def test_what_the_consumer_raises_is_raised_and_the_producer_stops():
    drawn = []

    def items():
        for i in range(1000):
            drawn.append(i)
            yield i

    def consume(it):
        for i in it:
            if i == 3:
                raise ValueError("bad block")
        return None

    with pytest.raises(ValueError, match="bad block"):
        overlapped(items(), consume, depth=2)
    assert len(drawn) < 1000  # it stopped at its next item once the consumer was done


def test_what_the_producer_raises_is_raised_first():
    def items():
        yield 1
        raise OSError("database went away")

    def consume(it):
        got = list(it)
        raise ValueError(f"short: {got}")  # a short stream is what the consumer sees

    with pytest.raises(OSError, match="went away"):
        overlapped(items(), consume)


def test_a_consumer_that_returns_early_leaves_no_one_waiting():
    assert overlapped(iter(range(100)), lambda it: next(it), depth=1) == [0]
    assert overlapped(iter(range(100)), lambda it: "nothing taken", depth=1, consumers=3) == ["nothing taken"] * 3


def test_several_consumers_share_the_items_each_once():
    got = overlapped(iter(range(500)), list, consumers=3)
    assert len(got) == 3 and sorted(i for share in got for i in share) == list(range(500))
    assert all(share == sorted(share) for share in got)  # each takes them in the order drawn


def test_one_consumer_failing_among_several_is_raised():
    def consume(it):
        for i in it:
            if i == 40:
                raise ValueError("bad block 40")
        return None

    with pytest.raises(ValueError, match="bad block 40"):
        overlapped(iter(range(1000)), consume, consumers=2)

"""How fast a task purges (sinks.throttle): the cap on deletions per second on a fake clock, and the
bounded number of purges in flight."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from purger.sinks.throttle import Pacer, bounded_map, per_task_rate


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds


def passes(pacer: Pacer, clock: FakeClock, n: int, work_s: float = 0.0) -> list[float]:
    times = []
    for _ in range(n):
        pacer.wait()
        times.append(clock.now)
        clock.now += work_s
    return times


@pytest.mark.parametrize("work_s", [0.0, 0.01, 0.3])
def test_no_more_than_the_rate_in_any_second(work_s):
    clock = FakeClock()
    times = passes(Pacer(10, clock, clock.sleep), clock, 100, work_s)
    for start in times:
        assert sum(start <= t < start + 1 - 1e-9 for t in times) <= 10  # (float sums of 0.1)
    if work_s < 0.1:
        assert times[-1] == pytest.approx(9.9)  # and no slower than the rate when work is quick


def test_a_pause_is_not_saved_up_for_a_burst():
    clock = FakeClock()
    pacer = Pacer(5, clock, clock.sleep)
    passes(pacer, clock, 5)
    clock.now += 60
    times = passes(pacer, clock, 10)
    assert times[-1] - times[0] == pytest.approx(9 / 5)


@pytest.mark.parametrize("partitions, cores, share", [(4, 2, 500), (1, 2, 1000), (2, 2, 500), (8, 4, 250)])
def test_the_cap_is_shared_by_the_tasks_that_run_at_once(partitions, cores, share):
    assert per_task_rate(1000, partitions, cores) == share


def test_bounded_map_keeps_order_and_at_most_in_flight_calls_pending():
    running, most, lock = 0, 0, threading.Lock()
    pulled = []

    def items():
        for i in range(40):
            pulled.append(i)
            yield i

    def work(i: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.005 * (i % 3))  # out-of-order completions
        with lock:
            running -= 1
        return i * 10

    with ThreadPoolExecutor(16) as pool:
        results = bounded_map(pool, work, items(), in_flight=4)
        assert next(results) == 0
        assert len(pulled) <= 5  # lazily: the first result needs at most in_flight + 1 items read
        assert [0, *results] == [i * 10 for i in range(40)]
    assert 1 < most <= 4


def test_bounded_map_raises_the_first_failure_in_order():
    def work(i: int) -> int:
        if i == 3:
            raise ValueError("three")
        return i

    with ThreadPoolExecutor(4) as pool:
        results = bounded_map(pool, work, range(10), in_flight=4)
        assert [next(results) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(ValueError, match="three"):
            next(results)

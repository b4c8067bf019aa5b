"""How fast a task purges: a cap on deletions per second that holds across partitions, and a bounded
number of purges in flight. Plain Python.

Each task of a batch paces its own deletions at ``cap / tasks_at_once``, where
``tasks_at_once`` is how many of the batch's tasks can run at the same time
(its partitions, at most the cores the executors have). So the cap holds
whichever tasks run together, with no coordination between executors.

Example::

    pacer = Pacer(per_second=250)
    for candidate in candidates:
        pacer.wait()       # returns at once until the task is ahead of 250 per second
        purge(candidate)
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Executor, Future
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def per_task_rate(cap_per_second: float, partitions: int, cores: int) -> float:
    """The rate each task may delete at so that all tasks together stay under the cap.

    >>> per_task_rate(1000, partitions=4, cores=2)
    500.0
    """
    return cap_per_second / max(1, min(partitions, cores))


class Pacer:
    """Lets the n-th item through no sooner than ``n / per_second`` after the first (``wait(count)``: so many
    at once)."""

    def __init__(self, per_second: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.interval_s = 1 / per_second
        self.clock = clock
        self.sleep = sleep
        self.next_at: float | None = None

    def wait(self, count: int = 1) -> None:
        now = self.clock()
        if self.next_at is None or self.next_at < now:
            # Idle time is not saved up: after a pause the task does not burst above the cap.
            self.next_at = now
        elif self.next_at > now:
            self.sleep(self.next_at - now)
        self.next_at += self.interval_s * count


def bounded_map(pool: Executor, function: Callable[[T], R], items: Iterable[T], in_flight: int) -> Iterator[R]:
    """``pool.map`` that reads ``items`` lazily, with at most ``in_flight`` calls pending, so a partition's
    candidates are not all pulled into memory (nor past the pacer) first. Results come in order.

    >>> from concurrent.futures import ThreadPoolExecutor
    >>> with ThreadPoolExecutor(4) as pool:
    ...     list(bounded_map(pool, lambda x: x * x, range(5), in_flight=2))
    [0, 1, 4, 9, 16]
    """
    pending: deque[Future[R]] = deque()
    for item in items:
        if len(pending) >= in_flight:
            yield pending.popleft().result()
        pending.append(pool.submit(function, item))
    while pending:
        yield pending.popleft().result()

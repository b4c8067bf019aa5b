"""A workload that plays the platform: messages through the scenarios of the mailbox rules (docs/reference.md, Rules), at a chosen rate and mix.

Each message follows one scenario: it expires by counter or by date, stays an
incomplete upload or is deleted, some of those are revived before their
deadline, and the rest stay live. A share of the messages shares the payload
of the one before, a share is stored inline, and a share of the messages have
their events held back and sent late, or sent twice. The demo and the
benchmarks (``bench/``) play it through ``simulation.mailbox.Platform``, which
writes the rows and blobs before it emits the events (or, for the benchmarks
of the stateful stage alone, only emits the events).

Example::

    workload = Workload(mix=LIVE_ONLY, seed=1)
    for plan in workload.plans("run1", 1_000):
        ...
    play_all(platform, workload.plans("run1", 1_000), rate=500)  # messages per second
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from itertools import count
from typing import Iterable, Iterator

from simulation.mailbox import INLINE_LIMIT, Platform

# scenario: (share of messages in the default mix, purged?)
SCENARIOS: dict[str, tuple[float, bool]] = {
    "expired by counter": (0.30, True),
    "counter revived": (0.10, False),
    "expired by date": (0.10, True),
    "date moved": (0.05, False),
    "incomplete upload": (0.10, True),
    "upload completed": (0.05, False),
    "deleted": (0.10, True),
    "live": (0.20, False),
}
DEFAULT_MIX = {name: share for name, (share, _) in SCENARIOS.items()}
LIVE_ONLY = {"live": 1.0}
EXPIRED_ONLY = {"expired by counter": 1.0}


def is_purged(scenario: str) -> bool:
    """Whether a message of this scenario is due for purging once its deadline passes."""
    return SCENARIOS[scenario][1]


@dataclass(frozen=True)
class MessagePlan:
    message: str
    payload: str
    scenario: str
    size: int
    shared: bool  # links to the payload of the message before
    late: bool  # its events are sent after the next messages'
    duplicated: bool  # its events are sent twice

    @property
    def stored(self) -> bool:
        """Its payload is a blob in the object stores (not inline in the row)."""
        return self.size >= INLINE_LIMIT


@dataclass(frozen=True)
class Workload:
    """The mix of a run. Shares are of messages; ``mix`` maps scenario names to weights."""

    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    shared_share: float = 0.2
    inline_share: float = 0.1
    late_share: float = 0.0
    duplicate_share: float = 0.0
    size: int = 32 * 1024
    seed: int = 7

    def plans(self, run: str, messages: int) -> Iterator[MessagePlan]:
        chooser = random.Random(self.seed)
        names, weights = list(self.mix), list(self.mix.values())
        previous: MessagePlan | None = None
        for i in range(messages):
            # A message shares the payload of the one before when that one is a blob.
            shared = previous is not None and previous.stored and chooser.random() < self.shared_share
            inline = not shared and chooser.random() < self.inline_share
            plan = MessagePlan(
                message=f"{run}-m{i:08d}",
                payload=previous.payload if shared else f"{run}-p{i:08d}",
                scenario=chooser.choices(names, weights)[0],
                size=200 if inline else self.size,
                shared=shared,
                late=chooser.random() < self.late_share,
                duplicated=chooser.random() < self.duplicate_share,
            )
            yield plan
            previous = plan


def play(platform: Platform, plan: MessagePlan, deadline_in: timedelta = timedelta(seconds=5)) -> str:
    """Write one message through its scenario; return the payload id it got (a shared payload being
    purged is replaced by a new one, see ``Platform.enqueue``)."""
    # The message's own changes a millisecond apart: increasing, as its events must be, and on the wall
    # clock however many messages are played per millisecond.
    start = datetime.now(timezone.utc)
    moments = (start + timedelta(milliseconds=i) for i in count())
    soon = start + deadline_in
    scenario, message = plan.scenario, plan.message
    counter = 2 if scenario in ("expired by counter", "counter revived", "live") else None
    until = soon if scenario in ("expired by date", "date moved") else None
    complete = scenario not in ("incomplete upload", "upload completed")
    payload = platform.enqueue(message, plan.payload, extract_count=counter, extract_until=until,
                               complete=complete, size=plan.size, shared=plan.shared, at=next(moments))
    if scenario in ("expired by counter", "counter revived"):
        platform.dequeue(message, 1, at=next(moments))
        platform.dequeue(message, 0, at=next(moments))
    if scenario == "counter revived":
        platform.set_counter(message, 1, at=next(moments))
    elif scenario == "date moved":
        platform.set_extract_until(message, soon + timedelta(days=30), at=next(moments))
    elif scenario == "upload completed":
        platform.upload_complete(message, at=next(moments))
    elif scenario == "deleted":
        platform.delete(message, at=next(moments))
    return payload


def played(platform: Platform, plan: MessagePlan,
           deadline_in: timedelta = timedelta(seconds=5)) -> tuple[str, list[tuple[bytes, bytes]]]:
    """``play`` with its events held: the payload id it got, and the events to send (twice when the plan
    is duplicated), when the caller chooses."""
    with platform.holding() as events:
        payload = play(platform, plan, deadline_in)
    return payload, events * 2 if plan.duplicated else events


class _Pace:
    """Starts at most ``rate`` plays per second over all threads (None: as fast as they go)."""

    def __init__(self, rate: float | None) -> None:
        self.interval = 1 / rate if rate else 0.0
        self.next = time.monotonic()
        self.lock = threading.Lock()

    def wait(self) -> None:
        if not self.interval:
            return
        with self.lock:
            start, self.next = self.next, max(self.next, time.monotonic()) + self.interval
        delay = start - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def play_all(platform: Platform, plans: Iterable[MessagePlan], rate: float | None = None, threads: int = 8,
             late_by: timedelta = timedelta(seconds=2), deadline_in: timedelta = timedelta(seconds=5),
             on_played=None) -> dict[str, str]:
    """Play every plan, ``rate`` messages per second, on ``threads`` threads (a shared payload waits for
    the message that stores it). Late messages' events are held and sent ``late_by`` after their rows
    were written; duplicated ones are sent twice. Returns message -> payload id it got.

    ``on_played(plan, payload)`` is called after each message, from the playing thread.
    """
    pace = _Pace(rate)
    payloads: dict[str, str] = {}
    stored: dict[str, threading.Event] = {}  # payload -> written
    late: list[tuple[float, list]] = []
    lock = threading.Lock()

    def one(plan: MessagePlan) -> None:
        if plan.shared:
            stored[plan.payload].wait()
        pace.wait()
        try:
            got, sent = played(platform, plan, deadline_in)
            payloads[plan.message] = got
        finally:
            if not plan.shared:
                stored[plan.payload].set()
        if plan.late:
            with lock:
                late.append((time.monotonic() + late_by.total_seconds(), sent))
        else:
            platform.send(sent)
        if on_played is not None:
            on_played(plan, got)

    def send_due(until: float) -> None:
        with lock:
            due = [events for at, events in late if at <= until]
            late[:] = [(at, events) for at, events in late if at > until]
        for events in due:
            platform.send(events)

    with ThreadPoolExecutor(threads, thread_name_prefix="platform") as pool:
        futures = []
        for plan in plans:
            if not plan.shared:
                stored[plan.payload] = threading.Event()
            futures.append(pool.submit(one, plan))
            send_due(time.monotonic())
            if len(futures) >= 4 * threads:  # bounded: a plan's future is dropped once done
                futures.pop(0).result()
        for f in futures:
            f.result()
    while late:
        send_due(time.monotonic())
        time.sleep(0.1)
    platform.flush()
    return payloads

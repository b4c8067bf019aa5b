"""The revival race: the platform revives a message (counter set again, conditionally on the row existing)
while the purger's double-checked delete removes it. A revival acknowledged whose row is gone after both
is a lost revival (a live object deleted); a row neither revived nor deleted, an eligible row left behind.
A side whose lightweight transaction ends without a definite answer (contention between data centres'
proposals, a timeout) tries again, as the platform and the purger's retries do. Shared by the fault tests and the two-data-centre tests,
which run it through one node or through one node per side.

Example::

    race = revival_race(platform, deleter, platform.session, config, attempts=2000)
    race.lost, race.left, race.outcomes
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from cassandra import ConsistencyLevel, ReadTimeout, WriteTimeout
from cassandra.protocol import ErrorMessage

from purger.core.settings import PurgerConfig
from purger.policies.mailbox.deletes import MessagePurge
from simulation.mailbox import Platform
from tests.support.configs import mailbox
from tests.support.mailbox import purge_message
from tests.support.waits import ago, now

# A lightweight transaction's outcome unknown: "CAS operation result is unknown", or a timeout.
UNDECIDED = (ErrorMessage, WriteTimeout, ReadTimeout)
T = TypeVar("T")
# Each side starts within this long after the other: wide enough that either side's lightweight transaction
# often comes first (each side wins some).
JITTER_S = 0.012
# The purge reads the row, then the legal holds over the message's two scopes, before its conditional delete:
# the revival starts up to this much later besides, or it would nearly always come first.
DELETE_LEAD_S = 0.03


@dataclass
class RaceResult:
    attempts: int = 0
    seconds: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)  # deleted and revived: a live object gone
    left: list[str] = field(default_factory=list)  # kept, but nobody revived it: an eligible row left behind

    def counts(self) -> dict[str, int]:
        """The outcomes as ``reliability`` keywords."""
        return {k.replace(" ", "_").replace(",", ""): v for k, v in self.outcomes.items()}


def revival_race(platform: Platform, deleter: MessagePurge, revive_session: Any, config: PurgerConfig,
                 attempts: int, time_limit_s: float | None = None,
                 enough: Callable[[RaceResult], bool] | None = None) -> RaceResult:
    """Race ``attempts`` revivals (through ``revive_session``) against ``deleter``'s deletes, four at a time;
    with ``time_limit_s``, start no attempt after that long; with ``enough``, none once the result so far is."""
    settings = mailbox(config)
    revive = revive_session.prepare(f"UPDATE {config.cassandra.keyspace}.{settings.messages_table} "
                                    "SET extract_count = 1, updated_at = ? WHERE message_id = ? IF EXISTS")
    # After both sides, every replica's word on the row.
    final_read = revive_session.prepare(f"SELECT message_id FROM {config.cassandra.keyspace}.{settings.messages_table} "
                                        "WHERE message_id = ?")
    final_read.consistency_level = ConsistencyLevel.ALL
    result = RaceResult()
    started = time.monotonic()
    lock = threading.Lock()

    def attempt(i: int) -> None:
        if time_limit_s is not None and time.monotonic() - started > time_limit_s:
            return
        if enough is not None:
            with lock:
                if enough(result):
                    return
        m = f"race-revive-{uuid.uuid4().hex[:8]}-{i}"
        platform.enqueue(m, f"p-{m}", size=100, extract_count=1, at=ago(settings.expired_ttl))
        platform.dequeue(m, 0, at=ago(settings.expired_ttl))
        # Cassandra stamps a lightweight transaction with its millisecond clock, the driver a plain write
        # with microseconds: a delete within the same millisecond as the row's last write would carry an
        # older timestamp and leave that write's cells visible. A platform's last write comes at least a
        # retention period before the purge; here, the next millisecond is enough.
        time.sleep(0.002)
        gate = threading.Barrier(2)
        sides: dict[str, object] = {}

        def delete() -> None:
            gate.wait()
            time.sleep(random.random() * JITTER_S)
            sides["delete"] = decided(lambda: purge_message(deleter, m, "expired_by_counter", f"p-{m}").status)

        def revival() -> None:
            gate.wait()
            time.sleep(random.random() * (JITTER_S + DELETE_LEAD_S))
            sides["revived"] = decided(lambda: revive_session.execute(revive, (now(), m)).was_applied)

        threads = [threading.Thread(target=delete), threading.Thread(target=revival)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        kept = revive_session.execute(final_read, (m,)).one() is not None
        with lock:
            result.attempts += 1
            result.outcomes[f"{sides['delete']}, revival {'applied' if sides['revived'] else 'found no row'}"] += 1
            if sides["revived"] and not kept:
                result.lost.append(m)
            if not sides["revived"] and kept:
                result.left.append(m)

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(attempt, range(attempts)))
    result.seconds = time.monotonic() - started
    return result


def decided(attempt: Callable[[], T], tries: int = 10) -> T:
    """``attempt`` again until Cassandra gives a definite answer."""
    for _ in range(tries - 1):
        try:
            return attempt()
        except UNDECIDED:
            time.sleep(random.random() * 0.01)
    return attempt()

"""The client's CPU per response: the purger's reads' rows (``ROWS``: a statement's row class made once) against
the driver's own ``named_tuple_factory`` (a new class in every response, the session's default), on one session.

    python -m bench.rows --responses 20000

Single-row reads of a table shaped like the purger's rows (text, bigint, int, timestamp and set columns),
``--in-flight`` at once through ``execute_async``, as the purge's deletes run them. The rounds alternate the
two execution profiles on one session, so the machine's pace moves both alike; each figure is the median of its
rounds.
The driver decodes every response on its one reactor thread: what the factory costs there, every request of
every purge waits behind.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from cassandra.cluster import EXEC_PROFILE_DEFAULT, Session

from bench.common import BenchRun
from purger.connectors import cassandra_session
from purger.connectors.cassandra_client import ROWS

KEYS = 200


def reads(session: Session, keyspace: str, responses: int, in_flight: int, profile: str = EXEC_PROFILE_DEFAULT,
          ) -> tuple[float, float]:
    """Responses a second and the process's CPU microseconds a response, ``responses`` reads at ``in_flight``
    through the execution profile ``profile``."""
    select = session.prepare(f"SELECT k, a, b, c, d, e FROM {keyspace}.rows WHERE k = ?")
    slots, done, lock, left = threading.Semaphore(in_flight), threading.Event(), threading.Lock(), [responses]

    def answered(_: object) -> None:
        slots.release()
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    started, cpu = time.perf_counter(), time.process_time()
    for i in range(responses):
        slots.acquire()
        session.execute_async(select, (i % KEYS,), execution_profile=profile).add_callbacks(answered, answered)
    done.wait()
    return responses / (time.perf_counter() - started), (time.process_time() - cpu) / responses * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--responses", type=int, default=20_000, help="reads a round")
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each factory, alternating")
    args = parser.parse_args()
    run = BenchRun.start("rows")
    keyspace = f"bench_rows_{run.run.split('-')[-1]}"
    session = cassandra_session(run.config.cassandra)
    try:
        session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}", timeout=60)
        session.execute(f"CREATE TABLE {keyspace}.rows (k int PRIMARY KEY, a text, b bigint, c int, d timestamp, "
                        "e set<text>)", timeout=60)
        insert = session.prepare(f"INSERT INTO {keyspace}.rows (k, a, b, c, d, e) "
                                 "VALUES (?, ?, ?, ?, toTimestamp(now()), {'dc1', 'dc2'})")
        for k in range(KEYS):
            session.execute(insert, (k, f"message-{k:032d}", k, k))
        profiles = {"driver": EXEC_PROFILE_DEFAULT, "purger": ROWS}
        measured: dict[str, list[tuple[float, float]]] = {name: [] for name in profiles}
        reads(session, keyspace, args.responses // 4, args.in_flight)  # warm: connections, prepared ids
        for _ in range(args.rounds):
            for name, profile in profiles.items():
                measured[name].append(reads(session, keyspace, args.responses, args.in_flight, profile))
        session.execute(f"DROP KEYSPACE {keyspace}", timeout=60)
    finally:
        session.cluster.shutdown()
    rate = {name: statistics.median(r for r, _ in rounds) for name, rounds in measured.items()}
    cpu = {name: statistics.median(c for _, c in rounds) for name, rounds in measured.items()}
    details = {"responses": args.responses, "in_flight": args.in_flight, "rounds": args.rounds}
    run.record("reads through the purger's row factory", rate["purger"], "responses/s",
               baseline=("the driver's named_tuple_factory, same session", rate["driver"]), **details)
    run.record("client CPU a response, the purger's row factory", cpu["purger"], "us",
               baseline=("the driver's named_tuple_factory, same session", cpu["driver"]), **details)


if __name__ == "__main__":
    main()

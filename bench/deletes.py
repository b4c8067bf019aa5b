"""Double-checked deletions per second end to end, beside a plain cassandra-driver loop of the same deletes.

    python -m bench.deletes --messages 20000

The platform writes twice ``--messages`` messages that expire by counter (rows,
references, inline payloads, so Cassandra's delete path alone is measured),
one half with its events on the purger's topic, the other half on a topic no
one reads. Once they are all due:

1. the baselines delete the second half with the driver's asynchronous requests,
   ``--baseline-concurrency`` messages in flight: one quarter of the messages by the
   same conditional ``DELETE ... IF extract_count = 0 AND updated_at <= ?`` alone (the
   ceiling of the delete path), the other quarter by every statement the purger runs
   for such a message, in its order: the row's read, the read of its ``payload_refs``
   row, the intent's write to the journal, the conditional delete and the reference's
   delete;
   With ``--statement-costs N``, the loop also runs the conditional delete with
   each other statement of the purger's (``PARTS``), over N more messages each;
2. the purger runs on the first half: events read, timers fired, candidates
   double-checked and deleted with their references, every outcome in the ledger.

With ``--undo-window 1h`` the purger keeps each deletion restorable (docs/operations.md, "Undo"): each
message's row and reference read as JSON and written to the restorations table before they go. Its figures
say so in their names, beside the same baselines, and the bench adds the bytes the images take per deletion.

Both are timed by one rule: deleted messages over the span from the first message's
conditional delete answered to the last one's (the purger's ``deleted_at`` in the
ledger is taken at that moment). The purger's end-to-end time also runs from the
query's start to the last deletion.
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from cassandra.cluster import Session
from cassandra.query import PreparedStatement
from pyspark.sql import functions as F

from bench.common import BenchRun
from purger.connectors import cassandra_session
from simulation.mailbox import Platform
from devstack.stack import prepare
from simulation.workload import EXPIRED_ONLY, Workload, play_all
from purger.core.purge_protocol import SELF, Dependent, key_id
from purger.policies.mailbox.deletes import MESSAGES
from purger.sinks.journal import CassandraJournal
from purger.sinks.ledger import Ledger
from purger.sinks.restorations import read_images
from purger.running import start_purger
from purger.policies.mailbox.rules import EXPIRED_BY_COUNTER

EXPIRED_TTL = timedelta(seconds=5)
Statement = tuple[PreparedStatement, tuple]
# The baseline the purger's deletes are held to: its own statements, in its order, per message.
SAME_STATEMENTS = ("plain cassandra-driver loop of the purger's statements (row and reference reads, intent, delete, "
                   "reference delete)")


def write(run: BenchRun, name: str, messages: int, topic: str) -> dict[str, str]:
    """Write expired messages through the platform; message id -> payload id."""
    config = run.config.model_copy(update={"kafka": run.config.kafka.model_copy(update={"topics": [topic]})})
    prepare(config)
    platform = Platform(config)
    workload = Workload(mix=EXPIRED_ONLY, shared_share=0, inline_share=1.0)
    started = time.perf_counter()
    try:
        written = play_all(platform, workload.plans(f"{run.run}-{name}", messages), threads=16)
    finally:
        platform.close()
    run.record(f"workload generator, {name} (rows and events)", messages / (time.perf_counter() - started),
               "messages/s", messages=messages)
    return written


# The purger's statements for a message with an inline payload, in its order
# (``core.purge_protocol.ObjectPurge.purge``): the row's read, its ``payload_refs`` row's (whether the intent names
# it), the intent's write to the journal, the conditional delete, the reference's delete.
ROW_READ, REFERENCE_READ, INTENT, CONDITIONAL_DELETE, REFERENCE_DELETE = (
    "row read", "reference read", "intent", "conditional delete", "reference delete")
PURGER_ORDER = (ROW_READ, REFERENCE_READ, INTENT, CONDITIONAL_DELETE, REFERENCE_DELETE)
# What each statement adds to the conditional delete (``--statement-costs``).
PARTS = ((ROW_READ, CONDITIONAL_DELETE), (INTENT, CONDITIONAL_DELETE),
         (CONDITIONAL_DELETE, REFERENCE_READ, REFERENCE_DELETE))


def plain_driver_loop(run: BenchRun, messages: dict[str, str], concurrency: int, statements: tuple[str, ...]) -> float:
    """Deletions per second of the driver's asynchronous requests, ``concurrency`` messages in flight, each
    message's ``statements`` (of ``PURGER_ORDER``) one after the other, timed by ``deletion_rate``."""
    cassandra = run.config.cassandra
    session = cassandra_session(cassandra, cassandra.keyspace)
    try:
        made = message_statements(session, run)
        chains = [Chain([made[name](m, p) for name in statements], deletes_at=statements.index(CONDITIONAL_DELETE))
                  for m, p in messages.items()]
        deleted_at = Chains(session, chains, concurrency).run()
    finally:
        session.cluster.shutdown()
    return deletion_rate(len(deleted_at), min(deleted_at), max(deleted_at))


def message_statements(session: Session, run: BenchRun) -> dict[str, Callable[[str, str], Statement]]:
    """Each of ``PURGER_ORDER``, prepared as the purger prepares it: (message id, payload id) -> the statement
    and its values."""
    mailbox = run.config.policy_set.policy_of("message")
    settings = mailbox.settings
    rule = mailbox.retention.message_rules[EXPIRED_BY_COUNTER]
    delete = session.prepare(f"DELETE FROM {settings.messages_table} WHERE message_id = ? IF {rule.condition}")
    read_row = session.prepare(f"SELECT {', '.join(MESSAGES.selected)} FROM {settings.messages_table} "
                               "WHERE message_id = ?")
    read_ref = session.prepare(
        f"SELECT message_id FROM {settings.payload_refs_table} WHERE payload_id = ? AND message_id = ?")
    delete_ref = session.prepare(
        f"DELETE FROM {settings.payload_refs_table} WHERE payload_id = ? AND message_id = ?")
    journal = CassandraJournal(session, run.config.cassandra.keyspace, run.config.cassandra.journal_table)
    cutoff = datetime.now(timezone.utc) - EXPIRED_TTL
    batch = f"{run.run}/0"

    def intent(m: str, p: str) -> Statement:
        reference = Dependent("payload_refs", key_id([p, m]), delete=lambda: None)
        return journal.insert, journal.intent_values("message", m, {reference.key: batch, SELF: batch})

    return {ROW_READ: lambda m, p: (read_row, (m,)), REFERENCE_READ: lambda m, p: (read_ref, (p, m)), INTENT: intent,
            CONDITIONAL_DELETE: lambda m, p: (delete, (m, cutoff)), REFERENCE_DELETE: lambda m, p: (delete_ref, (p, m))}


def deletion_rate(deletions: int, first_s: float, last_s: float) -> float:
    """The one timing rule of both sides: deletions over the span from the first to the last (epoch seconds)."""
    return deletions / (last_s - first_s)


@dataclass(frozen=True)
class Chain:
    """One message's statements, in order; the one at ``deletes_at`` is its conditional delete."""

    statements: list[Statement]
    deletes_at: int


class Chains:
    """Each chain's statements in order, ``concurrency`` chains in flight, on the driver's callbacks (as
    ``execute_concurrent`` runs single statements). Each chain's conditional delete must apply; ``run`` returns
    the moments those were answered."""

    def __init__(self, session: Session, chains: list[Chain], concurrency: int):
        self.session, self.chains, self.concurrency = session, chains, concurrency
        self.next, self.left, self.lock, self.done = 0, len(chains), threading.Lock(), threading.Event()
        self.deleted_at: list[float] = []
        self.error: BaseException | None = None

    def run(self, timeout_s: float = 600) -> list[float]:
        for _ in range(min(self.concurrency, len(self.chains))):
            self._start_next()
        if not self.done.wait(timeout_s):
            raise RuntimeError(f"the baseline's {len(self.chains)} chains did not end within {timeout_s:.0f} s")
        if self.error is not None:
            raise RuntimeError(f"the baseline failed: {self.error}")
        return self.deleted_at

    def _start_next(self) -> None:
        with self.lock:
            chain, self.next = (self.chains[self.next] if self.next < len(self.chains) else None), self.next + 1
        if chain is not None:
            self._step(chain, 0)

    def _step(self, chain: Chain, index: int) -> None:
        statement, values = chain.statements[index]
        self.session.execute_async(statement, values).add_callbacks(
            self._answered, self._failed, callback_args=(chain, index))

    def _answered(self, rows: list, chain: Chain, index: int) -> None:
        if index == chain.deletes_at:
            if not rows[0][0]:
                self._failed(RuntimeError(f"a conditional delete did not apply: {chain.statements[index][1]}"))
                return
            at = time.time()
            with self.lock:
                self.deleted_at.append(at)
        if index + 1 < len(chain.statements):
            self._step(chain, index + 1)
            return
        with self.lock:
            self.left -= 1
            finished = self.left == 0
        if finished:
            self.done.set()
        else:
            self._start_next()

    def _failed(self, error: BaseException, *_: Any) -> None:
        self.error = error
        self.done.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--baseline-concurrency", type=int, default=64)
    parser.add_argument("--delete-concurrency", type=int, default=16, help="stream.delete_concurrency")
    parser.add_argument("--statement-costs", type=int, default=0, metavar="N",
                        help="also the loop of the conditional delete with each other statement, over N messages each")
    parser.add_argument("--undo-window", default=None, metavar="DURATION",
                        help="undo.window for the purger (e.g. 1h): its deletions keep their images")
    args = parser.parse_args()
    run = BenchRun.start(
        "deletes",
        policies={"mailbox": {"expired_ttl": f"{EXPIRED_TTL.total_seconds():.0f}s"}},
        stream={"trigger_interval": "1s", "watermark_delay": "2s", "clock_interval": "1s",
                "max_deletions_per_second": 1_000_000, "delete_concurrency": args.delete_concurrency},
        **({"undo": {"window": args.undo_window}} if args.undo_window else {}),
    )
    undo = f", undo window {args.undo_window}" if args.undo_window else ""
    config = run.config
    purged = write(run, "purger", args.messages, config.kafka.topics[0])
    baseline = write(run, "baseline", args.messages, f"bench.{run.run}.unread")
    extra = list(write(run, "statement costs", args.statement_costs * len(PARTS), f"bench.{run.run}.unread").items()
                 if args.statement_costs else [])
    parts = [dict(extra[i::len(PARTS)]) for i in range(len(PARTS))] if extra else []
    time.sleep(EXPIRED_TTL.total_seconds() + 1)

    half = dict(list(baseline.items())[: len(baseline) // 2])
    plain_rate = plain_driver_loop(run, half, args.baseline_concurrency, (CONDITIONAL_DELETE,))
    run.record("plain cassandra-driver conditional deletes", plain_rate, "deletions/s",
               concurrency=args.baseline_concurrency, messages=len(half))
    other_half = {m: p for m, p in baseline.items() if m not in half}
    same_work_rate = plain_driver_loop(run, other_half, args.baseline_concurrency, PURGER_ORDER)
    run.record(SAME_STATEMENTS, same_work_rate, "deletions/s",
               concurrency=args.baseline_concurrency, messages=len(other_half))
    for part, messages in zip(PARTS, parts):
        rate = plain_driver_loop(run, messages, args.baseline_concurrency, part)
        run.record(f"plain cassandra-driver loop: {', '.join(part)}", rate, "deletions/s",
                   baseline=("plain cassandra-driver conditional deletes", plain_rate),
                   concurrency=args.baseline_concurrency, messages=len(messages))

    spark = run.spark()
    running = start_purger(spark, config)
    started = time.time()
    try:
        deadline = time.monotonic() + 1800
        while running.sink.totals[("message", "purged")] < len(purged) and time.monotonic() < deadline:
            if running.query.exception() is not None:
                raise RuntimeError(f"the purger failed: {running.query.exception()}")
            time.sleep(0.5)
    finally:
        running.stop()
    deletions = (Ledger(spark, config.ledger).records()
                 .where((F.col("kind") == "message") & (F.col("status") == "purged"))
                 .agg(F.count(F.lit(1)).alias("n"), F.min("deleted_at").alias("first"),
                      F.max("deleted_at").alias("last"))
                 .first())
    if deletions["n"] != len(purged):
        raise RuntimeError(f"the purger deleted {deletions['n']} of {len(purged)} messages")
    first, last = (deletions[end].replace(tzinfo=timezone.utc).timestamp() for end in ("first", "last"))
    rate = deletion_rate(deletions["n"], first, last)
    run.record(f"purger double-checked deletions{undo}", rate, "deletions/s",
               baseline=("plain cassandra-driver conditional deletes", plain_rate),
               target=None if undo else ">= 0.7x", delete_concurrency=args.delete_concurrency,
               messages=deletions["n"])
    run.record(f"purger double-checked deletions, against the same statements{undo}", rate, "deletions/s",
               baseline=(SAME_STATEMENTS, same_work_rate), target=None if undo else ">= 0.8x",
               delete_concurrency=args.delete_concurrency, messages=deletions["n"])
    end_to_end = last - started
    run.record(f"purger end to end (query start to last deletion){undo}", end_to_end, "s", messages=deletions["n"])
    if undo:
        session = cassandra_session(config.cassandra)
        try:
            images = [image for image in read_images(session, config, int(started * 1000) - 3_600_000,
                                                     int(time.time() * 1000))
                      if image.root_id in purged]
        finally:
            session.cluster.shutdown()
        size = sum(len(image.row or "") + len(image.write_times or "") for image in images)
        run.record("undo window: images per deletion", len(images) / deletions["n"], "rows", messages=deletions["n"])
        run.record("undo window: image bytes per deletion (JSON, before Cassandra's own overhead)",
                   size / deletions["n"], "bytes", messages=deletions["n"])
        timed_restore(run, spark, int(started * 1000), deletions["n"])


def timed_restore(run: BenchRun, spark: Any, since_ms: int, messages: int) -> None:
    """`purger restore` of every deletion since ``since_ms``: its plan (the images and the ledger's records read),
    then its putting back (a hold per message, then each row ``IF NOT EXISTS``), half the messages one request at
    a time (the baseline), the other half as the command does (``PUT_BACK_CONCURRENCY``)."""
    import purger.restore
    from purger.restore import new_run, plan_restore, restore

    began = time.monotonic()
    plan = plan_restore(spark, run.config, "mailbox", since_ms, int(time.time() * 1000))
    planned = time.monotonic()
    if len(plan) != 2 * messages:
        raise RuntimeError(f"{len(plan)} deletions to restore of {messages} messages")
    run.record("restore: plan (images and ledger read)", len(plan) / (planned - began), "deletions/s",
               deletions=len(plan))
    roots = sorted({d.image.root_id for d in plan if d.image is not None})
    first = set(roots[: len(roots) // 2])
    rates = {}
    for concurrency, half in ((1, [d for d in plan if d.image.root_id in first]),
                              (purger.restore.PUT_BACK_CONCURRENCY, [d for d in plan if d.image.root_id not in first])):
        purger.restore.PUT_BACK_CONCURRENCY = concurrency
        began = time.monotonic()
        done = restore(spark, run.config, "mailbox", half, new_run(), "bench", "bench.deletes")
        rates[concurrency] = len(half) / (time.monotonic() - began)
        if len(done.restored) != len(half):
            raise RuntimeError(f"restored {len(done.restored)} of {len(half)} deletions")
    (one, _), (many, rate) = sorted(rates.items())
    run.record("restore: put back, one at a time (holds, rows IF NOT EXISTS, ledger)", rates[one], "deletions/s",
               deletions=len(plan) // 2)
    run.record(f"restore: put back, {many} at a time (holds, rows IF NOT EXISTS, ledger)", rate, "deletions/s",
               baseline=("restore: put back, one at a time (holds, rows IF NOT EXISTS, ledger)", rates[one]),
               deletions=len(plan) // 2)


if __name__ == "__main__":
    main()

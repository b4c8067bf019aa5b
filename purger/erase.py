"""``purger erase``: a data subject's objects purged now, through the running stream, and the certificate
(docs/operations.md, "Erasure on request"; the protocol's side is ``purger.core.erasure``).

The command finds the subject's objects in every enabled policy that names its kind (``Policy.subjects``): a
user by its key, a mailbox's messages by a scan of the messages table on the executors, paced as a reconcile's
scans are (``reconcile.max_rows_per_second``), their rule events by a scan of theirs. It sends, for each, a
recheck under the request's rule on ``kafka.control_topic``: the stream decides each as any candidate (so one
object is never purged by two hands at once), under the erasure's rule, which wins over retention but not over a
hold. Then it reads the ledger until each object asked for is settled (deleted, found gone, or kept under a
hold) and the payloads that follow have had their batches, and prints the certificate from the request's
records: the request id (``<day>-<hex>``) names the day its records start, so a run cut short (a kill, a
``--wait`` passed) is finished by running it again with ``--request``, and the certificate covers both runs.

Example::

    request = new_request()                                  # '20261206-7f3a9c21'
    asked = find_objects(spark, config, Scope.parse("mailbox:alice"))
    send_erasure(config, asked, request)
    wait_for_certificate(spark, config, Scope.parse("mailbox:alice"), request, asked, wait_s=600)
"""

from __future__ import annotations

import time
import uuid
from datetime import date, datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

from purger.core.erasure import Certificate, SubjectRows, certificate, erasure_rule
from purger.core.failpoints import failpoint
from purger.core.holds import Scope

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from purger.core.policy import Policy
    from purger.core.settings import PurgerConfig

# How long after the request's last record what follows it may be asked for: a payload released by an erased
# message is rechecked under the erasure at the moment of the release, just after the message's record.
FOLLOWS_WITHIN_MS = 1_000


class EraseRefused(Exception):
    """An erasure that cannot go on: one line that says why and what to do."""


def new_request(today: date | None = None) -> str:
    """A request's id: the day its records start on, then random hex."""
    return f"{(today or datetime.now(timezone.utc).date()):%Y%m%d}-{uuid.uuid4().hex[:8]}"


def request_day(request: str) -> date:
    """The day a request's records start on; ``EraseRefused`` for an id not made by ``new_request``."""
    try:
        return datetime.strptime(request.partition("-")[0], "%Y%m%d").date()
    except ValueError:
        raise EraseRefused(f"request {request!r}: give the id an earlier `purger erase` printed "
                           "(e.g. 20261206-7f3a9c21)") from None


def subject_rows(config: PurgerConfig, subject: Scope) -> list[tuple[Policy, SubjectRows]]:
    """Every enabled policy's rows of ``subject``'s kind, those found through another kind after it; none: the
    line that lists the kinds there are."""
    found = [(policy, rows) for policy in config.policy_set.policies for rows in policy.subjects
             if rows.subject == subject.kind]
    if not found:
        kinds = sorted({rows.subject for policy in config.policy_set.policies for rows in policy.subjects})
        raise EraseRefused(f"subject {subject}: no enabled policy finds objects of a {subject.kind!r}; the kinds are "
                           f"{', '.join(kinds) or 'none (enable the mailbox or users policy)'}")
    return sorted(found, key=lambda found: found[1].through is not None)


def find_objects(spark: SparkSession, config: PurgerConfig, subject: Scope) -> list[tuple[str, str]]:
    """The (kind, id) of every object of ``subject`` there is now, in every enabled policy that names its kind."""
    ids: dict[str, DataFrame] = {}  # cached: a policy that goes through another's objects joins them
    try:
        return _found(spark, config, subject, ids)
    finally:
        for frame in ids.values():
            frame.unpersist()


def _found(spark: SparkSession, config: PurgerConfig, subject: Scope,
           ids: dict[str, DataFrame]) -> list[tuple[str, str]]:
    from pyspark.sql import functions as F

    from purger.reconcile.orphan_scans import id_and_column

    for policy, rows in subject_rows(config, subject):
        table = policy.table_names()[rows.table]
        what = f"the objects of {subject} in policies.{policy.name}"
        if rows.by_key:
            found = spark.createDataFrame([(object_id,) for object_id in _by_key(config, table, rows, subject.id)],
                                          "id string")
        elif rows.through is not None:
            if rows.through not in ids:
                continue  # the policy it goes through is not enabled
            scanned = id_and_column(spark, config, what, table, rows.id_column, rows.subject_column)
            found = scanned.join(ids[rows.through].withColumnRenamed("id", "column"), "column", "left_semi")
        else:
            scanned = id_and_column(spark, config, what, table, rows.id_column, rows.subject_column)
            found = scanned.where(F.col("column") == subject.id)
        ids[rows.kind] = found.select("id").distinct().cache()
    return sorted((kind, row.id) for kind, frame in ids.items() for row in frame.collect())


def _by_key(config: PurgerConfig, table: str, rows: SubjectRows, object_id: str) -> list[str]:
    from purger.connectors import cassandra_session

    session = cassandra_session(config.cassandra)
    try:
        found = session.execute(f"SELECT {rows.id_column} FROM {config.cassandra.keyspace}.{table} "
                                f"WHERE {rows.id_column} = %s", (object_id,)).one()
        return [] if found is None else [object_id]
    finally:
        session.cluster.shutdown()


def send_erasure(config: PurgerConfig, objects: list[tuple[str, str]], request: str) -> None:
    """A recheck under the request's rule for each object, on the control topic, all delivered on return."""
    from purger.connectors import kafka_producer
    from purger.core.times import now_ms
    from purger.streams.control import ControlWriter

    producer = kafka_producer(config.kafka, acks="all")
    try:
        control = ControlWriter(producer, config.kafka.control_topic, config.policy_set)
        rule, at_ms = erasure_rule(request), now_ms()
        for number, (kind, object_id) in enumerate(objects):
            control.recheck(kind, object_id, rule, at_ms)
            if number == len(objects) // 2:
                failpoint("erase_half_sent")
        producer.flush(f"run `purger erase` again with --request {request}: not every object was asked for")
    finally:
        producer.close()


_RECORD_COLUMNS = ("policy", "kind", "id", "dc", "status", "reason", "deleted_at", "decided_at", "record_id",
                   "batch_id")


def erasure_records(spark: SparkSession, config: PurgerConfig, request: str, after: int | None = None,
                    up_to: int | None = None) -> list[dict[str, Any]]:
    """The ledger's records under the request's rule: from the day it started, as of version ``up_to``; with
    ``after``, only those written since that version (its change feed: what a version added, however large the
    day is)."""
    from pyspark.sql import functions as F

    from purger.sinks.ledger import Ledger

    ledger = Ledger(spark, config.ledger)
    if after is None:
        found = ledger.records(as_of=up_to).where(F.col("date") >= F.lit(request_day(request)))
    else:
        found = ledger.inserted(after, up_to)
    found = found.where(F.col("rule") == erasure_rule(request))
    return [row.asDict() for row in found.select(*_RECORD_COLUMNS).collect()]


def wait_for_certificate(spark: SparkSession, config: PurgerConfig, subject: Scope, request: str,
                         asked: list[tuple[str, str]], wait_s: float, say: Callable[[str], None] = print
                         ) -> Certificate:
    """Read the request's records until every object asked for (now or by an earlier run of it: its records' kinds
    among the subject's) is settled and what follows them has had its batch, or ``wait_s`` passed: the certificate
    then, its ids in clear where the ledger hashes them and they are known here."""
    from purger.sinks.ledger import Ledger

    ledger = Ledger(spark, config.ledger)
    pseudonyms = ledger.pseudonyms
    found_rows = subject_rows(config, subject)
    kinds = {rows.kind for _, rows in found_rows}
    # The kinds whose erasure something follows (a message's payload): only their records start a wait for it.
    leading = {rows.kind for policy, rows in found_rows if any(f.table == rows.table for f in policy.follows)}
    clear = {pseudonyms.id(object_id): object_id for _, object_id in asked}
    hashed = [(kind, pseudonyms.id(object_id)) for kind, object_id in asked]
    location = config.stream.checkpoint_location
    deadline = time.monotonic() + wait_s
    said, marked = None, (None, None)
    records: list[dict[str, Any]] = []
    read_up_to: int | None = None
    while True:
        # The commit first: the records read after it hold every record of the batches it says have ended. The
        # day's records are read once; then what each new version of the ledger added.
        batch, watermark_ms = _last_commit(spark, location)
        version = ledger.version() if ledger.exists() else None
        if version is not None and version != read_up_to:
            records += erasure_records(spark, config, request, read_up_to, version)
            read_up_to = version
        earlier = {(r["kind"], r["id"]) for r in records if r["kind"] in kinds}
        found = certificate(str(subject), request, set(hashed) | earlier, records)
        # What follows the records (a payload) is rechecked at its release, just after them: decided in the batch
        # after the first one committed with a watermark past that. Nothing follows the followers themselves, nor a
        # user: their records wait for no batch (on a quiet stream each would be a quiet tick).
        last_ms = max((int(r["decided_at"].timestamp() * 1000) for r in records if r["kind"] in leading),
                      default=None)
        if marked[0] != last_ms:
            marked = (last_ms, None)
        if marked[1] is None and last_ms is not None and watermark_ms >= last_ms + FOLLOWS_WITHIN_MS:
            marked = (last_ms, batch)
        followed = last_ms is None or (marked[1] is not None and batch > marked[1])
        if (found.complete and followed) or time.monotonic() > deadline:
            return _in_clear(found, clear)
        if said != len(found.pending):
            said = len(found.pending)
            say(f"waiting for {said} of {len(set(hashed) | earlier)} objects to be decided"
                if said else "waiting for what follows them (payloads)")
        time.sleep(1)


def remove_images(config: PurgerConfig, subject: Scope, asked: list[tuple[str, str]], found: Certificate
                  ) -> Certificate:
    """The undo window's images of the subject and of its objects (those asked for, and those the certificate
    names) removed, but what a hold keeps: the certificate with how many went and what was kept."""
    from dataclasses import replace

    from purger.connectors import cassandra_session
    from purger.core.erasure import CertificateEntry
    from purger.sinks.restorations import ImagesNotRemoved, erase_images

    # Of the certificate's entries, those a name can be: a purge's root (a message, a payload), not what goes
    # with it (a message's reference, a user's permissions).
    roots = {kind.name for policy in config.policy_set.policies for kind in policy.kinds}
    named = {(e.kind, e.id) for e in found.deleted + found.kept + found.gone if e.kind in roots} | set(asked)
    session = cassandra_session(config.cassandra)
    try:
        images = erase_images(session, config, str(subject), sorted(named))
    except ImagesNotRemoved as error:
        raise EraseRefused(f"{error}: run `purger erase {subject} --request {found.request}` again") from None
    finally:
        session.cluster.shutdown()
    return replace(found, images_removed=sum(len(kept) for kept in images.removable.values()),
                   images_kept=[CertificateEntry(kind, object_id, reason=why) for kind, object_id, why in images.kept])


def _last_commit(spark: SparkSession, location: str) -> tuple[int, int]:
    """The stream's last committed batch and the watermark it set for the next (-1, 0: none yet)."""
    import json

    from purger.streams.checkpoint import CheckpointFiles

    files = CheckpointFiles(spark, location)
    commits = files.log("commits")
    if not commits:
        return -1, 0
    last = max(commits)
    return last, json.loads(files.text(commits[last]).splitlines()[-1]).get("nextBatchWatermarkMs", 0)


def _in_clear(found: Certificate, clear: dict[str, str]) -> Certificate:
    from dataclasses import replace

    entries = lambda items: [replace(e, id=clear.get(e.id, e.id)) for e in items]  # noqa: E731
    return replace(found, deleted=entries(found.deleted), kept=entries(found.kept), gone=entries(found.gone),
                   pending=[(kind, clear.get(object_id, object_id)) for kind, object_id in found.pending])

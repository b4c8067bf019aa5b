"""``purger restore``: what a policy deleted within the undo window put back (docs/operations.md, "Undo"; the
images are ``purger.core.restorations``'s, kept by ``purger.sinks.restorations``).

The command reads the ledger's ``purged`` records of the policy (of a rule, in a time range, of some ids), finds
each one's image (the last kept at or before it), places a hold on each object it is about to put back, so that
the policy that deleted it cannot again before someone releases it, then puts the images back in the reverse of
the deletions' order (``restore_order``): a blob copied back from its copy where its key is free, a row inserted
from its JSON where its key is free (``IF NOT EXISTS``: a row written again since is the platform's, and stays).
Each is recorded in the ledger: ``restored``, or ``not_restored`` with why (past the window, written again since).
A run cut short is finished by running it again with ``--run``: a row found equal to its image counts as restored,
and the records of both runs are one set.

Example::

    plan = plan_restore(spark, config, "mailbox", since_ms, until_ms)     # each deletion with its image, or None
    done = restore(spark, config, plan, run="20261206-1a2b3c4d", who="jdoe", why="period in seconds")
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from purger.core.failpoints import failpoint
from purger.core.restorations import ROW, Kept, latest_images, restore_order
from purger.core.times import now_ms
from purger.core.vocabulary import NOT_RESTORED, PURGED, RESTORED

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from pyspark.sql import SparkSession

    from purger.core.policy import Policy
    from purger.core.settings import PurgerConfig

# Images are kept just before their deletion: read from this long before a restore's range begins.
KEPT_BEFORE_MS = 3_600_000
# Holds placed, and images of a rank put back, at once: each a request or two (a lightweight transaction for a
# hold or a row, a HEAD and a copy for a blob); the driver's session and the S3 clients are safe across threads.
PUT_BACK_CONCURRENCY = 32
# Why a deletion is not put back: the reason of its not_restored record.
PAST_WINDOW = "past the undo window"
WRITTEN_AGAIN = "written again"


class RestoreRefused(Exception):
    """A restore that cannot go on: one line that says why and what to do."""


@dataclass(frozen=True)
class Deletion:
    """A ``purged`` record of the ledger: what was deleted (its id as the ledger wrote it), where, when, by which
    rule; and its image, None when none is kept."""

    kind: str
    id: str
    dc: str | None
    rule: str | None
    deleted_at_ms: int
    image: Kept | None


@dataclass
class Restored:
    """What a restore did: each deletion put back or not (with why), and the holds it placed."""

    run: str
    restored: list[Deletion] = field(default_factory=list)
    not_restored: list[tuple[Deletion, str]] = field(default_factory=list)
    held: list[str] = field(default_factory=list)


def enabled_policy(config: PurgerConfig, policy: str) -> Policy:
    """The enabled policy named ``policy``; ``RestoreRefused`` naming those there are otherwise."""
    found = [p for p in config.policy_set.policies if p.name == policy]
    if not found:
        raise RestoreRefused(f"policy {policy!r} is not enabled in this configuration: restore one of "
                             f"{', '.join(sorted(p.name for p in config.policy_set.policies))} (--policy)")
    return found[0]


def plan_restore(spark: SparkSession, config: PurgerConfig, policy: str, since_ms: int, until_ms: int,
                 rule: str | None = None, ids: Iterable[str] = ()) -> list[Deletion]:
    """The policy's deletions from ``since_ms`` to ``until_ms`` (of ``rule``; of the objects ``ids`` and what went
    with them), each with its image."""
    from pyspark.sql import functions as F

    from purger.connectors import cassandra_session
    from purger.core.pseudonyms import Pseudonyms
    from purger.core.times import from_epoch_ms
    from purger.sinks.ledger import Ledger
    from purger.sinks.restorations import read_images

    enabled_policy(config, policy)
    ledger = Ledger(spark, config.ledger)
    if not ledger.exists():
        return []
    pseudonyms = Pseudonyms.of(config.ledger)
    session = cassandra_session(config.cassandra)
    try:
        images = list(read_images(session, config, since_ms - KEPT_BEFORE_MS, until_ms))
    finally:
        session.cluster.shutdown()
    # Each image's id as the ledger wrote it (a keyed hash, in a pseudonymised ledger), hashed once.
    written = {image: pseudonyms.id(image.id) for image in images}
    records = (ledger.records()
               .where((F.col("status") == PURGED) & (F.col("policy") == policy)
                      & F.col("date").between(from_epoch_ms(since_ms).date(), from_epoch_ms(until_ms).date())
                      & F.col("deleted_at").between(from_epoch_ms(since_ms), from_epoch_ms(until_ms))))
    if rule is not None:
        records = records.where(F.col("rule") == rule)
    if ids:
        # The objects asked for, and what went with them (their images name them as their root).
        asked = {pseudonyms.id(object_id) for object_id in ids}
        roots = {(image.root_kind, image.root_id) for image, written_id in written.items() if written_id in asked}
        images = [image for image in images if written[image] in asked or (image.root_kind, image.root_id) in roots]
        records = records.where(F.col("id").isin(sorted(asked | {written[image] for image in images})))
    found = [(r.kind, r.id, r.dc, r.rule, int(r.deleted_at.timestamp() * 1000))
             for r in records.select("kind", "id", "dc", "rule", "deleted_at").collect()]
    matched = latest_images([replace(image, id=written[image]) for image in images],
                            [(kind, object_id, dc, at) for kind, object_id, dc, _, at in found])
    clear = {(written[image], image.kind, image.dc, image.kept_at_ms): image for image in images}
    plan = []
    for kind, object_id, dc, rule_of, at in found:
        image = matched[kind, object_id, dc, at]
        plan.append(Deletion(kind, object_id, dc, rule_of, at,
                             None if image is None else clear[image.id, image.kind, image.dc, image.kept_at_ms]))
    return plan


def restore(spark: SparkSession, config: PurgerConfig, policy: str, plan: list[Deletion], run: str, who: str,
            why: str, say: Callable[[str], None] = lambda line: None) -> Restored:
    """Put ``plan`` back: holds first, then the images in order, then the ledger's records of each."""
    from concurrent.futures import ThreadPoolExecutor

    from purger.connectors import cassandra_session
    from purger.sinks.holds import CassandraHolds
    from purger.sinks.objects import ObjectStores

    done = Restored(run)
    restorable = [d for d in plan if d.image is not None]
    done.not_restored += [(d, PAST_WINDOW) for d in plan if d.image is None]
    scopes = _hold_scopes(config, policy, restorable)
    session = cassandra_session(config.cassandra)
    try:
        holds = CassandraHolds.of(session, config.cassandra)
        with ThreadPoolExecutor(PUT_BACK_CONCURRENCY, thread_name_prefix="restore") as pool:
            # Every hold placed (a lightweight transaction each) before anything is put back.
            list(pool.map(lambda scope: holds.place(scope, f"restored by `purger restore` {run}: {why}", who), scopes))
            done.held = scopes
            say(f"{len(scopes)} objects held, so that the policy does not delete them again before a release")
            stores = ObjectStores(config.stores).for_threads()
            by_image = {id(d.image): d for d in restorable}
            ordered = restore_order(d.image for d in restorable)
            for image, why_not in _put_all_back(pool, session, stores, ordered):
                if why_not is None:
                    done.restored.append(by_image[id(image)])
                else:
                    done.not_restored.append((by_image[id(image)], why_not))
    finally:
        session.cluster.shutdown()
    _record(spark, config, policy, done, who)
    return done


def _put_all_back(pool: Executor, session: Any, stores: Any, ordered: list[Kept]
                  ) -> Iterator[tuple[Kept, str | None]]:
    """Each image put back, in order of rank (``restore_order``: blobs before what names them), those of a rank
    ``PUT_BACK_CONCURRENCY`` at a time (``pool``'s threads); each with why it was not (None: it was)."""
    from itertools import groupby

    answered, half = 0, len(ordered) // 2
    for _, ranked in groupby(ordered, key=lambda image: image.rank):
        of_rank = list(ranked)
        for image, why_not in zip(of_rank, pool.map(partial(_put_back, session, stores), of_rank)):
            answered += 1
            if answered == half:
                failpoint("restore_half_done")  # the rest of the rank in flight
            yield image, why_not


def _hold_scopes(config: PurgerConfig, policy: str, deletions: list[Deletion]) -> list[str]:
    """The scope of each object (a root's row) that the policy's holds can name: a message, a user, a unit of
    work; a payload is kept by the messages that refer to it."""
    kinds = set(enabled_policy(config, policy).hold_scopes())
    return sorted({f"{d.image.root_kind}:{d.image.root_id}" for d in deletions
                   if d.image is not None and d.image.rank == ROW and d.image.root_kind in kinds})


def _put_back(session: Any, stores: Any, image: Kept) -> str | None:
    """One image back where it was; None once it is (now or by an earlier run), else why not."""
    if image.copy_key is not None:
        assert image.dc is not None and image.blob_key is not None
        client, bucket = stores._client(image.dc), stores.stores[image.dc].bucket
        if _exists(client, bucket, image.blob_key):
            return None if _same_blob(client, bucket, image) else WRITTEN_AGAIN
        if not _exists(client, bucket, image.copy_key):
            return PAST_WINDOW
        client.copy_object(Bucket=bucket, Key=image.blob_key, CopySource={"Bucket": bucket, "Key": image.copy_key})
        return None
    assert image.table is not None and image.row is not None
    if session.execute(f"INSERT INTO {image.table} JSON %s DEFAULT UNSET IF NOT EXISTS", (image.row,)).was_applied:
        return None
    row = json.loads(image.row)
    keys = [column.name for column in _table(session, image.table).primary_key]
    present = session.execute(f"SELECT JSON * FROM {image.table} WHERE "
                              + " AND ".join(f'"{k}" = %s' for k in keys), [row[k] for k in keys]).one()
    return None if present is not None and json.loads(present[0]) == row else WRITTEN_AGAIN


def _table(session: Any, table: str) -> Any:
    keyspace, name = table.split(".", 1)
    return session.cluster.metadata.keyspaces[keyspace].tables[name]


def _exists(client: Any, bucket: str, key: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        client.head_object(Bucket=bucket, Key=key)
        return True
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise


def _same_blob(client: Any, bucket: str, image: Kept) -> bool:
    """Whether the blob there now is its copy's bytes (put back by an earlier run), by their ETags."""
    return (client.head_object(Bucket=bucket, Key=image.blob_key)["ETag"]
            == client.head_object(Bucket=bucket, Key=image.copy_key)["ETag"])


def _record(spark: SparkSession, config: PurgerConfig, policy: str, done: Restored, who: str) -> None:
    """A ledger record per deletion looked at: ``restored`` or ``not_restored`` with why, under the run's own
    query id, each once however many times the run is finished again."""
    from purger.sinks.ledger import Ledger
    from purger.sinks.purge import OUTCOME_SCHEMA, worker_name

    decided = now_ms()
    worker = worker_name()
    rows = [(policy, d.kind, d.id, d.rule, d.dc, RESTORED, None, None, decided, None, 0, worker, None)
            for d in done.restored]
    rows += [(policy, d.kind, d.id, d.rule, d.dc, NOT_RESTORED, why, None, decided, None, 0, worker, None)
             for d, why in done.not_restored]
    # Ids as the ledger's purged records wrote them (hashed already, in a pseudonymised ledger).
    Ledger(spark, config.ledger).append(spark.createDataFrame(rows, OUTCOME_SCHEMA), f"restore/{done.run}", 0,
                                        may_hold=True, began_ms=run_began_ms(done.run), ids_written=True)


def run_began_ms(run: str) -> int:
    """When a restore run began: its id's first part (``new_run``)."""
    return int(run.partition("-")[0])


def new_run() -> str:
    """A restore run's id: when it began (epoch ms), then random hex."""
    import uuid

    return f"{now_ms()}-{uuid.uuid4().hex[:8]}"

"""The undo window's images (``core.restorations``) in Cassandra and the object stores: a row's image in the
restorations table, a blob's copy in its own bucket under ``undo.prefix``, both kept ``undo.window`` long (the
table's rows by their TTL, the copies by the bucket's lifecycle rule that `purger setup` adds, or by the running
purger's daily upkeep where the store has none: ``expire_copies``).

The table is the purger's own, in the configured keyspace (``cassandra.restorations_table``). Its partitions are an
hour of images and one of ``BUCKETS`` buckets of their objects' ids, so that no partition grows with the volume of a
day, and a restore reads the hours of its time range, each bucket a partition; time-window compaction drops whole
SSTables once their TTL passed.

Example::

    aside = CassandraRestorations.of(session, config)     # None when undo.window is not set
    aside.keep(tables, "message", "m1", "expired_by_date", [("message", "m1", None, RowImage(...), ROW)])
    read_images(session, config, since_ms, until_ms)       # every image kept in that time
"""

from __future__ import annotations

import json
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from datetime import date, timedelta
from typing import TYPE_CHECKING, Any, Iterator

from cassandra.query import BatchStatement, BatchType

from purger.core.restorations import Aside, BlobImage, Image, Kept, Root, RowImage, SubjectImages, names_of, rows_of, \
    subject_images
from purger.core.times import duration_ms, epoch_ms, from_epoch_ms, now_ms

if TYPE_CHECKING:
    from purger.core.handles import Tables
    from purger.core.settings import PurgerConfig
    from purger.sinks.objects import ObjectStores

BUCKETS = 64
HOUR_MS = 3_600_000
# Reads, deletes and hold checks of an erasure's images in flight at once.
ERASE_CONCURRENCY = 32

_SCHEMA = """
CREATE TABLE IF NOT EXISTS {keyspace}.{table} (
  hour        timestamp,        -- the hour the image was kept in
  bucket      int,              -- of its object's id, 0 to 63
  root_kind   text,             -- the candidate whose purge kept it
  root_id     text,
  kind        text,             -- the deletion it precedes, as the ledger names it
  id          text,
  dc          text,             -- '' for a row
  kept_at     timestamp,
  rule        text,
  rank        int,              -- its place in a restore (core.restorations.restore_order)
  table_name  text,             -- a row's keyspace.table, its JSON and its cells' write times
  row_json    text,
  write_times text,
  blob_key    text,             -- a blob's key, and its copy's in the same bucket
  copy_key    text,
  PRIMARY KEY ((hour, bucket), root_kind, root_id, kind, id, dc, kept_at)
) WITH compaction = {{'class': 'TimeWindowCompactionStrategy', 'compaction_window_unit': 'HOURS',
                     'compaction_window_size': 24}}
"""
# Where a data subject's images are (``purger erase``): each root's partition under every name its images are
# found by (``core.restorations.names_of``): its own (``message:m1``) and the subject its rows name
# (``mailbox:alice``). A partition is a name's day: a mailbox that loses a million messages a day has a
# partition of about 60 MB a day, not one of the whole window; an erasure reads the window's days of each name.
_NAMES_SCHEMA = """
CREATE TABLE IF NOT EXISTS {keyspace}.{table} (
  name        text,             -- KIND:ID
  day         date,             -- the day the images were kept in
  hour        timestamp,        -- where the root's images are in the restorations table
  bucket      int,
  root_kind   text,
  root_id     text,
  PRIMARY KEY ((name, day), hour, bucket, root_kind, root_id)
) WITH compaction = {{'class': 'TimeWindowCompactionStrategy', 'compaction_window_unit': 'HOURS',
                     'compaction_window_size': 24}}
"""
NAMES_COLUMNS = frozenset({"name", "day", "hour", "bucket", "root_kind", "root_id"})
# A purge keeps its images in several calls (its row, then its followers; a blob before each delete): the names
# an executor wrote last are not written again (a bounded memory: a name written twice is only a cost).
NAMES_WRITTEN = 4096
RESTORATIONS_COLUMNS = frozenset({"hour", "bucket", "root_kind", "root_id", "kind", "id", "dc", "kept_at", "rule",
                                  "rank", "table_name", "row_json", "write_times", "blob_key", "copy_key"})
_FIELDS = ("root_kind", "root_id", "kind", "id", "dc", "kept_at", "rule", "rank", "table_name", "row_json",
           "write_times", "blob_key", "copy_key")


def restorations_schema(keyspace: str, table: str) -> str:
    """The CQL that creates the restorations table ``keyspace.table`` if it does not exist."""
    return _SCHEMA.format(keyspace=keyspace, table=table).strip()


def restoration_names_schema(keyspace: str, table: str) -> str:
    """The CQL that creates the table of names the undo window's images are found by, if it does not exist."""
    return _NAMES_SCHEMA.format(keyspace=keyspace, table=table).strip()


def copy_key_of(prefix: str, kept_at_ms: int, key: str) -> str:
    """Where a blob's copy is kept: under the prefix, the day it was kept in (so a day's copies expire together),
    then its own key."""
    return f"{prefix}{from_epoch_ms(kept_at_ms).date().isoformat()}/{key}"


def expire_copies(config: PurgerConfig, today: date) -> int:
    """The blobs' copies kept for longer than the window, deleted a day at a time, in each data centre's bucket:
    the day folders under ``undo.prefix`` (one listing) before the window's first day; how many copies went. A
    store's own lifecycle rule (docs/operations.md, "Undo") usually took them first."""
    from purger.connectors import s3_client
    from purger.sinks.objects import DELETE_BATCH

    window_days = config.undo.window_days
    if window_days is None:
        return 0
    first_kept = today - timedelta(days=window_days)
    prefix, gone = config.undo.prefix, 0
    for store in config.stores.values():
        client = s3_client(store)
        folders = client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=prefix, Delimiter="/")
        days = [found["Prefix"] for page in folders for found in page.get("CommonPrefixes", [])]
        for day in days:
            try:
                expired = date.fromisoformat(day[len(prefix):].rstrip("/")) < first_kept
            except ValueError:
                continue  # not a day's folder: not the purger's
            if not expired:
                continue
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=day):
                keys = [found["Key"] for found in page.get("Contents", [])]
                for start in range(0, len(keys), DELETE_BATCH):
                    client.delete_objects(Bucket=store.bucket, Delete={
                        "Objects": [{"Key": key} for key in keys[start:start + DELETE_BATCH]], "Quiet": True})
                gone += len(keys)
    return gone


def bucket_of(object_id: str) -> int:
    return zlib.crc32(object_id.encode()) % BUCKETS


class CassandraRestorations(Aside):
    """Images kept before each delete, for ``ttl_s`` seconds."""

    @classmethod
    def of(cls, session: Any, config: PurgerConfig, stores: ObjectStores) -> CassandraRestorations | None:
        window = config.undo.window
        if window is None:
            return None
        return cls(session, config, stores, duration_ms(window) // 1000)

    def __init__(self, session: Any, config: PurgerConfig, stores: ObjectStores, ttl_s: int) -> None:
        self.session, self.stores, self.prefix, self.ttl_s = session, stores, config.undo.prefix, ttl_s
        self.naming = subject_naming(config)
        name, names = _tables(config)
        self.insert = session.prepare(
            f"INSERT INTO {name} (hour, bucket, {', '.join(_FIELDS)}) VALUES (?, ?, {', '.join('?' * len(_FIELDS))}) "
            "USING TTL ?")
        self.insert_name = session.prepare(
            f"INSERT INTO {names} (name, day, hour, bucket, root_kind, root_id) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?")
        self._named: OrderedDict[tuple[str, int, int, str, str], None] = OrderedDict()
        self._reads: dict[tuple[int, str], tuple[Any, str, list[str]]] = {}

    def keep(self, tables: Tables, root_kind: str, root_id: str, rule: str,
             images: list[tuple[str, str, str | None, Image, int]]) -> str | None:
        kept_at = now_ms()
        hour, bucket = from_epoch_ms(kept_at - kept_at % HOUR_MS), bucket_of(root_id)
        rows, named = [], []
        for kind, object_id, dc, image, rank in images:
            if isinstance(image, BlobImage):
                copy_key = copy_key_of(self.prefix, kept_at, image.key)
                copied = self.stores.copy(image.dc, image.key, copy_key)
                if isinstance(copied, str):
                    return f"keeping {image.key} aside in {image.dc}: {copied}"
                if copied:
                    rows.append((kind, object_id, dc, rank, None, None, None, image.key, copy_key))
            else:
                statement, table_name, timed = self._read(tables, image)
                found = tables.one(statement, *(value for _, value in image.key))
                if found is not None:
                    row, write_times = _split(json.loads(found[0]), timed)
                    named.append((table_name, row))
                    rows.append((kind, object_id, dc, rank, table_name, json.dumps(row), json.dumps(write_times),
                                 None, None))
        if not rows:
            return None
        # The images' partition (the hour and the root's bucket) and each of the root's names: one unlogged
        # batch, one request.
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for kind, object_id, dc, rank, table_name, row_json, write_times, blob_key, copy_key in rows:
            batch.add(self.insert, (hour, bucket, root_kind, root_id, kind, object_id, dc or "", from_epoch_ms(kept_at),
                                    rule, rank, table_name, row_json, write_times, blob_key, copy_key, self.ttl_s))
        for name in sorted(names_of(root_kind, root_id, named, self.naming)):
            written = (name, kept_at - kept_at % HOUR_MS, bucket, root_kind, root_id)
            if written in self._named:
                continue
            self._named[written] = None
            if len(self._named) > NAMES_WRITTEN:
                self._named.popitem(last=False)
            batch.add(self.insert_name, (name, hour.date(), hour, bucket, root_kind, root_id, self.ttl_s))
        self.session.execute(batch)
        return None

    def _read(self, tables: Tables, image: RowImage) -> tuple[Any, str, list[str]]:
        """The read of a row's image: every column as JSON with the write time of each regular one that has one
        (those columns, in the order of their aliases). Prepared once per policy's tables and table."""
        cached = (id(tables), image.table)
        if cached not in self._reads:
            table_name = tables.qualified[image.table]
            keyspace, table = table_name.split(".", 1)
            metadata = self.session.cluster.metadata.keyspaces[keyspace].tables[table]
            keys = {column.name for column in metadata.primary_key}
            timed = [name for name, column in metadata.columns.items()
                     if name not in keys and not _is_collection(column.cql_type)]
            selected = [f'"{name}"' for name in metadata.columns] + [
                f'writetime("{name}") AS {_WRITETIME}{number}' for number, name in enumerate(timed)]
            where = " AND ".join(f'"{column}" = ?' for column, _ in image.key)
            self._reads[cached] = (tables.prepare(f"SELECT JSON {', '.join(selected)} FROM {{{image.table}}} "
                                                  f"WHERE {where}"), table_name, timed)
        return self._reads[cached]


# The write times' aliases: plain identifiers (a name to quote would come back quoted in the JSON), numbered.
_WRITETIME = "purger_writetime_"


def _is_collection(cql_type: str) -> bool:
    # writetime() takes no collection that is not frozen, nor a counter.
    return cql_type.startswith(("list<", "set<", "map<")) or cql_type == "counter"


def _split(selected: dict[str, Any], timed: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A row's JSON as read with its write times: the row, and the write time of each column (microseconds)."""
    times = {f"{_WRITETIME}{number}": name for number, name in enumerate(timed)}
    row = {name: value for name, value in selected.items() if name not in times}
    return row, {times[alias]: value for alias, value in selected.items() if alias in times and value is not None}


def _tables(config: PurgerConfig) -> tuple[str, str]:
    """The restorations table and its names' table, keyspace-qualified."""
    keyspace = config.cassandra.keyspace
    return (f"{keyspace}.{config.cassandra.restorations_table}",
            f"{keyspace}.{config.cassandra.restoration_names_table}")


def subject_naming(config: PurgerConfig) -> dict[str, list[tuple[str, str]]]:
    """The columns whose value names a data subject or an object one is found through, per table (keyspace.table):
    each enabled policy's ``subjects`` (a message's mailbox, a rule event's message, a user's id)."""
    naming: dict[str, list[tuple[str, str]]] = {}
    for policy in config.policy_set.policies:
        names = policy.table_names()
        for rows in policy.subjects:
            naming.setdefault(f"{config.cassandra.keyspace}.{names[rows.table]}", []).append(
                (rows.subject_column, rows.through or rows.subject))
    return naming


def erasure_naming(config: PurgerConfig) -> dict[str, list[tuple[str, str]]]:
    """``subject_naming``, and what an erasure takes with an object (each policy's ``follows``: a message's
    payload)."""
    naming = subject_naming(config)
    for policy in config.policy_set.policies:
        names = policy.table_names()
        for follows in policy.follows:
            naming.setdefault(f"{config.cassandra.keyspace}.{names[follows.table]}", []).append(
                (follows.column, follows.kind))
    return naming


class ImagesNotRemoved(Exception):
    """A copy a store failed to delete: one line naming it."""


def erase_images(session: Any, config: PurgerConfig, subject: str, objects: list[tuple[str, str]]) -> SubjectImages:
    """A data subject's images removed from the undo window (``purger erase``): those found from its name and its
    objects' (``core.restorations.subject_images``; each name's days in the window, a partition each), but those
    a hold keeps (on the root, or on the subject);
    copies first, then rows, then their names, so that a run cut short leaves each image it did not remove
    findable by the next."""
    from cassandra.concurrent import execute_concurrent_with_args

    from purger.sinks.holds import CassandraHolds
    from purger.sinks.objects import ObjectStores

    name, names = _tables(config)
    keyspace, names_table = names.split(".", 1)
    window_days = config.undo.window_days
    if window_days is None or names_table not in session.cluster.metadata.keyspaces[keyspace].tables:
        return SubjectImages()  # no undo window (or `purger setup` not run since it was set): no image kept
    located = session.prepare(f"SELECT hour, bucket, root_kind, root_id FROM {names} WHERE name = ? AND day = ?")
    today = from_epoch_ms(now_ms()).date()
    days = [today - timedelta(days=back) for back in range(window_days + 1)]

    def found_at(found_by: list[str]) -> dict[str, list[Root]]:
        asked = [(each, day) for each in found_by for day in days]
        reads = execute_concurrent_with_args(session, located, asked, concurrency=ERASE_CONCURRENCY,
                                             raise_on_first_error=True)
        roots: dict[str, list[Root]] = {each: [] for each in found_by}
        for (each, _), read in zip(asked, reads):
            roots[each] += [Root(epoch_ms(row.hour), row.bucket, row.root_kind, row.root_id)
                            for row in read.result_or_exc]
        return roots

    where = "hour = ? AND bucket = ? AND root_kind = ? AND root_id = ?"
    under = session.prepare(f"SELECT {', '.join(_FIELDS)} FROM {name} WHERE {where}")

    def kept_under(roots: list[Root]) -> dict[Root, list[Kept]]:
        reads = execute_concurrent_with_args(session, under, [_where(root) for root in roots],
                                             concurrency=ERASE_CONCURRENCY, raise_on_first_error=True)
        return {root: [_kept(row) for row in read.result_or_exc] for root, read in zip(roots, reads)}

    holds = CassandraHolds.of(session, config.cassandra)
    with ThreadPoolExecutor(ERASE_CONCURRENCY) as pool:

        def held(keys: list[tuple[str, str]]) -> dict[tuple[str, str], str | None]:
            holding = pool.map(lambda key: holds.held([f"{key[0]}:{key[1]}", subject]), keys)
            return {key: None if hold is None else hold.why() for key, hold in zip(keys, holding)}

        found = subject_images([subject, *(f"{kind}:{object_id}" for kind, object_id in objects)], found_at,
                               kept_under, erasure_naming(config), held)
        stores = ObjectStores(config.stores).for_threads()
        copies = [image for images in found.removable.values() for image in images
                  if image.copy_key is not None and image.dc is not None]
        for image, error in zip(copies, pool.map(lambda image: stores.delete(image.copy_key, [image.dc])[image.dc],
                                                 copies)):
            if isinstance(error, str):
                raise ImagesNotRemoved(f"the undo copy {image.copy_key} in {image.dc}'s bucket "
                                       f"{config.stores[image.dc].bucket}: {error}")
    naming = subject_naming(config)
    remove = session.prepare(f"DELETE FROM {name} WHERE {where}")
    execute_concurrent_with_args(session, remove, [_where(root) for root in found.removable],
                                 concurrency=ERASE_CONCURRENCY, raise_on_first_error=True)
    unname = session.prepare(f"DELETE FROM {names} WHERE name = ? AND day = ? AND {where}")
    execute_concurrent_with_args(
        session, unname, [(found_by, from_epoch_ms(root.hour_ms).date(), *_where(root))
                          for root, images in found.removable.items()
                          for found_by in sorted(names_of(root.kind, root.id, rows_of(images), naming))],
        concurrency=ERASE_CONCURRENCY, raise_on_first_error=True)
    return found


def _where(root: Root) -> tuple[Any, ...]:
    return from_epoch_ms(root.hour_ms), root.bucket, root.kind, root.id


def _kept(row: Any) -> Kept:
    return Kept(row.root_kind, row.root_id, row.rule, row.kind, row.id, row.dc or None, epoch_ms(row.kept_at),
                row.rank, row.table_name, row.row_json, row.write_times, row.blob_key, row.copy_key)


def read_images(session: Any, config: PurgerConfig, since_ms: int, until_ms: int) -> Iterator[Kept]:
    """Every image kept from ``since_ms`` to ``until_ms``: each hour's partitions, every bucket."""
    from cassandra.concurrent import execute_concurrent_with_args

    select = session.prepare(f"SELECT {', '.join(_FIELDS)} FROM {_tables(config)[0]} WHERE hour = ? AND bucket = ?")
    partitions = [(from_epoch_ms(hour_ms), bucket) for hour_ms in range(since_ms - since_ms % HOUR_MS, until_ms + 1,
                                                                        HOUR_MS) for bucket in range(BUCKETS)]
    # A partition a request, many in flight: a week is 10,752 of them.
    for read in execute_concurrent_with_args(session, select, partitions, concurrency=64, raise_on_first_error=True,
                                             results_generator=True):
        for row in read.result_or_exc:
            image = _kept(row)
            if since_ms <= image.kept_at_ms <= until_ms:
                yield image

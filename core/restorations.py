"""The undo window (docs/operations.md, "Undo"; SPEC 11.2): with ``undo.window`` set, every deletion keeps what it
deleted restorable for that long. Before the purge protocol claims a row (or, for a kind that deletes first,
deletes it), the row's image goes aside; before its dependents and followers go, theirs do: a row's image is the
whole row as Cassandra returns it (``SELECT JSON *``) with its cells' write times, a blob's is a copy in its own
bucket under ``undo.prefix``. Each image is named as the ledger names the deletion it precedes (kind, id, data
centre), so `purger restore` finds the image of each ``purged`` record: the last one kept at or before it.

A policy says what to keep of each object: ``ObjectPurge.image`` for its row, ``Dependent.image`` for each
dependent and follower. The engine's ``Aside`` is ``purger.sinks.restorations.CassandraRestorations``.

Example::

    RowImage("messages", (("message_id", "m1"),))        # the row of {messages} keyed m1
    BlobImage("dc1", "payloads/p1")                        # the blob in dc1's bucket
    latest_images(images, deleted)                          # each deletion's image, or None: past the window
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from purger.core.handles import Tables

__all__ = ["BLOB", "DEPENDENT", "FOLLOWER", "ROW", "Aside", "BlobImage", "Kept", "Root", "RowImage", "SubjectImages",
           "latest_images", "names_of", "restore_order", "subject_images"]


@dataclass(frozen=True)
class RowImage:
    """A row to keep aside before it is deleted: its table, by the policy's reference name, and its primary key as
    (column, value) pairs."""

    table: str
    key: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class BlobImage:
    """A blob to copy aside before it is deleted: its data centre and key in that data centre's bucket."""

    dc: str
    key: str


Image = RowImage | BlobImage


@dataclass(frozen=True)
class Kept:
    """An image kept aside, as the restorations table holds it: the deletion it precedes as the ledger names it
    (``kind``, ``id``, ``dc``: None for a row), the object whose purge kept it (``root_kind``, ``root_id``, under
    ``rule``), when (``kept_at_ms``), and what to put back: a row's ``table`` (keyspace.table), its ``row``
    (``SELECT JSON *``) and ``write_times`` (JSON, column -> microseconds), or a blob's ``copy_key`` in the
    bucket of ``dc`` and its own ``blob_key``."""

    root_kind: str
    root_id: str
    rule: str
    kind: str
    id: str
    dc: str | None
    kept_at_ms: int
    rank: int  # BLOB, FOLLOWER, ROW or DEPENDENT
    table: str | None = None
    row: str | None = None
    write_times: str | None = None
    blob_key: str | None = None
    copy_key: str | None = None


class Aside(ABC):
    """Where the purge protocol keeps its images (``purger.core.purge_protocol.ObjectPurge``)."""

    @abstractmethod
    def keep(self, tables: Tables, root_kind: str, root_id: str, rule: str,
             images: list[tuple[str, str, str | None, Image, int]]) -> str | None:
        """Keep each (kind, id, dc, image, rank) aside, read through ``tables`` (the policy's); None once all are kept,
        else the error of the store whose copy failed: the protocol then fails that blob's delete with it, and looks
        at the object again as when a store fails to delete. A table that fails raises."""


def latest_images(images: Iterable[Kept], deletions: Iterable[tuple[str, str, str | None, int]]
                  ) -> dict[tuple[str, str, str | None, int], Kept | None]:
    """For each deletion (kind, id, dc, deleted_at_ms) of the ledger, the image kept last at or before it, or None
    (kept before the window began, or never). An image kept by a purge whose claim or delete did not apply is
    followed by the one of the purge that deleted it, which is later."""
    by_object: dict[tuple[str, str, str | None], list[Kept]] = {}
    for image in images:
        by_object.setdefault((image.kind, image.id, image.dc), []).append(image)
    for kept in by_object.values():
        kept.sort(key=lambda image: image.kept_at_ms)
    found: dict[tuple[str, str, str | None, int], Kept | None] = {}
    for kind, object_id, dc, deleted_at_ms in deletions:
        earlier = [image for image in by_object.get((kind, object_id, dc), ()) if image.kept_at_ms <= deleted_at_ms]
        found[kind, object_id, dc, deleted_at_ms] = earlier[-1] if earlier else None
    return found


# Where an image goes in a restore's order (``Kept.rank``), the reverse of the deletions' but blobs first: a
# blob before the row that names it; what follows an object (a message's reference to its payload) before its
# row, so the payload is never without a referrer; then the object's row, then the rows that lead from it (a
# user's root and permissions), as the writers of the contracts add them.
BLOB, FOLLOWER, ROW, DEPENDENT = 0, 1, 2, 3


def restore_order(images: Iterable[Kept]) -> list[Kept]:
    """The images in the order to put them back: by rank, then as they were kept."""
    return sorted(images, key=lambda image: (image.rank, image.kept_at_ms))


# The names (``KIND:ID``) an erasure finds images by (``purger erase``, docs/operations.md "Undo"): per table
# (keyspace.table), the columns of its images whose value is the id of an object of a kind (a message's
# ``mailbox``, a rule event's ``message_id``).
Naming = Mapping[str, Sequence[tuple[str, str]]]


def names_of(root_kind: str, root_id: str, rows: Iterable[tuple[str, Mapping[str, Any]]], naming: Naming) -> set[str]:
    """The names a root's images are found by: its own, and each that its rows (table, row) name by ``naming``."""
    names = {f"{root_kind}:{root_id}"}
    for table, row in rows:
        names.update(f"{kind}:{row[column]}" for column, kind in naming.get(table, ()) if row.get(column) is not None)
    return names


def rows_of(images: Iterable[Kept]) -> list[tuple[str, dict[str, Any]]]:
    """The rows among ``images``, as (table, row)."""
    return [(image.table, json.loads(image.row)) for image in images if image.table is not None and image.row]


@dataclass(frozen=True)
class Root:
    """Where the images a purge kept are: the hour and bucket of their partition, and the object whose purge it was."""

    hour_ms: int
    bucket: int
    kind: str
    id: str


@dataclass
class SubjectImages:
    """A data subject's images: those to remove, by where they are, and the roots a hold keeps (kind, id, why)."""

    removable: dict[Root, list[Kept]] = field(default_factory=dict)
    kept: list[tuple[str, str, str]] = field(default_factory=list)


def subject_images(names: Iterable[str], located: Callable[[list[str]], dict[str, list[Root]]],
                   kept_under: Callable[[list[Root]], dict[Root, list[Kept]]], naming: Naming,
                   held: Callable[[list[tuple[str, str]]], dict[tuple[str, str], str | None]]) -> SubjectImages:
    """Every image of a data subject, from the names it starts at (the subject's, and its objects' there now):
    the roots each name is found at (``located``), their images (``kept_under``), then the names a root's own and
    its rows give (``naming``: the subjects' columns, and what an erasure takes with an object, a message's
    payload) until no name is new. A root under a hold (``held``: why, else None) is kept with its images, and
    what its rows name is not followed: what it refers to is kept with it, as a held message keeps its payload;
    what names it is (its rule events), as the erasure of a held message's rule events. Each callable is asked
    for a whole wave of names or roots at once, so that the reads behind it go concurrently."""
    found = SubjectImages()
    seen: set[str] = set()
    holds: dict[tuple[str, str], str | None] = {}
    wave = set(names)
    while wave:
        seen |= wave
        roots = sorted({root for found_at in located(sorted(wave)).values() for root in found_at}, key=_root_order)
        asked = sorted({(root.kind, root.id) for root in roots} - holds.keys())
        for key, why in held(asked).items():
            holds[key] = why
            if why is not None:
                found.kept.append((*key, why))
        following: set[str] = {f"{root.kind}:{root.id}" for root in roots if holds[(root.kind, root.id)] is not None}
        fresh = [root for root in roots if holds[(root.kind, root.id)] is None and root not in found.removable]
        for root, images in kept_under(fresh).items():
            found.removable[root] = images
            following |= names_of(root.kind, root.id, rows_of(images), naming)
        wave = following - seen
    return found


def _root_order(root: Root) -> tuple[int, int, str, str]:
    return root.hour_ms, root.bucket, root.kind, root.id

"""Erasure on request (SPEC 11.3; docs/operations.md, "Erasure on request"): every object of a data subject
(``KIND:ID``: a mailbox, a user) purged now, whatever its retention, through the one purge protocol, and a
certificate of what went and what was kept. Plain Python.

A policy says where its objects of a subject are (``Policy.subjects``: ``SubjectRows``, the rows of one of its
tables whose column names the subject). ``purger erase`` finds them, asks the running stream to look at each
again under the request's rule (``erasure_rule``: a recheck on the control topic, which wins over any other
pending recheck of the object), and the sink purges each candidate under that rule as under any other: read,
holds, claim, dependents, conditional delete, ledger. Under an erasure rule the object is due at once
(``ObjectPurge.erasable`` says what still keeps it: a payload another message refers to), a hold still wins,
and what is kept under a hold is erased at its release. Every ledger record of the request carries its rule
(``erasure:<request>``), so ``certificate`` reads the request's whole effect, over every run of it, from the
ledger.

Example::

    rule = erasure_rule("7f3a9c21")                  # 'erasure:7f3a9c21'
    is_erasure(rule), request_of(rule)                # (True, '7f3a9c21')
    certificate("mailbox:alice", "7f3a9c21", [("message", "m1")], records)
    # Certificate(deleted=[...], kept=[...], gone=[], pending=[])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from purger.core.vocabulary import ALREADY_GONE, HELD, PURGED, SKIPPED, category

__all__ = ["ERASURE", "Certificate", "CertificateEntry", "Follows", "SubjectRows", "certificate", "erasure_rule", "is_erasure",
           "request_of"]

ERASURE = "erasure"


def erasure_rule(request: str) -> str:
    """The rule an erasure request's candidates are purged under, and its ledger records carry."""
    return f"{ERASURE}:{request}"


def is_erasure(rule: str | None) -> bool:
    return rule is not None and rule.startswith(f"{ERASURE}:")


def request_of(rule: str) -> str | None:
    return rule.partition(":")[2] if is_erasure(rule) else None


@dataclass(frozen=True)
class SubjectRows:
    """A policy's objects of a data subject: each row of ``table`` (its reference name) whose ``subject_column``
    is the subject's id is one object of ``kind``, keyed by ``id_column``. ``subject_column == id_column``: the
    object is the subject itself (a user), read by its key; otherwise the table is scanned by token range (a
    mailbox's messages), as a reconcile scans it. ``through``: ``subject_column`` holds the ids of objects of that
    kind found for the subject instead (a rule event names its message, not its mailbox)."""

    subject: str
    table: str
    kind: str
    id_column: str
    subject_column: str
    through: str | None = None

    @property
    def by_key(self) -> bool:
        return self.subject_column == self.id_column


@dataclass(frozen=True)
class Follows:
    """What an erasure takes with an object besides its own rows, in the undo window's images too: an image of
    ``table`` (its reference name) names in ``column`` an object of ``kind`` (a message's payload) whose images go
    with it. The payload itself is taken, live, by the policy's own erasure of the message (``released``)."""

    table: str
    column: str
    kind: str


@dataclass(frozen=True)
class CertificateEntry:
    """One line of a certificate: a deletion (with its data centre, when, and its ledger record) or an object
    kept (and why)."""

    kind: str
    id: str
    policy: str | None = None
    dc: str | None = None
    at: str | None = None
    record_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Certificate:
    """What an erasure request did, from its ledger records: ``deleted`` (every deletion under its rule: the
    objects, their dependents and what followed them), ``kept`` (under a hold, with the hold: its release erases
    them; or what followed an object and its row keeps, with why: a payload another message refers to), ``gone``
    (removed by another writer before the erasure reached them), and ``pending``: objects asked for with no such
    decision yet."""

    subject: str
    request: str
    deleted: list[CertificateEntry] = field(default_factory=list)
    kept: list[CertificateEntry] = field(default_factory=list)
    gone: list[CertificateEntry] = field(default_factory=list)
    pending: list[tuple[str, str]] = field(default_factory=list)
    # The undo window's images of the subject this run removed (rows and blob copies), and the objects whose
    # images a hold keeps (docs/operations.md, "Undo").
    images_removed: int = 0
    images_kept: list[CertificateEntry] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.pending


def _settles(record: dict[str, Any]) -> bool:
    """Whether a decision settles an object asked for: deleted, found gone, or kept under a hold. A skip for any
    other reason (a claim lost to a writer, another attempt at work) or an error is looked at again."""
    return record["status"] in (PURGED, ALREADY_GONE) or (
        record["status"] == SKIPPED and category(record["reason"] or "") == HELD)


def certificate(subject: str, request: str, asked: Iterable[tuple[str, str]], records: Iterable[dict[str, Any]]
                ) -> Certificate:
    """The certificate of ``request`` on ``subject``: ``asked``, the (kind, id) of every object the request
    named (over all its runs); ``records``, the ledger's records under the request's rule (``policy``, ``kind``,
    ``id``, ``dc``, ``status``, ``reason``, ``deleted_at``, ``decided_at``, ``record_id``), in any order. An object
    asked for that has a deletion is deleted (one held, then released and erased; one found gone by a retry after
    its deletion); any other is what its last settling decision says. One not asked for that followed (a
    payload) and was last skipped, with no deletion, is kept, with the skip's reason."""
    in_order = sorted(records, key=lambda r: (str(r["decided_at"]), r["record_id"] or ""))
    deleted: dict[tuple[str, str, str | None], CertificateEntry] = {}
    settled: dict[tuple[str, str], dict[str, Any]] = {}
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for record in in_order:
        key = (record["kind"], record["id"])
        if record["status"] == PURGED:
            deleted.setdefault((*key, record["dc"]), CertificateEntry(
                record["kind"], record["id"], record["policy"], record["dc"], str(record["deleted_at"]),
                record["record_id"]))
        if _settles(record):
            settled[key] = record
        last[key] = record
    went = {key[:2] for key in deleted}
    asked = set(asked)

    def entry(key: tuple[str, str], record: dict[str, Any]) -> CertificateEntry:
        return CertificateEntry(*key, record["policy"], record["dc"], str(record["decided_at"]), record["record_id"],
                                record["reason"])

    kept, gone, pending = [], [], []
    for key in sorted(asked):
        record = settled.get(key)
        if record is None:
            pending.append(key)
        elif key not in went:
            (gone if record["status"] == ALREADY_GONE else kept).append(entry(key, record))
    kept += [entry(key, record) for key, record in sorted(last.items())
             if key not in asked and key not in went and record["status"] == SKIPPED]
    return Certificate(subject, request, sorted(deleted.values(), key=lambda e: (e.kind, e.id, e.dc or "")),
                       kept, gone, pending)

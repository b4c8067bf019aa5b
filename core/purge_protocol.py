"""The delete-time half of a policy: a ``Purge`` per kind, built on each executor from the shared
``Resources`` (``purger.core.handles``): an ``ObjectPurge``, whose protocol the engine owns (read, due?, dry
run, claim, journalled dependents, delete, rechecks, earlier attempts) and whose steps the policy fills in
through its typed handle on its tables (``Tables``), one ``Outcome`` per decision on a ``Candidate`` the
stream found due. A policy of one's own imports these from ``purger.core.policy``; the sink runs them
(``purger.sinks.purge``).

Example::

    purge = policy.purges(resources)["push_client"]
    candidate = Candidate("push_client", "c1", "inactive", eligible_at_ms)
    list(purge.purge(candidate, Attempt(batch="q/7")))   # [Outcome(status='purged', ...), ...]
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from functools import partial
import json
from typing import Any, Callable, ClassVar, Generator, Generic, Iterable, Iterator, TypeVar

from purger.core.erasure import is_erasure
from purger.core.events import Eligibility, Rule
from purger.core.failpoints import failpoint
from purger.core.handles import Resources, Tables
from purger.core.holds import Hold
from purger.core.restorations import BLOB, DEPENDENT, FOLLOWER, ROW, BlobImage, RowImage
from purger.core.times import now_ms
from purger.core.vocabulary import (
    ALREADY_GONE, BEING_DELETED, EARLIER_ATTEMPT, ERROR, HELD, PURGED, REMOVED_MEANWHILE, SKIPPED, WOULD_DELETE, reason,
)

__all__ = [
    "SELF", "Attempt", "Candidate", "Deleted", "Dependent", "Kept", "ObjectPurge", "Outcome", "Purge", "RuleWrite",
    "key_id",
    "recorded_from_intent",
]


class RuleWrite:
    """A rule's conditional write of a row (a ``DELETE``, a claim): ``cql`` up to its ``IF``, then the rule's
    ``condition``, or its ``undated`` one for a row read without the timestamp the condition compares."""

    def __init__(self, tables: Tables, cql: str, rule: Rule[Any]) -> None:
        self.tables, self.rule = tables, rule
        self.by_condition = tables.prepare(f"{cql} {rule.condition}")
        self.by_undated = tables.prepare(f"{cql} {rule.undated}") if rule.undated else None

    def applied(self, key: tuple[Any, ...], dated: bool, eligible_at_ms: int | None) -> bool:
        """Whether the write applied to the row keyed by ``key``; ``dated``: the row read has the timestamp;
        ``eligible_at_ms``: when the rule makes the row read due."""
        if dated or self.by_undated is None:
            return self.tables.applied(self.by_condition, *key, self.rule.cutoff())
        # Dated by its cells' write time, which no condition can compare: the rule's period is checked on the row
        # read, and the write applies only to the row as read (a platform write in between sets the timestamp).
        return (eligible_at_ms is not None and eligible_at_ms <= now_ms()
                and self.tables.applied(self.by_undated, *key))


@dataclass(frozen=True)
class Candidate:
    """An object the stream found due: what the sink hands to the policy's purge."""

    kind: str
    id: str
    rule: str
    eligible_at_ms: int
    hint: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """One decision of the sink: a deletion (``purged``) or why not. ``kind`` and ``id`` default to the
    candidate's; a dependent deleted with it (a blob, a child row) names its own."""

    status: str
    reason: str | None = None
    dc: str | None = None
    deleted_at_ms: int | None = None
    kind: str | None = None
    id: str | None = None
    # A deletion recorded from an intent (``Journal``): the batch that meant to delete it, so the record is
    # the same whichever attempt or batch writes it, and the ledger keeps one. None: this attempt deleted it.
    intent: str | None = None
    # False: counted, not written to the ledger (an error after the object's first today, ``Failures``).
    recorded: bool = True


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """The run of a batch a candidate is purged in."""

    # The batch, the same in each of its attempts: ``<query id>/<batch id>``; what its intents name.
    batch: str = ""


@dataclass(frozen=True)
class Deleted:
    """A delete done, and how, in the words its ledger record gives as its reason: a blob in a bucket that keeps
    versions (``purger.sinks.objects``). What a ``Dependent``'s delete returns beside None (done), and an
    ``ObjectPurge.delete`` beside True (applied)."""

    reason: str


@dataclass(frozen=True)
class Dependent:
    """Something that leads from an object and goes before it (a child row, a blob in one data centre):
    its kind, id and data centre as the ledger names them, and its delete, which returns None (or ``Deleted``,
    saying how) once done, or the error of a store that failed (raising is for Cassandra: the whole candidate is
    retried)."""

    kind: str
    id: str
    delete: Callable[[], "str | Deleted | None"]
    dc: str | None = None
    # Whether it is still there, for what another writer's removal of the row may have left (``leftovers``); None:
    # the purger leaves that to reconciliation's orphan sweeps, which record what they delete.
    present: Callable[[], bool] | None = None
    # What the undo window keeps of it before it goes (``purger.core.restorations``): its row or its blob.
    image: "RowImage | BlobImage | None" = None

    @property
    def key(self) -> str:
        """How the journal keeps it."""
        return json.dumps([self.kind, self.id, self.dc])


@dataclass(frozen=True)
class Kept:
    """Why the row keeps the object now, and when it is worth looking again: ``recheck`` is the rule and the
    wall-clock moment (None: not by the purger; an event will bring the object back)."""

    reason: str
    recheck: Eligibility | None = None


class Purge(ABC):
    """A kind's delete-time half, one per executor process: double-check a candidate against its row and
    delete it, dependents first, yielding one ``Outcome`` per decision. Policies build theirs on
    ``ObjectPurge``, which runs the engine's one protocol."""

    @abstractmethod
    def purge(self, candidate: Candidate, attempt: Attempt) -> Iterator[Outcome]:
        """Double-check the candidate against its row and delete it, dependents first; yield outcomes."""


R = TypeVar("R")


class ObjectPurge(Purge, Generic[R]):
    """The purge protocol, once for every policy; a policy fills in the steps for one kind of object.

    For a candidate, the engine:

    1. reads the row (``read``) at the configured consistency: a decision not to delete (gone, kept, a dry
       run's) deletes nothing, so it costs no Paxos round. A row that carries a claim is read again
       serially, since the deletes that follow rest on that claim. Gone: with the purger's intent to delete
       it in the journal (``Journal``), the purger deleted it: ``purged`` from the intent, for the row and
       the dependents it names (what may be left of them, ``leftovers``, deleted again first); without
       one, ``already_gone`` (another writer removed it), and the leftovers that say they are there deleted
       and recorded as this attempt's.
    2. Not claimed yet (``claimed``): asks the row when it is due (``due``, the policy's rules applied to
       the row). Not due now: ``skipped`` with the policy's reason (``why_kept``) and, unless a dry run, a
       recheck when it will be (no sooner than ``stream.retry_interval`` under the candidate's own rule:
       the stream found it due, so the clocks differ a little). Under an erasure's rule (``purger.core.erasure``)
       it is due now unless the row still keeps it (``erasable``). Due, or claimed: a hold over any of its ``scopes``
       (``purger.core.holds``, read at QUORUM) wins: ``skipped`` with reason ``held``, nothing
       claimed or deleted, and the candidate kept under the hold, for its release to look at it again. A dry
       run stops here: ``would_delete`` for
       each dependent and the object, and no recheck. Then the claim (``claim``, a lightweight
       transaction conditioned on the rule or on what was read, so a stale read only makes it fail); lost
       to a writer: ``skipped`` and a recheck.
    3. Claimed (now, or by an attempt that crashed; a dry run leaves it to the real run): the intent to
       delete the dependents (``dependents``) and the row is journalled, then the dependents are deleted in
       order, each one's outcome recorded; a store that failed leaves the row for a recheck, backed off from
       ``stream.retry_interval`` to ``stream.retry_cap`` as its failures go on, its error recorded once a
       day. Then the row (``delete``, a lightweight transaction: the one step that deletes it). Not applied: the row, read again, says why (gone: another writer removed it; changed
       since it was read), and the intent no longer names it.
    4. After the row: what goes after it (``followers``, named in the intent with the row), each one's outcome
       recorded; then, whoever deleted the row, ``released`` (e.g. a message's payload, once nothing refers
       to it).

    A kind with no dependents and a rule that one conditional ``DELETE`` checks sets ``deletes_first``: that
    delete is its claim, so a due row is deleted at once.

    Example::

        class RouterPurge(ObjectPurge[Row]):
            def read(self, candidate, serial=False):
                return self.tables.one(self.read_router, candidate.id, serial=serial)
            def claimed(self, row): return bool(row.purging)
            def due(self, candidate, row): return Eligibility(INACTIVE, epoch_ms(row.last_connected_at) + period)
            def why_kept(self, candidate, row, due): return reason(NOT_YET_DUE, f"inactive at {due.eligible_at_ms}")
            def claim(self, candidate, row): ...
            def dependents(self, candidate, row): ...
            def delete(self, candidate, row): return self.tables.applied(self.delete_router, candidate.id)
    """

    deletes_first: ClassVar[bool] = False

    def __init__(self, resources: Resources, tables: dict[str, str]) -> None:
        self.resources = resources
        self.tables = resources.tables(tables)

    # --- the steps a policy fills in ---

    @abstractmethod
    def read(self, candidate: Candidate, serial: bool = False) -> R | None:
        """The object's row, None when it is gone: at the configured consistency, or at the serial one
        when ``serial`` (``Tables.one(..., serial=serial)``)."""

    def claimed(self, row: R) -> bool:
        """Whether the row carries a purge's claim (this one's, or an attempt's that crashed)."""
        return False

    @abstractmethod
    def due(self, candidate: Candidate, row: R) -> Eligibility | None:
        """When the row makes the object eligible, in wall-clock time, and under which rule: the policy's
        rules applied to the row. None: the row keeps it until an event says otherwise."""

    @abstractmethod
    def why_kept(self, candidate: Candidate, row: R, due: Eligibility | None) -> str:
        """The reason (``category: details``) the row keeps the object: ``due`` is in the future or None."""

    def erasable(self, candidate: Candidate, row: R) -> Kept | None:
        """Under an erasure's rule (``purger.core.erasure``), in place of ``due``: why the row still keeps the
        object whatever its subject asked (a payload another message refers to; one linked within its grace, with a
        recheck under the erasure's rule when that ends), else None: due now. The claim and the delete under that
        rule condition on the row being there (and unclaimed), not on a retention."""
        return None

    def claim(self, candidate: Candidate, row: R) -> R | Kept:
        """Claim the row for this purge, a lightweight transaction conditioned on what ``read`` saw: the row
        as the claim left it once it applied, else why the object is kept (a writer got in between) and when
        to look again."""
        return row

    def dependents(self, candidate: Candidate, row: R) -> list[Dependent]:
        """What goes before the row, in the order of deletion."""
        return []

    def keep_progress(self, candidate: Candidate, row: R, went: list[Dependent]) -> None:
        """A store failed: keep in the row which of ``dependents`` went, so that the recheck lists only those left
        (and takes those that went from the intent rather than deleting and recording them again). Only for
        dependents listed from the row, which ``dependents`` would still name once gone (a blob in each data
        centre of the row's list): one write when a store fails, none when all go. Default: nothing (a child row
        gone is not listed)."""

    @abstractmethod
    def delete(self, candidate: Candidate, row: R) -> bool | Deleted:
        """The row's conditional delete: on its claim, or (``deletes_first``) on the candidate's rule; whether
        it applied (``Deleted``: it did, and how)."""

    def followers(self, candidate: Candidate, row: R) -> list[Dependent]:
        """What goes after the row, once it is deleted (a link that must last as long as the row does: a message's
        reference to its payload), read before the row's delete so that only what is there is named; journalled
        in the row's intent, deleted and recorded as dependents are. For a ``deletes_first`` kind: an attempt
        that claimed the row and crashed before its delete would take a follower gone since for its own."""
        return []

    def leftovers(self, candidate: Candidate) -> list[Dependent]:
        """What may be left of an object whose row is gone, deleted again (idempotently) before the intent's
        records: a dependent of ``dependents`` or a follower, by its ``Dependent.key``, that can be deleted without
        the row. Without the purger's intent, those whose ``present`` says they are there are deleted and
        recorded as this attempt's."""
        return []

    def released(self, candidate: Candidate, row: R | None) -> None:
        """What follows the row's going, whoever deleted it (``row``: as read before, if it was)."""

    def scopes(self, candidate: Candidate, row: R) -> list[str]:
        """The hold scopes (``KIND:ID``, ``purger.core.holds``) the object falls under, read from its row before
        anything of it is claimed or deleted: by default its own (``message:m1``); a message adds its mailbox's.
        None at all: no hold can name it (a payload, kept by the messages that refer to it)."""
        return [f"{candidate.kind}:{candidate.id}"]

    def image(self, candidate: Candidate) -> RowImage | None:
        """The object's own row as the undo window keeps it (``purger.core.restorations``): its table and key. None
        (the default): nothing of it is kept, and `purger restore` cannot put it back."""
        return None

    def journalled_as(self, candidate: Candidate) -> tuple[str, str]:
        """The (kind, id) its intent is kept under in the journal: the candidate's, unless another purge could
        meet the same pair (an orphan blob of a data centre, beside its payload's own purge)."""
        return candidate.kind, candidate.id

    # --- the protocol ---

    def purge(self, candidate: Candidate, attempt: Attempt) -> Iterator[Outcome]:
        dry_run = self.resources.dry_run
        row = self.read(candidate)
        if row is not None and self.claimed(row) and not dry_run:
            row = self.read(candidate, serial=True)
        if row is None:
            yield from self._gone(candidate)
            return
        claimed_before = self.claimed(row)
        if claimed_before and dry_run:
            yield Outcome(SKIPPED, reason(BEING_DELETED, "by a real run"))
            return
        if not claimed_before and is_erasure(candidate.rule):
            due = Eligibility(candidate.rule, now_ms())
            kept = self.erasable(candidate, row)
            if kept is not None:
                yield self._kept(candidate, kept)
                return
        elif not claimed_before:
            due = self.due(candidate, row)
            if due is None or due.eligible_at_ms > now_ms():
                yield self._kept(candidate, Kept(self.why_kept(candidate, row, due), due))
                return
        hold = self.resources.holds.held(self.scopes(candidate, row))
        if hold is not None:
            yield self._held(candidate, hold)
            return
        if dry_run:
            yield from (Outcome(WOULD_DELETE, kind=d.kind, id=d.id, dc=d.dc)
                        for d in self.dependents(candidate, row))
            yield Outcome(WOULD_DELETE, self._would_delete_reason(candidate, row, due))
            yield from (Outcome(WOULD_DELETE, kind=d.kind, id=d.id, dc=d.dc)
                        for d in self.followers(candidate, row))
            return
        if not claimed_before:
            # Its row as the double-check read it, before a claim changes it (a crashed attempt's kept it then).
            self._aside(candidate, [(candidate.kind, candidate.id, None, self.image(candidate), ROW)])
        if not claimed_before and not self.deletes_first:
            failpoint(f"before_{candidate.kind}_claim")
            claimed = self.claim(candidate, row)
            if isinstance(claimed, Kept):
                yield self._kept(candidate, claimed)
                return
            row = claimed
        found = self.dependents(candidate, row)
        following = self.followers(candidate, row)
        self._aside(candidate, [(d.kind, d.id, d.dc, d.image, role)
                                for role, listed in ((DEPENDENT, found), (FOLLOWER, following)) for d in listed
                                if isinstance(d.image, RowImage)])
        found, following = self._copied_first(candidate, found), self._copied_first(candidate, following)
        intent = yield from self._intend(candidate, found + following, claimed_before, attempt)
        # What an earlier attempt named may be gone already and listed still (its row's progress is kept only when
        # a store fails, not when the row's own delete does): deleted again, it is recorded under that attempt's
        # batch, the same record as the one that attempt wrote, if it did.
        meant = {key: batch for key, batch in intent.items() if key != SELF and batch != attempt.batch}
        went = yield from self._deleted_all(candidate, found, meant)
        if len(went) < len(found):
            if went:
                self.keep_progress(candidate, row, went)
            # What a store failed to delete, this attempt did not: the retry that deletes it records it as its own.
            failed = {d.key for d in found} - {d.key for d in went}
            self.resources.journal.intend(*self.journalled_as(candidate),
                                          {key: batch for key, batch in intent.items() if key not in failed})
            return
        failpoint(f"before_{candidate.kind}_delete")
        deleted = self._deleted(candidate, row)
        if not deleted:
            del intent[SELF]  # what gone or changed the row, it was not this delete
            self.resources.journal.intend(*self.journalled_as(candidate), intent)
            yield from self._not_deleted(candidate, row)
            return
        failpoint(f"after_{candidate.kind}_delete")
        yield Outcome(PURGED, deleted.reason if isinstance(deleted, Deleted) else None, deleted_at_ms=now_ms())
        yield from self._deleted_all(candidate, following)
        self.released(candidate, row)

    def _deleted_all(self, candidate: Candidate, found: list[Dependent], meant: dict[str, str] | None = None
                     ) -> Generator[Outcome, None, list[Dependent]]:
        """``found`` deleted in order, each one's outcome; those that went. A store that failed leaves the object
        for a recheck, backed off (``_failed``). ``meant``: by key, the earlier batch whose intent named one, under
        which it is recorded."""
        went, errors = [], []
        for number, dependent in enumerate(found):
            done = dependent.delete()
            if isinstance(done, str):
                errors.append(Outcome(ERROR, done, kind=dependent.kind, id=dependent.id, dc=dependent.dc))
                continue
            if number == 0:
                failpoint(f"after_{candidate.kind}_dependent_delete")
            went.append(dependent)
            yield Outcome(PURGED, done.reason if done else None, kind=dependent.kind, id=dependent.id,
                          dc=dependent.dc, deleted_at_ms=now_ms(), intent=(meant or {}).get(dependent.key))
        yield from self._failed(candidate, errors)
        return went

    def _aside(self, candidate: Candidate, images: list[tuple[str, str, str | None, Any, int]]) -> None:
        """With an undo window, the rows of ``images`` (those not None) kept aside before any of them goes; none
        under an erasure, which is not to be undone. A table that fails raises: the candidate is tried again."""
        aside, wanted = self.resources.aside, [entry for entry in images if entry[3] is not None]
        if aside is not None and wanted and not is_erasure(candidate.rule):
            aside.keep(self.tables, candidate.kind, candidate.id, candidate.rule, wanted)

    def _copied_first(self, candidate: Candidate, found: list[Dependent]) -> list[Dependent]:
        """With an undo window, each blob of ``found`` copied aside just before its own delete: a store that fails
        to copy fails that blob's delete alone, as a store that fails to delete does, and holds no other back."""
        aside = self.resources.aside
        if aside is None or is_erasure(candidate.rule):
            return found

        def copy_then_delete(dependent: Dependent) -> str | Deleted | None:
            error = aside.keep(self.tables, candidate.kind, candidate.id, candidate.rule,
                               [(dependent.kind, dependent.id, dependent.dc, dependent.image, BLOB)])
            return error if error is not None else dependent.delete()

        return [replace(d, delete=partial(copy_then_delete, d)) if isinstance(d.image, BlobImage) else d
                for d in found]

    def _intend(self, candidate: Candidate, found: list[Dependent], claimed_before: bool, attempt: Attempt
                ) -> Generator[Outcome, None, dict[str, str]]:
        """Keep the intent to delete ``found`` and the row, in ``attempt``'s batch, before any of them goes.
        An attempt that claimed the row before (then crashed, or a store failed) left an intent: what it
        named and is gone now, it deleted; recorded here under its batch (the ledger keeps one record of
        each) and kept in the new intent, so a crash of this attempt records them again."""
        earlier = self.resources.journal.intended(*self.journalled_as(candidate)) if claimed_before else {}
        now = {d.key for d in found}
        done = {key: batch for key, batch in earlier.items() if key != SELF and key not in now}
        yield from recorded_from_intent(done)
        intent = {**done, **{key: earlier.get(key, attempt.batch) for key in now}, SELF: attempt.batch}
        self.resources.journal.intend(*self.journalled_as(candidate), intent)
        return intent

    def _deleted(self, candidate: Candidate, row: R) -> bool | Deleted:
        """``delete``, settled: a delete that failed may have applied all the same (a timeout, a connection
        lost once it was sent). A serial read, which finishes a Paxos round left in progress, then says:
        gone, it applied; there, it did not, and its error goes on (the candidate is rechecked). A read that
        fails too leaves it unsettled: the error goes on, and the intent settles it at the recheck."""
        try:
            return self.delete(candidate, row)
        except Exception:
            failpoint(f"after_{candidate.kind}_delete_failed")
            if self.read(candidate, serial=True) is not None:
                raise
            return True

    def _not_deleted(self, candidate: Candidate, row: R) -> Iterator[Outcome]:
        """The conditional delete did not apply: the row changed since it was read. Gone: another writer
        removed it in between. A claim on it: another attempt's, still at work. Otherwise a writer changed it."""
        now = self.read(candidate)
        if now is None:
            yield Outcome(ALREADY_GONE, reason(REMOVED_MEANWHILE, "between the purger's check and its delete"))
            yield from self._deleted_all(candidate, self._left_behind(candidate))
            self.released(candidate, row)
        elif self.claimed(now):
            yield self._kept(candidate, Kept(reason(BEING_DELETED, "by another attempt"),
                                             Eligibility(candidate.rule, now_ms())))
        else:
            due = self.due(candidate, now)
            yield self._kept(candidate, Kept(self.why_kept(candidate, now, due), due))

    def _would_delete_reason(self, candidate: Candidate, row: R, due: Eligibility) -> str | None:
        """A dry run's note on ``would_delete``; a policy may add what would follow."""
        return None

    def _held(self, candidate: Candidate, hold: Hold) -> Outcome:
        """A candidate under a hold: kept under it, for its release to look at it again (not in a dry run); a hold
        released since it was read leaves the candidate for a recheck after ``retry_ms``."""
        if not self.resources.dry_run and not self.resources.holds.keep(hold, candidate.kind, candidate.id,
                                                                        candidate.rule):
            return self._kept(candidate, Kept(reason(HELD, f"{hold.scope}, released meanwhile"),
                                              Eligibility(candidate.rule, now_ms())))
        return Outcome(SKIPPED, hold.why())

    def _failed(self, candidate: Candidate, errors: list[Outcome]) -> Iterator[Outcome]:
        """Stores failed: the errors, recorded in the ledger if they are the object's first today, and a recheck
        backed off by its failures in a row (``Resources.failures``). None: nothing failed."""
        if not errors:
            return
        retry = self.resources.failures.failed(candidate.kind, candidate.id, errors[0].reason or "")
        self._recheck(candidate, Eligibility(candidate.rule, retry.at_ms))
        yield from (replace(error, recorded=retry.record) for error in errors)

    def _kept(self, candidate: Candidate, kept: Kept) -> Outcome:
        if kept.recheck is not None:
            self._recheck(candidate, kept.recheck)
        return Outcome(SKIPPED, kept.reason)

    def _recheck(self, candidate: Candidate, at: Eligibility) -> None:
        """A recheck, never in a dry run; under the candidate's own rule, no sooner than ``retry_ms``. An
        erasure's candidate is looked at again under the erasure, and soon, whatever rule the row would be due by
        and when (a policy's own recheck under the erasure keeps its time)."""
        if self.resources.dry_run:
            return
        if is_erasure(candidate.rule) and at.rule != candidate.rule:
            at = Eligibility(candidate.rule, now_ms())
        soonest = now_ms() + (self.resources.retry_ms if at.rule == candidate.rule else 0)
        self.resources.control.recheck(candidate.kind, candidate.id, at.rule, max(at.eligible_at_ms, soonest))

    def _gone(self, candidate: Candidate) -> Iterator[Outcome]:
        """The row is gone. With the purger's intent to delete it, the purger deleted it: an attempt whose
        outcomes were lost, or a batch whose records the ledger may hold (whether they say ``purged`` or, for
        a delete a timeout left unsettled, ``error``): ``purged`` from the intent, the same record either way,
        for the row and the dependents it names, deleted again first in case (``leftovers``). Without one,
        another writer removed it: ``already_gone``, and what it left (a blob without its row) is the orphan
        sweep's, which records what it deletes. Either way, what follows the row's going."""
        if self.resources.dry_run:
            yield Outcome(ALREADY_GONE)
            return
        intent = self.resources.journal.intended(*self.journalled_as(candidate))
        if SELF not in intent:
            yield Outcome(ALREADY_GONE)
            yield from self._deleted_all(candidate, self._left_behind(candidate))
            self.released(candidate, None)
            return
        again = {leftover.key: leftover for leftover in self.leftovers(candidate)}
        errors = []
        for key in sorted(intent):
            done = again[key].delete() if key in again else None
            if isinstance(done, str):
                kind, object_id, dc = json.loads(key)
                errors.append(Outcome(ERROR, done, kind=kind, id=object_id, dc=dc))
        if errors:
            yield from self._failed(candidate, errors)
            return
        yield from recorded_from_intent(intent)
        self.released(candidate, None)


    def _left_behind(self, candidate: Candidate) -> list[Dependent]:
        """What another writer's removal of the row left that the purger deletes: the ``leftovers`` that say they
        are there (``Dependent.present``)."""
        return [leftover for leftover in self.leftovers(candidate)
                if leftover.present is not None and leftover.present()]


# The object's own key in an intent (``Journal``), beside its dependents' ``Dependent.key``.
SELF = json.dumps(None)


def key_id(values: Iterable[Any]) -> str:
    """How the ledger names a row by its primary key: the value of a one-column key, else the values as a JSON
    list (a ``payload_refs`` row: ``["p1","m1"]``)."""
    found = list(values)
    return str(found[0]) if len(found) == 1 else json.dumps(found, separators=(",", ":"))


def recorded_from_intent(intent: dict[str, str]) -> Iterator[Outcome]:
    """A ``purged`` outcome per deletion an intent names, under the batch that meant it; the object itself last."""
    for key, batch in sorted(intent.items(), key=lambda item: item[0] == SELF):
        details = f"found gone after the intent of batch {batch}"
        if key == SELF:
            yield Outcome(PURGED, reason(EARLIER_ATTEMPT, details), deleted_at_ms=now_ms(), intent=batch)
        else:
            kind, object_id, dc = json.loads(key)
            yield Outcome(PURGED, reason(EARLIER_ATTEMPT, details), kind=kind, id=object_id, dc=dc,
                          deleted_at_ms=now_ms(), intent=batch)

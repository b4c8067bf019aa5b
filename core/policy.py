"""The policy interface (docs/policies.md, "The policy interface"): all the engine knows about a kind of
object. A policy of one's own imports from this module alone: everything it may import is in ``__all__``,
the interface's parts gathered from the modules that define them, one concept each, with the helpers a
policy uses. The engine's view of the enabled policies is ``purger.core.policy_set``.

A policy is one kind of purge (``mailbox``, ``rule_events``, ``users``,
``units_of_work``, or one of a user's own). It says:

- its events, its kinds of object with the state kept per object, and the
  rules that make them due (``purger.core.events``: ``EventField``,
  ``EventType``, ``ObjectKind``, ``Rule``);
- its delete-time half, a ``Purge`` per kind built on each executor from the
  shared ``Resources``: an ``ObjectPurge``, whose protocol the engine owns
  (``purger.core.purge_protocol``), and whose steps the policy fills in
  through the handles the engine gives it (``purger.core.handles``:
  ``Tables``, ``Control``, ``Journal``);
- the reverse of its fold, for reconciliation (``purger reconcile``): the
  tables whose rows are its objects (``Scanned``) and how a row is re-expressed
  as the events that would have produced it (``Policy.row_events``), its
  blobs and dependent rows (``purger.core.reconcile_descriptors``);
- its configuration section (``settings_model``, a pydantic model built on
  ``Settings``) and the tables and columns it reads (for ``purger setup``):
  ``Settings`` and ``Policy``, here;
- where its objects of a data subject are, for an erasure on request
  (``Policy.subjects``: ``SubjectRows``, ``purger.core.erasure``), and what
  still keeps one whatever its subject asked (``ObjectPurge.erasable``).

Beside them, ``__all__`` holds what a policy's own code and tests use of the
rest of the core: ``Duration`` (``purger.core.settings``), the time helpers of
``purger.core.times`` and the outcome words of ``purger.core.vocabulary``.

Example::

    from purger.policies import load_policy
    policy = load_policy("rule_events", {"enabled": True})
    kind = policy.kinds[0]
    state = kind.fold(None, [event])
    kind.eligibility(state)   # Eligibility(rule='rule_event_complete', eligible_at_ms=...)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import date
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from purger.core.settings import Duration
from purger.core.erasure import Follows, SubjectRows, erasure_rule, is_erasure
from purger.core.events import Eligibility, EventField, EventType, Link, ObjectKind, Rule, earliest
from purger.core.handles import Consistency, Control, Journal, Resources, Tables
from purger.core.holds import Hold, Holds
from purger.core.purge_protocol import (
    Attempt, Candidate, Deleted, Dependent, Kept, ObjectPurge, Outcome, Purge, RuleWrite, key_id,
)
from purger.core.restorations import BlobImage, RowImage
from purger.core.reconcile_descriptors import (
    REFERENCED_FIELD, Blobs, OrphanRows, PageVerdicts, Scanned, dated, latest_write, row_event,
)
from purger.core.times import (
    duration_ms, epoch_ms, format_epoch_ms, format_timestamp, from_epoch_ms, now_ms, parse_timestamp,
)
from purger.core.vocabulary import (
    ALREADY_GONE, BEING_DELETED, EARLIER_ATTEMPT, ERROR, HELD, KEPT_BY_RULE, LIVE_REASON, NOT_YET_DUE, PRESENT, PURGED,
    RECENTLY_LINKED, RELINKED, REMOVED_MEANWHILE, SKIPPED, WOULD_DELETE, category, reason,
)

__all__ = [
    # defined here
    "Policy", "Settings",
    # purger.core.erasure
    "Follows", "SubjectRows", "erasure_rule", "is_erasure",
    # purger.core.events
    "Eligibility", "EventField", "EventType", "Link", "ObjectKind", "Rule", "earliest",
    # purger.core.handles
    "Consistency", "Control", "Journal", "Resources", "Tables",
    # purger.core.holds
    "Hold", "Holds",
    # purger.core.purge_protocol
    "Attempt", "Candidate", "Deleted", "Dependent", "Kept", "ObjectPurge", "Outcome", "Purge", "RuleWrite", "key_id",
    # purger.core.restorations
    "BlobImage", "RowImage",
    # purger.core.reconcile_descriptors
    "REFERENCED_FIELD", "Blobs", "OrphanRows", "PageVerdicts", "Scanned", "dated", "latest_write", "row_event",
    # purger.core.settings
    "Duration",
    # purger.core.times
    "duration_ms", "epoch_ms", "format_epoch_ms", "format_timestamp", "from_epoch_ms", "now_ms", "parse_timestamp",
    # purger.core.vocabulary: the statuses of a purge's outcomes, the reasons' categories and how a reason is
    # written
    "ALREADY_GONE", "ERROR", "PURGED", "SKIPPED", "WOULD_DELETE",
    "BEING_DELETED", "EARLIER_ATTEMPT", "HELD", "KEPT_BY_RULE", "LIVE_REASON", "NOT_YET_DUE", "PRESENT", "RECENTLY_LINKED",
    "RELINKED", "REMOVED_MEANWHILE", "category", "reason",
]


class Settings(BaseModel):
    """A policy's configuration section, ``[policies.<name>]``; a policy's own model adds its keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    # A policy of one's own: the module that defines it (``module.path`` or ``module.path:ClassName``).
    module: str | None = None
    # Topics of its own, read besides ``kafka.topics``.
    topics: list[str] = []


class Policy(ABC):
    """A kind of purge. Subclasses set the class attributes and build their kinds from ``settings``."""

    name: ClassVar[str]
    settings_model: ClassVar[type[Settings]] = Settings
    event_fields: ClassVar[tuple[EventField, ...]]
    event_types: ClassVar[tuple[EventType, ...]]
    # table (by its reference name, as in ``schema``) -> the columns the purger reads or conditions on;
    # ``columns_read`` gives them under the configured names, for ``purger setup`` to check.
    tables: ClassVar[dict[str, tuple[str, ...]]] = {}
    # The reference schema of those tables (CQL, ``{keyspace}`` for the keyspace), for the local stack
    # and the tests; on a real platform the tables are the platform's own.
    schema: ClassVar[str] = ""

    # The tables reconciliation scans, each row one object of the policy (``row_events`` says how it is read).
    scanned: ClassVar[tuple[Scanned, ...]] = ()
    # Its blobs in the object stores, whose orphans reconciliation deletes.
    blobs: ClassVar[tuple[Blobs, ...]] = ()
    # Its tables of dependent rows, whose orphans (their parent row gone) reconciliation deletes.
    orphan_rows: ClassVar[tuple[OrphanRows, ...]] = ()
    # Where its objects of a data subject are (``purger erase KIND:ID``): none, the default, takes no part.
    subjects: ClassVar[tuple[SubjectRows, ...]] = ()
    # What an erasure of those objects takes with them (a message's payload): in the undo window's images, and what
    # `purger erase` waits a batch for after their records before it prints the certificate.
    follows: ClassVar[tuple[Follows, ...]] = ()

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def hold_scopes(self) -> tuple[str, ...]:
        """The scope kinds a legal hold may name for its objects (``purger hold KIND:ID``, ``purger.core.holds``):
        by default its kinds; its purges' ``ObjectPurge.scopes`` say which scopes each object falls under."""
        return tuple(kind.name for kind in self.kinds)

    @property
    @abstractmethod
    def kinds(self) -> tuple[ObjectKind, ...]:
        """Its kinds of object, each with state and one timer per object."""

    @abstractmethod
    def purges(self, resources: Resources) -> dict[str, Purge]:
        """Its delete-time half on an executor, a purge per kind (an ``ObjectPurge`` each; statements are
        prepared here, once)."""

    def row_events(self, table: str, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The reverse of the fold, for reconciliation: the events that would have produced ``row`` of
        ``table`` (a ``Scanned`` table, by its reference name; ``row`` maps its ``columns`` to the driver's
        values), as records of the topics (``row_event``), with the row's own timestamps as event times.
        Folded, they give the object the state the row says it has: due when the row is due by the
        policy's rules, kept when it is kept. A policy's own control types may be among them (only the
        purger writes the reconcile topic). [] when the row says nothing the stream can use (a row being
        written, a claimed row). The default: the policy has no ``scanned`` tables."""
        return []

    def page_verdicts(self, table: str, columns: dict[str, list[Any]]) -> "PageVerdicts | None":
        """What each row of a page of ``table`` says on its own, judged on whole columns (column name ->
        the page's values, as ``row_events`` gets them one row at a time): exactly what folding each row's
        ``row_events`` gives (``purger.reconcile.verdict.row_verdict``), only faster, for the large tables of a
        reconcile. None, the default: the rows are judged one at a time."""
        return None

    def report_fields(self, day: date) -> dict[str, str]:
        """Extra fields of its rows in the daily report for ``day`` (e.g. the payment store's)."""
        return {}

    def table_names(self) -> dict[str, str]:
        """Each table of ``tables``, by its reference name, -> the name its settings give it. A policy whose
        settings name its tables says how; by default the reference names are the names."""
        return {table: table for table in self.tables}

    def columns_read(self) -> dict[str, frozenset[str]]:
        """The tables it reads, by their configured names, each with the columns it reads or conditions on,
        reconciliation's scans included: what ``purger setup`` and ``purger run`` check.

        Example::

            load_policy("mailbox", {"payloads_table": "blobs"}).columns_read()["blobs"]
            # frozenset({'payload_id', 'dcs', 'state', 'last_ref_at'})
        """
        names = self.table_names()
        read = {names[table]: set(columns) for table, columns in self.tables.items()}
        for scanned in self.scanned:
            read.setdefault(names[scanned.table], set()).update(scanned.columns)
        for rows in self.subjects:
            read.setdefault(names[rows.table], set()).update((rows.id_column, rows.subject_column))
        for orphans in self.orphan_rows:
            read.setdefault(names[orphans.table], set()).update(orphans.key + ((orphans.written,) if orphans.written else ()))
            read.setdefault(names[orphans.parent], set()).add(orphans.parent_key)
        return {table: frozenset(columns) for table, columns in read.items()}



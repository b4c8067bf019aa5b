"""The ``users`` policy (docs/policies.md, users): a user's virtual root and mailbox permissions across data centres.

Each data centre keeps its own user directory and reports to the purger when
it adds or removes a user (``user_added`` / ``user_removed``, with ``user_id``
and ``dc``). A user's rows go only once it is absent from the directory of
**every** configured data centre.

=============  ==========================================================  ==================
rule           eligible when                                               period [default]
=============  ==========================================================  ==================
user_absent    by the latest event of each configured data centre, none    user_grace [7d]
               has the user (one that never reported it counts as
               absent), for the period since the last removal
=============  ==========================================================  ==================

State: per data centre, its latest event by event time (last writer wins; at
equal times the removal, then the event id), so any arrival order and any
duplicates give the same state. Events of data centres not configured are kept
but do not count, so a change of ``data_centres`` applies to known users too.

Double-check at delete time: the ``users`` row is ``live``, has no data centre
in ``present_in``, and its ``updated_at`` is at least ``user_grace`` old.
Deleted, in this order: the ``mailbox_permissions`` rows, the
``virtual_roots`` row, the ``users`` row (one outcome each).

Reconciliation reads a ``live`` row back as each configured data centre's
word at its ``updated_at``: ``user_added`` if ``present_in`` has it, else
``user_removed`` (``UsersPolicy.row_events``).

A row without ``updated_at`` (written by no writer of the contract below) is
dated by its state cell's write time (``presence_changed_at``), at delete time
and by reconciliation alike: never skipped, never due at once. Its claim
carries ``updated_at = null`` in place of ``updated_at <= ?``, the grace having
been checked on the row read (``Rule.undated``).

The writer contract
-------------------

The purger, for a user found due:

1. Read the ``users`` row at SERIAL. Gone: ``already_gone`` (``purged`` with
   the earlier-attempt reason on a retried batch), and nothing else is
   touched: a writer may be re-creating the user.
2. If ``state = 'live'``: keep the user unless ``present_in`` is empty and
   ``updated_at <= now - user_grace`` (``skipped``, ``present: in dc1``; or
   ``not yet due: ...`` and a recheck when it will be). A dry run stops here
   with ``would_delete``. Then claim the row::

       UPDATE users SET state = 'purging' WHERE user_id = ?
         IF state = 'live' AND present_in = null AND updated_at <= ?   -- now - user_grace

   Not applied: a writer changed the row since; ``skipped`` (``present:
   re-added while being purged``) and a recheck a grace later.
3. With ``state = 'purging'`` (this attempt's claim, or a crashed attempt's):
   read the permission rows and the virtual root, keep their keys in the
   purger's journal (``purger.core.policy.ObjectPurge``), delete them, then
   ``DELETE FROM users WHERE user_id = ? IF state = 'purging'``.

A writer (the platform), adding a user in data centre ``dc``:

a. ``INSERT INTO users (user_id, present_in, state, updated_at) VALUES (?,
   {dc}, 'live', now) IF NOT EXISTS``; if not applied, ``UPDATE users SET
   present_in = present_in + {dc}, updated_at = now WHERE user_id = ? IF
   state = 'live'``; if that is not applied either (the row is ``purging``,
   an orphan sweep's claim, or was just deleted), wait a moment and start
   again at (a).
b. Only once (a) applied, write the virtual root and permission rows.
c. Emit ``user_added``.

Removing a user from ``dc``: ``UPDATE users SET present_in = present_in -
{dc}, updated_at = now WHERE user_id = ? IF state = 'live'``, then emit
``user_removed``.

Why it is safe: both sides change the ``users`` row only by lightweight
transactions, which are linearizable. Once the purger's claim applied, no
writer's add applies until the row is gone; a writer writes dependents only
after its own add applied; and the purger deletes dependents only between a
claim and its delete of the row, never after. So the purger never deletes a
dependent written for a present user. This takes one purge of a user at a
time, as the engine runs them (a batch is retried only once its failed attempt
has stopped). Like Cassandra's last-write-wins itself,
it assumes that the clocks of the writers' and the purger's hosts differ by
less than the time from the purger's last dependent delete to a writer's first
dependent write (two lightweight transactions at least).

Example::

    from purger.policies import load_policy
    from purger.policies.users import UserEvent
    policy = load_policy("users", {"enabled": True, "data_centres": ["dc1", "dc2"], "user_grace": "7d"})
    kind = policy.kinds[0]
    state = kind.fold(None, [UserEvent("e1", "user_added", 1_000, "u1", "dc1"),
                             UserEvent("e2", "user_removed", 5_000, "u1", "dc1")])
    kind.eligibility(state)   # Eligibility(rule='user_absent', eligible_at_ms=5_000 + 7 days)
    outcomes = list(policy.purges(resources)["user"].purge(candidate, Attempt()))
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NamedTuple

from pydantic import field_validator

from purger.core.settings import Duration
from purger.core.erasure import SubjectRows, is_erasure
from purger.core.events import Eligibility, EventField, EventType, ObjectKind, Rule, earliest
from purger.core.handles import Resources
from purger.core.policy import Policy, Settings
from purger.core.purge_protocol import Candidate, Dependent, Kept, ObjectPurge, Purge, RuleWrite
from purger.core.restorations import RowImage
from purger.core.reconcile_descriptors import CLAIMED_BY, OrphanRows, Scanned, dated, row_event
from purger.core.times import duration_ms, epoch_ms, format_epoch_ms, now_ms
from purger.core.vocabulary import LIVE_REASON, NOT_YET_DUE, PRESENT, reason

USER = "user"
VIRTUAL_ROOT = "virtual_root"
MAILBOX_PERMISSION = "mailbox_permission"
USER_ADDED = "user_added"
USER_REMOVED = "user_removed"
USER_ABSENT = "user_absent"
# The users row's states.
LIVE = "live"
PURGING = "purging"
# The users rows as the purge reads them and as reconciliation scans them, with the write time that dates a row
# lacking its updated_at: its state's (present_in is a set, each element with a write time of its own, and none
# once empty).
USERS = Scanned("users", USER, "user_id", ("user_id", "present_in", "state", "updated_at"), written=("state",))


class UsersSettings(Settings):
    """``[policies.users]``."""

    # The data centres whose directories must all be without the user.
    data_centres: list[str] = ["dc1", "dc2"]
    user_grace: Duration = timedelta(days=7)
    users_table: str = "users"
    virtual_roots_table: str = "virtual_roots"
    permissions_table: str = "mailbox_permissions"

    @field_validator("data_centres")
    @classmethod
    def _named_once_each(cls, names: list[str]) -> list[str]:
        if not names:
            raise ValueError("name at least one data centre, e.g. ['dc1']")
        if len(set(names)) != len(names):
            raise ValueError("a data centre is named twice")
        return names


@dataclass(frozen=True)
class UserEvent:
    event_id: str
    type: str
    event_time_ms: int
    user_id: str | None = None
    dc: str | None = None


class DirectoryReport(NamedTuple):
    """A data centre's latest word on the user. Compared as tuples, the later event wins; at equal times the
    removal, being nearer to purging (the double-check catches a wrong guess that way, while one toward
    keeping would leave the rows behind); then the event id."""

    time_ms: int
    removed: bool
    event_id: str
    dc: str


@dataclass(frozen=True)
class UserState:
    # Each data centre's latest DirectoryReport, JSON-encoded (the state store keeps strings), sorted by data centre.
    reports: tuple[str, ...] = ()

    def latest(self) -> dict[str, DirectoryReport]:
        return {r.dc: r for r in (DirectoryReport(*json.loads(text)) for text in self.reports)}

    def absent_since(self, data_centres: tuple[str, ...]) -> int | None:
        """When the last of ``data_centres`` to report removed the user, if none has it now; None while one
        has it or none ever removed it. A data centre that never reported counts as absent."""
        latest = self.latest()
        reports = [latest[dc] for dc in data_centres if dc in latest]
        if not reports or not all(r.removed for r in reports):
            return None
        return max(r.time_ms for r in reports)


class UserKind(ObjectKind[UserState]):
    name = USER
    state_class = UserState
    event_class = UserEvent

    def __init__(self, settings: UsersSettings) -> None:
        data_centres = tuple(settings.data_centres)
        self.rule: Rule[UserState] = Rule(
            USER_ABSENT, duration_ms(settings.user_grace),
            lambda s: s.absent_since(data_centres),
            # The check at delete time, on the claim. An empty set is null in Cassandra; updated_at is the
            # last change of present_in.
            "present_in = null AND updated_at <= ?",
            undated="present_in = null AND updated_at = null",
        )

    def fold(self, state: UserState | None, events: list[Any]) -> UserState:
        latest = (state or UserState()).latest()
        for e in events:
            if e.type in (USER_ADDED, USER_REMOVED) and e.dc is not None:
                report = DirectoryReport(e.event_time_ms, e.type == USER_REMOVED, e.event_id, e.dc)
                latest[e.dc] = max(latest.get(e.dc, report), report)
        return UserState(tuple(json.dumps(latest[dc]) for dc in sorted(latest)))

    def eligibility(self, state: UserState) -> Eligibility | None:
        return earliest((self.rule,), state)


class UsersPolicy(Policy):
    name = "users"
    settings: UsersSettings
    settings_model = UsersSettings
    event_fields = (EventField("user_id", "string", identifier=True), EventField("dc", "string", identifier=True))
    event_types = tuple(EventType(t, USER, "user_id", required=("dc",)) for t in (USER_ADDED, USER_REMOVED))
    tables = {
        "users": ("user_id", "present_in", "state", "updated_at"),
        "virtual_roots": ("user_id",),
        "mailbox_permissions": ("user_id", "mailbox"),
    }
    scanned = (USERS,)
    # The user itself: its roots and permissions go with it, as in any purge of it.
    subjects = (SubjectRows(USER, "users", USER, "user_id", "user_id"),)
    # A user's rows left behind when its users row went without them (a purge cut short, another purger).
    # A user id may be added again: a sweep claims the absent users row (its state) while it deletes them.
    orphan_rows = (OrphanRows("virtual_roots", ("user_id",), "users", "user_id", written="mailbox", claim="state"),
                   OrphanRows("mailbox_permissions", ("user_id", "mailbox"), "users", "user_id", written="permissions",
                              claim="state"))
    schema = """
CREATE TABLE IF NOT EXISTS {keyspace}.users (
  user_id    text PRIMARY KEY,
  present_in set<text>,
  state      text,
  updated_at timestamp
);
CREATE TABLE IF NOT EXISTS {keyspace}.virtual_roots (user_id text PRIMARY KEY, mailbox text);
CREATE TABLE IF NOT EXISTS {keyspace}.mailbox_permissions (
  user_id     text,
  mailbox     text,
  permissions set<text>,
  PRIMARY KEY (user_id, mailbox)
);
"""

    def __init__(self, settings: UsersSettings) -> None:
        super().__init__(settings)
        self.kind = UserKind(settings)

    @property
    def kinds(self) -> tuple[ObjectKind, ...]:
        return (self.kind,)

    def purges(self, resources: Resources) -> dict[str, Purge]:
        return {USER: UserPurge(resources, self.table_names(), self.kind.rule)}

    def table_names(self) -> dict[str, str]:
        return {"users": self.settings.users_table, "virtual_roots": self.settings.virtual_roots_table,
                "mailbox_permissions": self.settings.permissions_table}

    def row_events(self, table: str, row: dict[str, Any]) -> list[dict[str, Any]]:
        """Each configured data centre's word at the row's ``updated_at`` (the last change of ``present_in``):
        added if ``present_in`` has it, removed if not. A row a purge claimed (``purging``) reads the same: its
        claim's condition held (absent everywhere, a grace ago), so it is due, and the purge, finding it claimed,
        finishes it. Nothing from a row not of the writer contract, nor from one present in a data centre the
        configuration does not name: the check at delete time keeps that user, and no event of the configured
        ones can say so."""
        present = set(row["present_in"] or ())
        data_centres = self.settings.data_centres
        changed_at = presence_changed_at(row)
        if row["state"] not in (LIVE, PURGING) or changed_at is None or not present <= set(data_centres):
            return []
        if row["updated_at"] is None and row["state"] == PURGING:
            # Its state's write time is the claim's, which found the user absent a grace old: absent a grace before.
            changed_at -= self.settings.user_grace
        return [row_event("users", row["user_id"], USER_ADDED if dc in present else USER_REMOVED, changed_at,
                          user_id=row["user_id"], dc=dc)
                for dc in data_centres]


def presence_changed_at(row: dict[str, Any]) -> datetime | None:
    """When the row's ``present_in`` last changed, which the grace runs from: ``updated_at``; for a row without it,
    its state cell's write time (``dated``)."""
    return dated(row, "updated_at", USERS)


class UserPurge(ObjectPurge[Any]):
    """The purger's side of the writer contract (module docstring). One instance per executor process."""

    def __init__(self, resources: Resources, tables: dict[str, str], rule: Rule[UserState]) -> None:
        super().__init__(resources, tables)
        self.rule = rule
        prepare = self.tables.prepare
        self.read_user = prepare(f"SELECT {', '.join(USERS.selected)} FROM {{users}} WHERE user_id = ?")
        self.claim_user = RuleWrite(self.tables, f"UPDATE {{users}} SET state = '{PURGING}' WHERE user_id = ? "
                                                 f"IF state = '{LIVE}' AND", rule)
        # An erasure's claim: present anywhere or not, as long as no other purge claimed it.
        self.erase_claim = prepare(f"UPDATE {{users}} SET state = '{PURGING}' WHERE user_id = ? IF state = '{LIVE}'")
        self.delete_user = prepare(f"DELETE FROM {{users}} WHERE user_id = ? IF state = '{PURGING}'")
        self.read_permissions = prepare("SELECT mailbox FROM {mailbox_permissions} WHERE user_id = ?")
        self.delete_permission = prepare("DELETE FROM {mailbox_permissions} WHERE user_id = ? AND mailbox = ?")
        self.read_root = prepare("SELECT user_id FROM {virtual_roots} WHERE user_id = ?")
        self.delete_root = prepare("DELETE FROM {virtual_roots} WHERE user_id = ?")

    def read(self, candidate: Candidate, serial: bool = False) -> Any | None:
        return self.tables.one(self.read_user, candidate.id, serial=serial)

    def claimed(self, row: Any) -> bool:
        return row.state == PURGING

    def due(self, candidate: Candidate, row: Any) -> Eligibility | None:
        # Present somewhere (a removal event brings the user back to the stream's attention), or not a
        # state of the contract (not ours to delete): no deadline.
        if row.state != LIVE or row.present_in:
            return None
        return Eligibility(USER_ABSENT, (epoch_ms(presence_changed_at(row._asdict())) or now_ms())
                           + self.rule.period_ms)

    def why_kept(self, candidate: Candidate, row: Any, due: Eligibility | None) -> str:
        if row.state != LIVE:
            return reason(LIVE_REASON, f"state {row.state!r}")
        if due is None:
            return reason(PRESENT, "in " + ", ".join(sorted(row.present_in)))
        return reason(NOT_YET_DUE, f"{USER_ABSENT} at {format_epoch_ms(due.eligible_at_ms)}")

    def erasable(self, candidate: Candidate, row: Any) -> Kept | None:
        if row.state == LIVE:
            return None
        if isinstance(row.state, str) and row.state.startswith(CLAIMED_BY):
            # An orphan sweep's placeholder for an absent user, removed at the sweep's end: looked at again then.
            return Kept(reason(PRESENT, f"claimed by the {row.state}"), Eligibility(candidate.rule, now_ms()))
        # A row of no state of the contract is not the purger's to claim.
        return Kept(reason(LIVE_REASON, f"state {row.state!r}"))

    def claim(self, candidate: Candidate, row: Any) -> Any | Kept:
        if is_erasure(candidate.rule):
            if self.tables.applied(self.erase_claim, candidate.id):
                return row._replace(state=PURGING)
            return Kept(reason(PRESENT, "changed while being erased"), Eligibility(candidate.rule, now_ms()))
        due = self.due(candidate, row)
        if self.claim_user.applied((candidate.id,), row.updated_at is not None, due and due.eligible_at_ms):
            return row._replace(state=PURGING)
        return Kept(reason(PRESENT, "re-added while being purged"),
                    Eligibility(USER_ABSENT, now_ms() + self.rule.period_ms))

    def dependents(self, candidate: Candidate, row: Any) -> list[Dependent]:
        """The rows that lead from the user, in the order of deletion. Claimed: no writer adds the user
        until the row is gone, so these are the old user's."""
        user_id, tables = candidate.id, self.tables
        found = [Dependent(MAILBOX_PERMISSION, f"{user_id}/{r.mailbox}",
                           partial(tables.execute, self.delete_permission, user_id, r.mailbox),
                           image=RowImage("mailbox_permissions", (("user_id", user_id), ("mailbox", r.mailbox))))
                 for r in tables.all(self.read_permissions, user_id)]
        if tables.one(self.read_root, user_id) is not None:
            found.append(Dependent(VIRTUAL_ROOT, user_id, partial(tables.execute, self.delete_root, user_id),
                                   image=RowImage("virtual_roots", (("user_id", user_id),))))
        return found

    def image(self, candidate: Candidate) -> RowImage:
        return RowImage("users", (("user_id", candidate.id),))

    def delete(self, candidate: Candidate, row: Any) -> bool:
        return self.tables.applied(self.delete_user, candidate.id)

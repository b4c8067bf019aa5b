"""``push_clients``: a policy of one's own (docs/policies.md, A policy of one's own), written outside the purger's package.

Inactive push clients: the router row and the message rows of a client that
has not connected for ``inactive_after`` [60d]. It imports one module of the
purger, its policy interface (``purger.core.policy``), and no driver: its CQL
runs through the typed handle the engine gives it (``Tables``). It is named in
the configuration::

    [policies.push_clients]
    enabled = true
    module = "push_clients_policy"        # or "push_clients_policy:PushClientsPolicy"
    inactive_after = "60d"

with this file's directory on ``PYTHONPATH`` on the driver and on every
executor (``spark-submit --py-files push_clients_policy.py``).

How it implements the interface (``purger.core.policy``)
-------------------------------------------------

=================  ======================================================================
interface          here
=================  ======================================================================
events             ``push_client_registered`` and ``push_client_connected``, each with
                   ``client_id`` (the record key); ``event_id``, ``type`` and
                   ``event_time`` as every event
state per object   ``PushClientState.last_connected_ms``: the latest event time of either
                   event, a max, so any order and any duplicates give the same state
rules              ``inactive``: due at the last connection plus ``inactive_after``; at
                   delete time the row must still say ``last_connected_at <= now -
                   inactive_after``
order of deletion  the ``push_messages`` rows (one outcome each, kind ``push_message``),
                   then the ``push_routers`` row (kind ``push_client``)
delete time        ``PushClientPurge``, an ``ObjectPurge``: the engine runs the protocol
                   (read, due?, dry run, claim, journalled dependents, delete, rechecks);
                   the policy fills in ``read``, ``claimed``, ``due``, ``why_kept``,
                   ``claim``, ``dependents`` and ``delete``
reconciliation     ``scanned``: the ``push_routers`` table, a row per client;
                   ``row_events``: a row read back as a ``push_client_connected`` at its
                   ``last_connected_at``, the time the rule and the check both read
=================  ======================================================================

Tables (``{keyspace}`` is ``cassandra.keyspace``)::

    push_routers  (client_id text PRIMARY KEY, endpoint text, last_connected_at timestamp,
                   purging boolean)
    push_messages (client_id text, message_id text, body blob, PRIMARY KEY (client_id, message_id))

``purging`` is this policy's addition to the platform's router table: null
while the client is live, true while a purge holds the row.

The writer contract
-------------------

A client that connects while its purge runs must not lose a message it still
needs, and no message may be left behind without its router. So the router row
is the lock, changed on both sides only by lightweight transactions
(linearizable):

The purger, for a client found due:

1. Read the router row at SERIAL. Gone: ``already_gone`` (``purged`` with the
   earlier-attempt reason on a retried batch); nothing else is touched.
2. Not ``purging``: keep the client unless ``last_connected_at <= now -
   inactive_after`` (``skipped``, ``not yet due: inactive at ...``, and a
   recheck then). A dry run stops here: ``would_delete`` for each message and
   the router. Then claim the row::

       UPDATE push_routers SET purging = true WHERE client_id = ?
         IF purging = null AND last_connected_at <= ?      -- now - inactive_after

   Not applied: the client connected meanwhile; ``skipped`` (``live:
   connected while being purged``) and a recheck a period later.
3. ``purging`` (this attempt's claim or a failed attempt's): read the message
   rows, keep their keys in the purger's journal
   (the engine's ``ObjectPurge`` does it, so that a retry records the ones a
   crashed attempt deleted), delete each, then ``DELETE FROM push_routers
   WHERE client_id = ? IF purging = true``.

The platform (``push_clients_platform.PushClientsPlatform``):

a. A client connects: ``UPDATE push_routers SET last_connected_at = now
   WHERE client_id = ? IF purging = null AND last_connected_at != null``
   (the second condition keeps a connect from creating a row: on a missing
   row ``purging = null`` alone would apply). Not applied: the client is
   unknown or a purge holds its row; it registers (b).
b. A client registers: ``INSERT INTO push_routers (client_id, endpoint,
   last_connected_at) VALUES (?, ?, now) IF NOT EXISTS``; not applied: try
   (a) again; neither applies while a purge holds the row, so wait a moment
   and start again. A client whose purge finished comes back as a new one,
   with no messages.
c. A message is stored: write its ``push_messages`` row, then read the
   router row at SERIAL. Gone or ``purging``: delete that message row again
   and answer the sender that the client is gone.
d. Only after (a) or (b) applied, emit ``push_client_connected`` or
   ``push_client_registered``.

Why it is safe: a claim applies only to a row that, by the row, has not
connected for ``inactive_after``, and no connect or register applies from the
claim until the row is deleted. The purger deletes messages only between its
claim and its delete of the row, so every message it deletes was stored before
the client's next connection: a message of the inactive client, which is what
this policy purges; a client that connects after the claim is a new client
from then on. No message is left without a router: a message stored after the
purger listed the messages was stored after the claim, so its sender's read in
(c) finds the row ``purging`` or gone and deletes it. The contract assumes the
message writes and the purger's reads of them are at a consistency where reads
see writes (e.g. ``LOCAL_QUORUM`` both; the reference stack has one node), one
purge of a client at a time (as the engine runs them), and host clocks that
differ by less than ``inactive_after``.

Example::

    from purger.policies import load_policy   # on the driver; the engine calls it for you
    policy = load_policy("push_clients", {"enabled": True, "module": "push_clients_policy",
                                          "inactive_after": "60d"})
    kind = policy.kinds[0]
    state = kind.fold(None, [ClientEvent("e1", PUSH_CLIENT_CONNECTED, 1_000, "c1")])
    kind.eligibility(state)   # Eligibility(rule='inactive', eligible_at_ms=1_000 + 60 days)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from purger.core.policy import (
    KEPT_BY_RULE, LIVE_REASON, NOT_YET_DUE, Candidate, Dependent, Duration, Eligibility, EventField, EventType, Kept,
    ObjectKind, ObjectPurge, Policy, Purge, Resources, Rule, Scanned, Settings, duration_ms, earliest, epoch_ms,
    format_epoch_ms, now_ms, reason, row_event,
)

NAME = "push_clients"
PUSH_CLIENT = "push_client"
PUSH_MESSAGE = "push_message"
PUSH_CLIENT_REGISTERED = "push_client_registered"
PUSH_CLIENT_CONNECTED = "push_client_connected"
INACTIVE = "inactive"
ROUTERS = "push_routers"
MESSAGES = "push_messages"


class PushClientsSettings(Settings):
    """``[policies.push_clients]``: ``enabled``, ``module`` and ``topics`` as every policy, and the period."""

    inactive_after: Duration = timedelta(days=60)


@dataclass(frozen=True)
class ClientEvent:
    """``push_client_registered`` or ``push_client_connected``: the engine builds it by field name."""

    event_id: str
    type: str
    event_time_ms: int
    client_id: str | None = None


@dataclass(frozen=True)
class PushClientState:
    # The latest registration or connection by event time: a max, whatever the order.
    last_connected_ms: int | None = None


class PushClientKind(ObjectKind[PushClientState]):
    """A push client, keyed by ``client_id``."""

    name = PUSH_CLIENT
    state_class = PushClientState
    event_class = ClientEvent

    def __init__(self, inactive_after: timedelta) -> None:
        self.rule: Rule[PushClientState] = Rule(
            INACTIVE, duration_ms(inactive_after),
            lambda s: s.last_connected_ms,
            # The row's last_connected_at is the same connection, so the check says the same of the row.
            "last_connected_at <= ?",
        )

    def fold(self, state: PushClientState | None, events: list[ClientEvent]) -> PushClientState:
        times = [e.event_time_ms for e in events if e.type in (PUSH_CLIENT_REGISTERED, PUSH_CLIENT_CONNECTED)]
        if state is not None and state.last_connected_ms is not None:
            times.append(state.last_connected_ms)
        return PushClientState(max(times, default=None))

    def eligibility(self, state: PushClientState) -> Eligibility | None:
        return earliest((self.rule,), state)


class PushClientPurge(ObjectPurge[Any]):
    """The purger's side of the writer contract (module docstring): the engine runs the protocol
    (``ObjectPurge``), this fills in its steps. One per executor process."""

    def __init__(self, resources: Resources, tables: dict[str, str], rule: Rule[PushClientState]) -> None:
        super().__init__(resources, tables)
        self.rule = rule
        prepare = self.tables.prepare
        self.read_router = prepare(f"SELECT last_connected_at, purging FROM {{{ROUTERS}}} WHERE client_id = ?")
        self.claim_router = prepare(f"UPDATE {{{ROUTERS}}} SET purging = true WHERE client_id = ? "
                                    f"IF purging = null AND {rule.condition}")
        self.delete_router = prepare(f"DELETE FROM {{{ROUTERS}}} WHERE client_id = ? IF purging = true")
        self.read_messages = prepare(f"SELECT message_id FROM {{{MESSAGES}}} WHERE client_id = ?", "local_quorum")
        self.delete_message = prepare(f"DELETE FROM {{{MESSAGES}}} WHERE client_id = ? AND message_id = ?",
                                      "local_quorum")

    def read(self, candidate: Candidate, serial: bool = False) -> Any | None:
        return self.tables.one(self.read_router, candidate.id, serial=serial)

    def claimed(self, row: Any) -> bool:
        return bool(row.purging)

    def due(self, candidate: Candidate, row: Any) -> Eligibility | None:
        # No last_connected_at: not a row of the contract (a connect or register always sets it).
        last = epoch_ms(row.last_connected_at)
        return None if last is None else Eligibility(INACTIVE, last + self.rule.period_ms)

    def why_kept(self, candidate: Candidate, row: Any, due: Eligibility | None) -> str:
        if due is None:
            return reason(KEPT_BY_RULE, f"{INACTIVE} did not hold (no last_connected_at)")
        return reason(NOT_YET_DUE, f"{INACTIVE} at {format_epoch_ms(due.eligible_at_ms)}")

    def claim(self, candidate: Candidate, row: Any) -> Any | Kept:
        if self.tables.applied(self.claim_router, candidate.id, self.rule.cutoff()):
            return row._replace(purging=True)
        return Kept(reason(LIVE_REASON, "connected while being purged"),
                    Eligibility(INACTIVE, now_ms() + self.rule.period_ms))

    def dependents(self, candidate: Candidate, row: Any) -> list[Dependent]:
        # Claimed: no connect applies until the row is gone, so these are the inactive client's messages.
        client_id = candidate.id
        return [Dependent(PUSH_MESSAGE, f"{client_id}/{r.message_id}",
                          partial(self.tables.execute, self.delete_message, client_id, r.message_id))
                for r in self.tables.all(self.read_messages, client_id)]

    def delete(self, candidate: Candidate, row: Any) -> bool:
        return self.tables.applied(self.delete_router, candidate.id)


class PushClientsPolicy(Policy):
    """Inactive push clients: their router row and message rows, after ``inactive_after`` without a connection."""

    name = NAME
    settings: PushClientsSettings
    settings_model = PushClientsSettings
    event_fields = (EventField("client_id", "string", identifier=True),)
    event_types = (
        EventType(PUSH_CLIENT_REGISTERED, PUSH_CLIENT, "client_id"),
        EventType(PUSH_CLIENT_CONNECTED, PUSH_CLIENT, "client_id"),
    )
    tables = {
        ROUTERS: ("client_id", "last_connected_at", "purging"),
        MESSAGES: ("client_id", "message_id"),
    }
    # Reconciliation reads the router table whole: a row per client.
    scanned = (Scanned(ROUTERS, PUSH_CLIENT, "client_id", ("client_id", "last_connected_at", "purging")),)
    schema = f"""
CREATE TABLE IF NOT EXISTS {{keyspace}}.{ROUTERS} (
  client_id         text PRIMARY KEY,
  endpoint          text,
  last_connected_at timestamp,   -- the latest registration or connection
  purging           boolean      -- null while live, true while a purge holds the row
);
CREATE TABLE IF NOT EXISTS {{keyspace}}.{MESSAGES} (
  client_id  text,
  message_id text,
  body       blob,
  PRIMARY KEY (client_id, message_id)
);
"""

    def __init__(self, settings: PushClientsSettings) -> None:
        super().__init__(settings)
        self.kind = PushClientKind(settings.inactive_after)

    @property
    def kinds(self) -> tuple[ObjectKind, ...]:
        return (self.kind,)

    def purges(self, resources: Resources) -> dict[str, Purge]:
        return {PUSH_CLIENT: PushClientPurge(resources, self.table_names(), self.kind.rule)}

    def row_events(self, table: str, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The reverse of the fold: a router row is the client's last connection, at ``last_connected_at``; one
        a purge holds too (it was due when claimed, and the purge, finding it claimed, finishes it). Nothing from
        a row no connect or register wrote (no ``last_connected_at``)."""
        if row["last_connected_at"] is None:
            return []
        return [row_event(ROUTERS, row["client_id"], PUSH_CLIENT_CONNECTED, row["last_connected_at"],
                          client_id=row["client_id"])]

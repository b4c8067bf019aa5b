"""Objects of the ``rule_events``, ``users`` and ``units_of_work`` policies, some eligible at once and some
kept, written through the platform stand-ins: for the demo, the kill test and the replay test.

``SETTINGS`` enables the three policies with periods short enough for a demo; the units of work keep the
default P2Y, and an eligible one is dated years back. Each object is written with its rows, then its
events; an eligible one's last change is older than its period, a kept one stays live:

- a rule event COMPLETE past its period goes; one PROCESSING (a period of an hour) stays;
- a user removed from dc1 past the grace and never in dc2 goes, with its virtual root and permissions; one
  still present in dc2 stays whole;
- a unit of work finished before the lower bound goes, children first; a running one started today stays
  with its children.

Example::

    config = build_config({"policies": SETTINGS})
    platforms = PolicyObjects(config)
    written = platforms.write("demo-1")          # one eligible and one kept object of each policy
    platforms.flush()
    [o for o in written if o.eligible and not platforms.gone(o)]   # what is still to be purged
    platforms.ledger_rows(o)                     # {("users", "virtual_root", "demo-1-user-0"), ...}
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from purger.core.settings import PurgerConfig
from purger.policies.rule_events import COMPLETE, PROCESSING
from purger.policies.units_of_work import COLLECTIONS
from simulation.clock import now
from simulation.rule_events import RuleEventsPlatform
from simulation.units_of_work import UnitsOfWorkPlatform
from simulation.users import UsersPlatform

SETTINGS: dict[str, dict[str, Any]] = {
    "rule_events": {"enabled": True, "complete": "2s", "failed": "2s", "unprocessed": "2s", "processing": "1h"},
    "users": {"enabled": True, "user_grace": "2s", "data_centres": ["dc1", "dc2"]},
    "units_of_work": {"enabled": True},
}
CHILDREN = 5  # objects per unit of work: one in each collection
LONG_AGO = timedelta(minutes=1)  # older than every period of SETTINGS but the units of work's
YEARS_AGO = timedelta(days=3 * 366)  # before the units of work's P2Y lower bound


@dataclass(frozen=True)
class PolicyObject:
    """One object a stand-in wrote: its policy, its kind, its id, and whether the purger must delete it."""

    policy: str
    kind: str
    id: str
    eligible: bool


class PolicyObjects:
    """The three stand-ins, on a configuration's first events topic and its keyspace."""

    def __init__(self, config: PurgerConfig) -> None:
        policies = config.policy_set
        topic, keyspace = config.kafka.topics[0], config.cassandra.keyspace
        self.rule_events = RuleEventsPlatform(config.kafka, config.cassandra, topic, keyspace,
                                              policies.policy_of("rule_event").settings.table)
        self.users = UsersPlatform(config.kafka, config.cassandra, topic, keyspace,
                                   policies.policy_of("user").settings)
        self.units = UnitsOfWorkPlatform(config.kafka, config.cassandra, topic, keyspace,
                                         policies.policy_of("unit_of_work").settings)

    def write(self, prefix: str, kept_unit: bool = True) -> list[PolicyObject]:
        """One eligible and one kept object of each policy (of units of work, the kept one unless
        ``kept_unit`` is False), ids starting with ``prefix``."""
        long_ago = now() - LONG_AGO
        gone_rule, kept_rule = f"{prefix}-rule-0", f"{prefix}-rule-1"
        self.rule_events.raise_event(gone_rule, f"m-{gone_rule}", "route-to-archive", at=long_ago)
        self.rule_events.set_status(gone_rule, COMPLETE, at=long_ago)
        self.rule_events.raise_event(kept_rule, f"m-{kept_rule}", "forward", status=PROCESSING)

        gone_user, kept_user = f"{prefix}-user-0", f"{prefix}-user-1"
        self.users.add_user(gone_user, "dc1", mailboxes=mailboxes(gone_user), at=long_ago)
        self.users.remove_user(gone_user, "dc1", at=long_ago + timedelta(seconds=1))
        for dc in ("dc1", "dc2"):
            self.users.add_user(kept_user, dc, mailboxes=mailboxes(kept_user), at=long_ago)
        self.users.remove_user(kept_user, "dc1", at=long_ago + timedelta(seconds=1))

        gone_unit, running_unit = f"{prefix}-uow-0", f"{prefix}-uow-1"
        started = now() - YEARS_AGO
        self.units.start(gone_unit, "PAYMENT", started, children=CHILDREN)
        self.units.finish(gone_unit, started + timedelta(hours=1))
        written = [PolicyObject("rule_events", "rule_event", gone_rule, True),
                   PolicyObject("rule_events", "rule_event", kept_rule, False),
                   PolicyObject("users", "user", gone_user, True), PolicyObject("users", "user", kept_user, False),
                   PolicyObject("units_of_work", "unit_of_work", gone_unit, True)]
        if kept_unit:
            self.units.start(running_unit, "PAYMENT", now(), children=CHILDREN)
            written.append(PolicyObject("units_of_work", "unit_of_work", running_unit, False))
        return written

    def gone(self, obj: PolicyObject) -> bool:
        """Every row of ``obj`` deleted."""
        return self._rows_left(obj) == 0

    def intact(self, obj: PolicyObject) -> bool:
        """Every row of ``obj`` present, as written."""
        return self._rows_left(obj) == len(ledger_rows(obj))

    def flush(self) -> None:
        for platform in (self.rule_events, self.users, self.units):
            platform.flush()

    def close(self) -> None:
        for platform in (self.rule_events, self.users, self.units):
            platform.close()

    def _rows_left(self, obj: PolicyObject) -> int:
        if obj.kind == "rule_event":
            return int(self.rule_events.row(obj.id) is not None)
        if obj.kind == "user":
            rows = self.users.rows(obj.id)
            return (rows["user"] is not None) + (rows["virtual_root"] is not None) + len(rows["permissions"])
        unit, children = self.units.rows(obj.id)
        return (unit is not None) + children


def mailboxes(user: str) -> tuple[str, str]:
    """A user's mailboxes: its virtual root, and one shared with others."""
    return f"{user}/inbox", "shared/sales"


def ledger_rows(obj: PolicyObject) -> set[tuple[str, str, str]]:
    """What purging ``obj`` deletes, as the ledger names each row: (policy, kind, id)."""
    if obj.kind == "user":
        return ({("users", "mailbox_permission", f"{obj.id}/{mailbox}") for mailbox in mailboxes(obj.id)}
                | {("users", "virtual_root", obj.id), ("users", "user", obj.id)})
    if obj.kind == "unit_of_work":
        return ({("units_of_work", "uow_object", f"{obj.id}/{COLLECTIONS[n % len(COLLECTIONS)]}/o{n}")
                 for n in range(CHILDREN)} | {("units_of_work", "unit_of_work", obj.id)})
    return {(obj.policy, obj.kind, obj.id)}

"""Reconciliation's reverse of the fold (``Policy.row_events``), for every built-in policy and the push_clients
example, as plain Python: a scanned row's records pass the stream's checks; their verdict
(``reconcile.verdict.row_verdict``) says due exactly when the delete-time decision purges the row now; every scan of a
row gives the same records; and they fold with the object's real events alike in any order.

The delete-time decision is each policy's own purge (``ObjectPurge``), run as a dry run on the row through a handle
on its tables that holds just that row (``RowTables``), with both halves' wall clock frozen at ``NOW``; a claimed
row counts as purged (the real run finishes it). For the kinds whose conditional ``DELETE`` is the claim
(``deletes_first``: rule events, messages), the candidate rule's CQL condition is also evaluated on the row by hand.
"""

from __future__ import annotations

import json
import random as _random
import re
import sys
from collections import defaultdict, namedtuple
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable
from unittest import mock

import pytest
from cassandra.cqltypes import DateType
from cassandra.marshal import int64_pack
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.support import ROOT

sys.path.insert(0, str(ROOT / "examples" / "push_clients"))

import push_clients_policy  # noqa: E402
from purger.core import events as core_events, purge_protocol  # noqa: E402
from purger.core.policy import (  # noqa: E402
    Attempt, Candidate, Control, EventField, PageVerdicts, Policy, Resources, Rule, Scanned, Tables,
)
from purger.core.policy_set import COMMON_FIELDS  # noqa: E402
from purger.reconcile.verdict import RowVerdict, page_verdicts, routed_events, row_verdict  # noqa: E402
from purger.core.times import (  # noqa: E402
    epoch_ms, format_epoch_ms, format_timestamp, from_epoch_ms, parse_timestamp,
)
from purger.core.vocabulary import WOULD_DELETE  # noqa: E402
from purger.policies import build_policy_set, rule_events, units_of_work, users  # noqa: E402
from purger.policies.mailbox import deletes  # noqa: E402
from tests.support.memory import MemoryFailures, MemoryHolds  # noqa: E402
from purger.policies.rule_events import STATUSES  # noqa: E402
from purger.policies.units_of_work import JOURNEY_TYPES  # noqa: E402
from purger.streams.parse import MAX_ID_LENGTH, event_fields  # noqa: E402

NOW = datetime(2026, 3, 1, 12, 0)  # naive UTC, as the driver returns timestamps
NOW_MS = epoch_ms(NOW)
DCS = ("dc1", "dc2")
POLICIES = build_policy_set({
    "mailbox": {"expired_ttl": "3h", "incomplete_ttl": "2h", "deleted_ttl": "0", "payload_grace": "1h"},
    "rule_events": {"enabled": True, "complete": "2h", "failed": "3h", "unprocessed": "4h", "processing": "5h"},
    "users": {"enabled": True, "data_centres": list(DCS), "user_grace": "2h"},
    "units_of_work": {"enabled": True, "retention_period": "P2D", "archived_dependent_journey_types": ["BULK"]},
    "push_clients": {"enabled": True, "module": "push_clients_policy", "inactive_after": "2h"},
})
POLICY = {policy.name: policy for policy in POLICIES.policies}
PAYLOAD_GRACE = POLICY["mailbox"].settings.payload_grace
FIELDS = {f.name: f for f in event_fields(POLICIES)}
TIMESTAMP_TEXT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
INTEGER_BITS = {"int": 31, "long": 63}


@pytest.fixture(autouse=True, scope="module")
def frozen_clock():
    """The stream's verdict and the delete-time decision read the same wall clock: ``NOW``."""
    with ExitStack() as stack:
        for module in (core_events, purge_protocol, rule_events, users, units_of_work, deletes, push_clients_policy):
            stack.enter_context(mock.patch.object(module, "now_ms", lambda: NOW_MS))
        yield


# --- rows and real events -------------------------------------------------------------------------

ids = st.text(alphabet="abc123", min_size=1, max_size=6)


def maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.none() | strategy


def moments(earliest_hours: int = -8, latest_hours: int = 8) -> st.SearchStrategy[datetime]:
    """Around ``NOW`` by whole hours (the periods are hours: deadlines fall on ``NOW``), give or take a millisecond."""
    return st.builds(lambda hours, ms: NOW + timedelta(hours=hours, milliseconds=ms),
                     st.integers(earliest_hours, latest_hours), st.sampled_from((0, 0, 0, -1, 1)))


# A unit's times: days back, across the P2D lower bound (2026-02-27T00:00) and the start of today.
days = moments(-120, 24)

# Every timestamp the Cassandra driver decodes (year 1 to 9999: a datetime holds no other), in milliseconds.
FIRST_MS = (datetime.min - datetime(1970, 1, 1)) // timedelta(milliseconds=1)
LAST_MS = (datetime.max - datetime(1970, 1, 1)) // timedelta(milliseconds=1)


def decoded(ms: int) -> datetime:
    """A timestamp cell as the driver decodes it (``DateType``): through a float of seconds, so a few microseconds
    off its millisecond far from 1970."""
    return DateType.deserialize(int64_pack(ms), 4)


# Any of them, or one around NOW (where ties are).
instants = moments() | st.integers(FIRST_MS, LAST_MS).map(decoded)
# A write time (microseconds) anywhere in that range, or around NOW.
write_times = st.builds(lambda moment, micros: epoch_ms(moment) * 1000 + micros, moments(), st.integers(0, 999)) | \
    st.integers(FIRST_MS * 1000, LAST_MS * 1000 + 999)


def at(moment: datetime) -> str:
    """A timestamp field's text, as producers write it."""
    return format_timestamp(moment.replace(tzinfo=timezone.utc))


def record(event_type: str, moment: datetime, **fields: Any) -> dict[str, Any]:
    """A real event, as a producer writes it (its ``event_id`` is given when the test gathers them)."""
    return {"type": event_type, "event_time": at(moment),
            **{name: value for name, value in fields.items() if value is not None}}


@dataclass(frozen=True)
class Sample:
    """A scanned row and, for a payload, the messages still referring to it (its ``payload_refs`` rows)."""

    row: dict[str, Any]
    refs: tuple[str, ...] = ()


def micros(moment: datetime) -> int:
    """A write time, as ``writetime()`` gives it: microseconds since the epoch."""
    return epoch_ms(moment) * 1000


def written(row: dict[str, Any], scanned: Scanned, times: Callable[[str], int]) -> dict[str, int | None]:
    """What the scan reads of the row's write times (``Scanned.selected``): ``times(column)`` for each cell set."""
    return {f"writetime_{column}": None if row[column] is None else times(column) for column in scanned.written}


def undated(row: dict[str, Any], scanned: Scanned) -> bool:
    """Neither a timestamp nor a write time to date the row by."""
    return all(row[f"writetime_{column}"] is None for column in scanned.written)


@st.composite
def message_rows(draw: Any) -> Sample:
    # The insert writes the enqueue's columns together (with created_at = updated_at); a row without them is one
    # an update wrote on its own (after its purge, say). Every platform write sets updated_at, never before
    # created_at; another writer's may not (SPEC 8.1): such a row is dated by its cells' write times, drawn apart.
    inserted = draw(st.booleans())
    created = draw(moments()) if inserted else None
    updated = draw(st.none() | (moments() if created is None else
                                st.integers(0, 6).map(lambda hours: created + timedelta(hours=hours))))
    row = {
        "message_id": draw(ids), "mailbox": "inbox" if inserted else None,
        "payload_id": draw(ids) if inserted else None,
        "payload_size": draw(st.integers(0, 10**12)) if inserted else None,
        "inline_payload": draw(maybe(st.just(b"bytes"))) if inserted else None,
        "extract_count": draw(st.sampled_from((None, 0, 0, 1, 3))), "extract_until": draw(maybe(moments())),
        "complete": draw(st.sampled_from((True, False, None) if inserted else (True, None))),
        "deleted": draw(st.sampled_from((None, False, False, True))), "created_at": created, "updated_at": updated,
    }
    # Microseconds past a millisecond too: a write time counts to the millisecond, as a timestamp does.
    return Sample({**row, **written(row, deletes.MESSAGES,
                                    lambda column: micros(draw(moments())) + draw(st.integers(0, 999)))})


@st.composite
def payload_rows(draw: Any) -> Sample:
    state = draw(st.sampled_from(("live", "deleting", None)))
    last_ref = draw(maybe(moments()))
    state_written = draw(moments())
    if state == "deleting":
        # The writer contract: claimed only once the last link is a grace old and no reference is left; the
        # claim wrote the state, before now.
        last_ref = last_ref and min(last_ref, NOW - PAYLOAD_GRACE)
        state_written = min(state_written, NOW)
        refs: tuple[str, ...] = ()
    else:
        refs = tuple(draw(st.lists(ids, max_size=2, unique=True)))
    dcs = draw(maybe(st.sets(st.sampled_from(DCS), min_size=1)))
    row = {"payload_id": draw(ids), "dcs": dcs, "state": state, "last_ref_at": last_ref}
    # What the scan says beside the row: whether payload_refs holds a partition for it.
    return Sample({**row, **written(row, deletes.PAYLOADS, lambda column: micros(state_written)),
                   "referenced": bool(refs)}, refs)


def rows_of(scanned: Scanned | None = None, **columns: st.SearchStrategy) -> st.SearchStrategy[Sample]:
    """Rows of ``columns``; with ``scanned``, each cell of ``scanned.written`` set with its write time (around NOW)."""
    if scanned is None:
        return st.fixed_dictionaries(columns).map(Sample)
    return st.fixed_dictionaries(columns).flatmap(lambda row: st.builds(
        lambda written_at, past: Sample({**row, **written(row, scanned, lambda column: micros(written_at) + past)}),
        moments(), st.integers(0, 999)))


def scanned_of(policy: str) -> Scanned:
    [scanned] = POLICY[policy].scanned
    return scanned


USER_GRACE = POLICY["users"].settings.user_grace


def unit_due(row: dict[str, Any]) -> bool:
    """The claim's condition on a unit of work: due by its row now (a purge claims only a due unit)."""
    first = units_of_work.first_eligible_day(units_of_work.row_state(row), POLICY["units_of_work"].settings)
    return first is not None and units_of_work.day_start_ms(first) <= NOW_MS


def message_events(row: dict[str, Any]) -> st.SearchStrategy[list[dict[str, Any]]]:
    # Every copy of the enqueue names the same message, mailbox and payload; it may say otherwise of its upload,
    # counter, date and data centres than the row does now.
    same = {"mailbox": row["mailbox"] or "inbox", "payload_id": row["payload_id"] or "p",
            "payload_size": row["payload_size"] if row["payload_size"] is not None else 5,
            "inline": row["inline_payload"] is not None}
    message = {"message_id": row["message_id"]}
    return st.lists(st.one_of(
        st.builds(lambda t, complete, dcs, count, until: record(
            "enqueue", t, **message, **same, complete=complete, dcs=dcs, extract_count=count,
            extract_until=until and at(until)),
            moments(), st.booleans(), st.lists(st.sampled_from(DCS), unique=True), maybe(st.integers(0, 3)),
            maybe(moments())),
        st.builds(lambda t, kind, count: record(kind, t, **message, extract_count=count),
                  moments(), st.sampled_from(("dequeue", "extract_counter")), st.integers(0, 3)),
        st.builds(lambda t, until: record("extract_until", t, **message, extract_until=until and at(until)),
                  moments(), maybe(moments())),
        st.builds(lambda t, kind: record(kind, t, **message),
                  moments(), st.sampled_from(("upload_complete", "delete"))),
    ), max_size=6)


def payload_events(row: dict[str, Any]) -> st.SearchStrategy[list[dict[str, Any]]]:
    payload = {"payload_id": row["payload_id"]}
    return st.lists(st.one_of(
        st.builds(lambda t, message, dcs: record(
            "enqueue", t, message_id=message, mailbox="inbox", **payload, payload_size=5, inline=False,
            complete=True, dcs=dcs), moments(), ids, st.lists(st.sampled_from(DCS), unique=True)),
        st.builds(lambda t, seen, dcs: record("payload_released", t, **payload, observed_at=at(seen), dcs=dcs),
                  moments(), moments(), st.lists(st.sampled_from(DCS), unique=True)),
    ), max_size=6)


def events_of(build: Callable[..., dict[str, Any]], *strategies: st.SearchStrategy):
    return lambda row: st.lists(st.builds(lambda *values: build(row, *values), *strategies), max_size=6)


@dataclass(frozen=True)
class Table:
    """A scanned table under test: its policy, its rows, the real events of a row's object, when a row says nothing
    (``row_events`` gives []), and for ``deletes_first`` kinds the rules whose conditions the delete carries."""

    policy: str
    table: str
    rows: st.SearchStrategy[Sample]
    real_events: Callable[[dict[str, Any]], st.SearchStrategy[list[dict[str, Any]]]]
    says_nothing: Callable[[dict[str, Any]], bool]
    rules: Callable[[Any], dict[str, Rule]] | None = None
    # With ``rules``: the row as its purge sees it, for a rule's period on a row without ``updated_at``.
    row_state: Callable[[dict[str, Any]], Any] | None = None

    @property
    def scanned(self) -> Scanned:
        return next(s for s in POLICY[self.policy].scanned if s.table == self.table)

    def __str__(self) -> str:
        return f"{self.policy}.{self.table}"


TABLES = [
    # Rows without updated_at too (SPEC 8.1), dated by their cells' write time.
    Table("rule_events", "rule_events",
          rows_of(scanned_of("rule_events"), rule_event_id=ids, status=st.sampled_from((*STATUSES, None, "ARCHIVED")),
                  updated_at=maybe(moments())),
          events_of(lambda row, t, status: record("rule_event_status", t, rule_event_id=row["rule_event_id"],
                                                  status=status), moments(), st.sampled_from(STATUSES)),
          lambda row: row["status"] not in STATUSES or (
              row["updated_at"] is None and undated(row, scanned_of("rule_events"))),
          rules=lambda policy: policy.rules, row_state=rule_events._row_state),
    Table("users", "users",
          rows_of(scanned_of("users"), user_id=ids,
                  present_in=st.sampled_from((None, {"dc1"}, {"dc2"}, set(DCS), {"dc3"}, {"dc1", "dc3"})),
                  state=st.sampled_from(("live", "live", "purging", None)), updated_at=maybe(moments()))
          # The claim's condition: absent everywhere, a grace ago (the claim's write of the state in the past).
          .filter(lambda sample: sample.row["state"] != "purging" or (
              sample.row["present_in"] is None and (
                  sample.row["updated_at"] <= NOW - USER_GRACE if sample.row["updated_at"] is not None
                  else sample.row["writetime_state"] <= micros(NOW)))),
          events_of(lambda row, t, kind, dc: record(kind, t, user_id=row["user_id"], dc=dc),
                    moments(), st.sampled_from(("user_added", "user_removed")), st.sampled_from((*DCS, "dc3"))),
          lambda row: row["state"] is None or (row["updated_at"] is None and undated(row, scanned_of("users")))
          or "dc3" in (row["present_in"] or ())),
    Table("units_of_work", "units_of_work",
          rows_of(unit_of_work_id=ids, journey_type=st.sampled_from((*JOURNEY_TYPES, "BULK", None)),
                  started_at=maybe(days), finished_at=maybe(days), archived_at=maybe(days),
                  purge_started_at=st.one_of(st.none(), st.none(), st.none(), moments()))
          .filter(lambda sample: sample.row["purge_started_at"] is None or unit_due(sample.row)),
          events_of(lambda row, t, kind, journey: record(kind, t, unit_of_work_id=row["unit_of_work_id"],
                                                         journey_type=journey if kind == "uow_started" else None),
                    days, st.sampled_from(("uow_started", "uow_finished", "uow_archived")),
                    st.sampled_from(JOURNEY_TYPES)),
          lambda row: row["started_at"] is None or row["journey_type"] is None),
    Table("push_clients", "push_routers",
          rows_of(client_id=ids, last_connected_at=maybe(moments()), purging=maybe(st.just(True)))
          # The claim's condition: inactive for inactive_after.
          .filter(lambda sample: not sample.row["purging"] or (
              sample.row["last_connected_at"] is not None
              and sample.row["last_connected_at"] <= NOW - POLICY["push_clients"].settings.inactive_after)),
          events_of(lambda row, t, kind: record(kind, t, client_id=row["client_id"]),
                    moments(), st.sampled_from(("push_client_registered", "push_client_connected"))),
          lambda row: row["last_connected_at"] is None),
    Table("mailbox", "messages", message_rows(), message_events,
          lambda row: (row["updated_at"] is None and undated(row, deletes.MESSAGES)) or (
              row["created_at"] is None and not row["complete"] and row["extract_count"] is None
              and row["extract_until"] is None and not row["deleted"]),
          rules=lambda policy: policy.retention.message_rules, row_state=deletes.row_state),
    Table("mailbox", "payloads", payload_rows(), payload_events,
          lambda row: (row["last_ref_at"] is None and undated(row, deletes.PAYLOADS)) or row["state"] is None or (
              row["state"] == "live" and row["referenced"])),
]


# --- the stream's checks, the delete-time decision --------------------------------------------------


def stream_errors(policy: Policy, found: dict[str, Any]) -> list[str]:
    """Why the stream would dead-letter ``found`` read from the reconcile topic (``streams.parse``): its type is the
    policy's own (a control type only if the policy declares it so), every field it must carry is there, and each
    field has its type, length, sign and choices."""
    own = {t.name: t for t in policy.event_types}
    event_type = own.get(found.get("type"))
    if event_type is None:
        return [f"type {found.get('type')!r} is none of policy {policy.name}'s"]
    errors = [f"{event_type.name} event lacks field {name}" for name in
              (*COMMON_FIELDS, event_type.id_field, *event_type.required) if found.get(name) is None]
    for name, value in found.items():
        known = FIELDS.get(name)
        if known is None:
            errors.append(f"unknown field {name}")
        elif not _has_type(known, value):
            errors.append(f"field {name} has the wrong type: {value!r}")
        elif (known.identifier and len(value) > MAX_ID_LENGTH) or (known.non_negative and value < 0) or (
                known.choices and value not in known.choices):
            errors.append(f"field {name} is out of bounds: {value!r}")
    if json.loads(json.dumps(found)) != found:
        errors.append("not the same once written as JSON")
    return errors


def _has_type(known: EventField, value: Any) -> bool:
    if known.type == "string":
        return isinstance(value, str)
    if known.type == "timestamp":
        return isinstance(value, str) and TIMESTAMP_TEXT.fullmatch(value) is not None and parse_timestamp(value) > 0
    if known.type in INTEGER_BITS:
        bits = INTEGER_BITS[known.type]
        return isinstance(value, int) and not isinstance(value, bool) and -(2**bits) <= value < 2**bits
    if known.type == "boolean":
        return isinstance(value, bool)
    return isinstance(value, list) and all(isinstance(each, str) for each in value)


Ref = namedtuple("Ref", "message_id")


class RowTables(Tables):
    """A policy's tables holding one row of ``table`` and the ``payload_refs`` rows of ``refs``; a dry run writes
    nothing."""

    def __init__(self, table: str, row: dict[str, Any], refs: tuple[str, ...]) -> None:
        self.table, self.row, self.refs = table, namedtuple("Row", row)(**row), refs

    def prepare(self, cql: str, consistency: str = "configured") -> str:
        return re.search(r"FROM \{(\w+)\}", cql).group(1) if "FROM" in cql else cql

    def one(self, statement: Any, *values: Any, serial: bool = False) -> Any | None:
        return self.row if statement == self.table else None

    def all(self, statement: Any, *values: Any) -> list[Any]:
        return [Ref(message) for message in self.refs] if statement == "payload_refs" else []

    def applied(self, statement: Any, *values: Any) -> bool:
        raise AssertionError("a dry run writes nothing")

    def execute(self, statement: Any, *values: Any) -> None:
        raise AssertionError("a dry run writes nothing")


class NoControl(Control):
    def recheck(self, kind: str, object_id: str, rule: str, at_ms: int) -> None:
        raise AssertionError("a dry run sends no recheck")

    def report(self, event_type: str, object_id: str, event_time_ms: int, **fields: Any) -> None:
        raise AssertionError("a dry run reports nothing")


def purged_now(table: Table, sample: Sample) -> bool:
    """The delete-time decision on the row now: a claimed row is finished by the real run; otherwise the dry run,
    which decides as the real run does (read, claimed?, due?), says ``would_delete``."""
    scanned = table.scanned
    tables = RowTables(scanned.table, sample.row, sample.refs)
    resources = Resources(lambda names: tables, stores=None, control=NoControl(), journal=None, holds=MemoryHolds(),
                          failures=MemoryFailures(), retry_ms=1_000, dry_run=True)
    purge = POLICY[table.policy].purges(resources)[scanned.kind]
    candidate = Candidate(scanned.kind, str(sample.row[scanned.id_column]), "", 0)
    if purge.claimed(purge.read(candidate)):
        return True
    return [outcome.status for outcome in purge.purge(candidate, Attempt())][-1] == WOULD_DELETE


def holds(rule: Rule, row: dict[str, Any], state: Any) -> bool:
    """The CQL condition the rule's delete carries on the row, as Cassandra reads it (a comparison with null is
    false, ``= null`` true of a null cell), its ``?`` bound to the rule's cutoff. On a row without ``updated_at``, a
    rule whose condition reads it carries its undated condition, once its period has passed since the row's
    write time by ``state``, the row as its purge sees it (``RuleWrite``)."""
    condition = rule.condition
    if rule.undated and row["updated_at"] is None:
        eligible_at = rule.eligible_at(state)
        if eligible_at is None or eligible_at > NOW_MS:
            return False
        condition = rule.undated
    literals = {"?": rule.cutoff().replace(tzinfo=None), "0": 0, "true": True, "false": False}
    for clause in condition.split(" AND "):
        column, operator, operand = clause.split(" ", 2)
        value, bound = row[column], literals.get(operand, operand.strip("'"))
        if operand == "null":
            if value is not None:
                return False
        elif value is None or not (value == bound if operator == "=" else value <= bound):
            return False
    return True


def verdict_due(table: Table, row: dict[str, Any]) -> tuple[bool, RowVerdict]:
    """Whether the row's own events make its object due now, and the verdict that says so."""
    verdict = row_verdict(POLICIES, table.scanned, row)
    return verdict.eligible_at_ms is not None and verdict.eligible_at_ms <= NOW_MS, verdict


def fold_all(records: list[dict[str, Any]], random: _random.Random) -> dict[tuple[str, str], Any]:
    """Each object's state, its events routed as the stream routes them, some twice, folded in random batches."""
    by_object: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for found in records:
        for kind, object_id, event in routed_events(POLICIES, found):
            by_object[(kind, object_id)].append(event)
    states = {}
    for (kind, object_id), events in by_object.items():
        arrivals = events + random.sample(events, k=len(events) // 2)
        random.shuffle(arrivals)
        state = None
        while arrivals:
            cut = random.randint(1, len(arrivals))
            state, arrivals = POLICIES.kind(kind).fold(state, arrivals[:cut]), arrivals[cut:]
        states[(kind, object_id)] = state
    return states


# --- the properties --------------------------------------------------------------------------------


def test_every_table_judged_on_whole_columns_is_tested():
    judged = {str(table) for table in TABLES
              if POLICY[table.policy].page_verdicts(table.table, {n: [] for n in table.scanned.row_fields}) is not None}
    assert judged == {str(table) for table in COLUMNAR}


def test_every_scanned_table_is_tested():
    assert {(p.name, s.table) for p in POLICIES.policies for s in p.scanned} == {(t.policy, t.table) for t in TABLES}


@pytest.mark.parametrize("table", TABLES, ids=str)
def test_each_scanned_table_is_a_table_of_the_policy_read_by_its_key(table):
    policy, scanned = POLICY[table.policy], table.scanned
    assert scanned.table in policy.tables and scanned.id_column in scanned.columns
    assert scanned.kind in {kind.name for kind in policy.kinds}


@pytest.mark.parametrize("table", TABLES, ids=str)
def test_a_rows_records_pass_the_streams_checks_and_say_nothing_only_when_documented(table):
    @settings(max_examples=150, deadline=None)
    @given(table.rows)
    def check(sample):
        assert set(sample.row) == set(table.scanned.row_fields)  # the rows here hold what the scan reads
        records = POLICY[table.policy].row_events(table.table, sample.row)
        assert (records == []) == table.says_nothing(sample.row)
        for found in records:
            assert stream_errors(POLICY[table.policy], found) == [], found
            assert found[POLICIES.event_types[found["type"]].id_field] == sample.row[table.scanned.id_column]

    check()


@pytest.mark.parametrize("table", TABLES, ids=str)
def test_the_verdict_says_due_exactly_when_the_delete_time_decision_purges_the_row(table):
    @settings(max_examples=400, deadline=None)
    @given(table.rows)
    def check(sample):
        is_due, verdict = verdict_due(table, sample.row)
        if not verdict.records:
            assert not is_due
            return
        assert is_due == purged_now(table, sample)
        if table.rules is not None:  # the conditional DELETE of the verdict's rule applies exactly then
            rules = table.rules(POLICY[table.policy])
            state = table.row_state(sample.row)
            assert is_due == any(holds(rule, sample.row, state) for rule in rules.values())
            assert not is_due or holds(rules[verdict.rule], sample.row, state)

    check()


@pytest.mark.parametrize("table", TABLES, ids=str)
def test_every_scan_of_a_row_gives_the_same_records(table):
    @settings(max_examples=50, deadline=None)
    @given(table.rows)
    def check(sample):
        policy = POLICY[table.policy]
        first = policy.row_events(table.table, dict(sample.row))
        assert first == policy.row_events(table.table, dict(sample.row))
        assert all(found["event_id"].startswith(f"reconcile:{table.table}:") for found in first)

    check()


@pytest.mark.parametrize("table", TABLES, ids=str)
def test_a_rows_events_and_the_real_ones_fold_alike_in_any_order(table):
    @settings(max_examples=100, deadline=None)
    @given(table.rows.flatmap(lambda sample: st.tuples(st.just(sample), table.real_events(sample.row))),
           st.integers(), st.integers())
    def check(drawn, one, another):
        sample, real = drawn
        records = POLICY[table.policy].row_events(table.table, sample.row) + [
            {"event_id": f"real-{number}", **found} for number, found in enumerate(real)]
        assert fold_all(records, _random.Random(one)) == fold_all(records, _random.Random(another))

    check()


@st.composite
def any_message_rows(draw: Any) -> Sample:
    """``messages`` rows no platform writes: each cell set or not on its own, ``updated_at`` before ``created_at``,
    timestamps and write times anywhere the driver decodes them."""
    row = {"message_id": draw(ids), "mailbox": draw(maybe(st.just("inbox"))), "payload_id": draw(maybe(ids)),
           "payload_size": draw(maybe(st.integers(0, 10**12))), "inline_payload": draw(maybe(st.just(b"bytes"))),
           "extract_count": draw(st.sampled_from((None, 0, 0, 1, 3))), "extract_until": draw(maybe(instants)),
           "complete": draw(st.sampled_from((True, False, None))),
           "deleted": draw(st.sampled_from((None, False, True))),
           "created_at": draw(maybe(instants)), "updated_at": draw(maybe(instants))}
    return Sample({**row, **written(row, deletes.MESSAGES, lambda column: draw(write_times))})


# The tables a policy judges on whole columns (``Policy.page_verdicts``); the others go a row at a time.
COLUMNAR = [table for table in TABLES if str(table) == "mailbox.messages"]


@pytest.mark.parametrize("table", [*COLUMNAR, Table("mailbox", "messages", any_message_rows(), message_events,
                                                    lambda row: False)], ids=str)
def test_a_page_judged_on_whole_columns_is_each_of_its_rows_judged_alone(table):
    """``Policy.page_verdicts`` (the scan's) against ``row_verdict`` (the fold of each row's records)."""
    @settings(max_examples=300, deadline=None)
    @given(st.lists(table.rows, max_size=6))
    def check(samples):
        names = list(table.scanned.row_fields)
        alone = [row_verdict(POLICIES, table.scanned, sample.row) for sample in samples]
        page = page_verdicts(POLICIES, table.scanned, names, [tuple(s.row[n] for n in names) for s in samples])
        assert page == PageVerdicts([bool(v.records) for v in alone], [v.rule for v in alone],
                                    [v.eligible_at_ms for v in alone])

    check()


@settings(max_examples=1000, deadline=None)
@given(st.integers(FIRST_MS, LAST_MS))
@example(1_096_401_405_843)  # 2004-09-28T19:56:45.843Z: a float of its seconds, times 1000, is a millisecond short
def test_a_timestamp_the_driver_decodes_is_its_millisecond_in_every_conversion(ms):
    assert epoch_ms(decoded(ms)) == ms
    assert parse_timestamp(format_epoch_ms(ms)) == ms and epoch_ms(from_epoch_ms(ms)) == ms
    assert TIMESTAMP_TEXT.fullmatch(format_epoch_ms(ms))


# --- the mailbox's choices, by example ---------------------------------------------------------------

MAILBOX = POLICY["mailbox"]


def a_message(written_at: datetime = NOW - timedelta(days=2), **columns: Any) -> dict[str, Any]:
    """A ``messages`` row as the scan reads it, each cell set written at ``written_at``."""
    row = {"message_id": "m1", "mailbox": "inbox", "payload_id": "p1", "payload_size": 20_000, "inline_payload": None,
           "extract_count": None, "extract_until": None, "complete": True, "deleted": None,
           "created_at": NOW - timedelta(days=2), "updated_at": NOW - timedelta(days=1), **columns}
    return {**row, **written(row, deletes.MESSAGES, lambda column: micros(written_at))}


def test_a_message_with_its_counter_at_0_is_its_enqueue_at_created_at_and_the_counter_at_updated_at():
    records = MAILBOX.row_events("messages", a_message(extract_count=0, complete=False))
    assert [(r["type"], r["event_time"]) for r in records] == [
        ("enqueue", "2026-02-27T12:00:00.000Z"), ("extract_counter", "2026-02-28T12:00:00.000Z")]
    assert records[0]["event_id"].startswith("reconcile:messages:m1:enqueue:2026-02-27T12:00:00.000Z:")
    assert records[0] == {
        "event_id": records[0]["event_id"], "type": "enqueue",
        "event_time": "2026-02-27T12:00:00.000Z", "message_id": "m1", "mailbox": "inbox", "payload_id": "p1",
        "payload_size": 20_000, "inline": False, "complete": False, "dcs": []}
    assert records[1]["extract_count"] == 0


def test_the_rows_enqueue_keeps_the_real_ones_data_centres_and_its_own_completed_upload():
    """The row knows no data centres and only that the upload is complete now; the real enqueue, sent while it ran,
    knew the data centres. Whichever comes first, the message is complete and its blobs are where the real one said."""
    real = {"event_id": "e1", "type": "enqueue", "event_time": at(NOW - timedelta(days=2)), "message_id": "m1",
            "mailbox": "inbox", "payload_id": "p1", "payload_size": 20_000, "inline": False, "complete": False,
            "dcs": ["dc2", "dc1"]}
    records = [real, *MAILBOX.row_events("messages", a_message())]
    for order in range(5):
        states = fold_all(records, _random.Random(order))
        assert states[("message", "m1")].complete is True and states[("message", "m1")].dcs == DCS
        assert states[("payload", "p1")].dcs == DCS


@pytest.mark.parametrize("unreferenced", [{"state": "deleting", "referenced": False},
                                          {"state": "live", "referenced": False}], ids=["claimed", "unreferenced"])
def test_a_referenced_payload_says_nothing_and_an_unreferenced_one_is_released_after_its_last_link(unreferenced):
    """A claimed payload, or a live one with no ``payload_refs`` partition: its release is observed a grace after its
    last link, so the enqueue that made that link, a moment after the writer set ``last_ref_at``, does not outrank
    it: the payload stays due."""
    last_ref = NOW - timedelta(days=1)
    row = {"payload_id": "p1", "dcs": {"dc1"}, "state": "live", "last_ref_at": last_ref, "referenced": True}
    assert MAILBOX.row_events("payloads", row) == []
    link = {"event_id": "e1", "type": "enqueue", "event_time": at(last_ref + timedelta(milliseconds=5)),
            "message_id": "m1", "mailbox": "inbox", "payload_id": "p1", "payload_size": 5, "inline": False,
            "complete": True, "dcs": ["dc1", "dc2"]}
    released = MAILBOX.row_events("payloads", {**row, **unreferenced})
    assert [(r["type"], r["event_time"], r["dcs"]) for r in released] == [("payload_released", at(last_ref), ["dc1"])]
    state = fold_all([link, *released], _random.Random(0))[("payload", "p1")]
    assert MAILBOX.kinds[1].eligibility(state).eligible_at_ms == epoch_ms(last_ref + PAYLOAD_GRACE)


# --- a row without its rule's timestamp (SPEC 8.1), by example ---------------------------------------

MESSAGES_TABLE, PAYLOADS_TABLE = (next(t for t in TABLES if t.table == table) for table in ("messages", "payloads"))
EXPIRED_TTL = MAILBOX.settings.expired_ttl


def test_a_message_without_updated_at_is_dated_by_the_latest_write_time_of_its_cells():
    """Left without ``updated_at`` by a writer other than the platform: its counter at 0 since the latest write of
    its cells (to the millisecond), neither skipped nor due at once; the check at delete time dates it alike."""
    inserted, zeroed = NOW - timedelta(hours=5), NOW - timedelta(hours=2)
    row = {**a_message(inserted, created_at=inserted, extract_count=0, updated_at=None),
           "writetime_extract_count": micros(zeroed) + 999}
    records = MAILBOX.row_events("messages", row)
    assert [(r["type"], r["event_time"]) for r in records] == [
        ("enqueue", at(inserted)), ("upload_complete", at(zeroed)), ("extract_counter", at(zeroed))]
    verdict = row_verdict(POLICIES, deletes.MESSAGES, row)
    assert (verdict.rule, verdict.eligible_at_ms) == ("expired_by_counter", epoch_ms(zeroed + EXPIRED_TTL))
    assert not purged_now(MESSAGES_TABLE, Sample(row))
    assert purged_now(MESSAGES_TABLE, Sample({**row, "writetime_extract_count": micros(NOW - EXPIRED_TTL)}))
    # Written by a clock behind the one that set created_at: dated at created_at, or its enqueue would outrank it.
    behind = {**row, **written(row, deletes.MESSAGES, lambda column: micros(inserted - timedelta(seconds=1)))}
    assert {r["event_time"] for r in MAILBOX.row_events("messages", behind)} == {at(inserted)}
    assert row_verdict(POLICIES, deletes.MESSAGES, behind).eligible_at_ms == epoch_ms(inserted + EXPIRED_TTL)


@pytest.mark.parametrize("state, released_before", [("live", timedelta(0)), ("deleting", PAYLOAD_GRACE)])
def test_a_payload_without_last_ref_at_is_released_at_the_write_time_of_its_state(state, released_before):
    """No writer linked it by the contract, which sets ``last_ref_at``: a live one, unreferenced, is released when its
    state was written (its insert), due a grace later. A claimed one's state is the claim's, which found it a grace
    old: released a grace before, due at once (the real run finishes it)."""
    state_written = NOW - timedelta(minutes=30)
    row = {"payload_id": "p1", "dcs": {"dc1"}, "state": state, "last_ref_at": None,
           "writetime_state": micros(state_written) + 1, "referenced": False}
    [released] = MAILBOX.row_events("payloads", row)
    released_at = state_written - released_before
    assert (released["type"], released["event_time"], released["observed_at"]) == (
        "payload_released", at(released_at), at(released_at + PAYLOAD_GRACE))
    verdict = row_verdict(POLICIES, deletes.PAYLOADS, row)
    assert verdict.eligible_at_ms == epoch_ms(released_at + PAYLOAD_GRACE)
    assert purged_now(PAYLOADS_TABLE, Sample(row)) == (state == "deleting")


RULE_EVENTS_TABLE, USERS_TABLE = (next(t for t in TABLES if t.table == table) for table in ("rule_events", "users"))
COMPLETE_PERIOD = POLICY["rule_events"].settings.complete


def test_a_rule_event_without_updated_at_is_its_status_since_the_write_time_of_its_status():
    """Left without ``updated_at`` by a writer other than the platform: its status since its status cell was written
    (to the millisecond), neither skipped nor due at once; the check at delete time dates it alike."""
    changed = NOW - timedelta(hours=1)
    row = {"rule_event_id": "r1", "status": "COMPLETE", "updated_at": None, "writetime_status": micros(changed) + 999}
    assert set(row) == set(RULE_EVENTS_TABLE.scanned.row_fields)
    [status] = POLICY["rule_events"].row_events("rule_events", row)
    assert (status["type"], status["event_time"], status["status"]) == ("rule_event_status", at(changed), "COMPLETE")
    verdict = row_verdict(POLICIES, RULE_EVENTS_TABLE.scanned, row)
    assert (verdict.rule, verdict.eligible_at_ms) == ("rule_event_complete", epoch_ms(changed + COMPLETE_PERIOD))
    assert not purged_now(RULE_EVENTS_TABLE, Sample(row))
    assert purged_now(RULE_EVENTS_TABLE, Sample({**row, "writetime_status": micros(NOW - COMPLETE_PERIOD)}))


@pytest.mark.parametrize("state, absent_before", [("live", timedelta(0)), ("purging", USER_GRACE)])
def test_a_user_without_updated_at_is_absent_since_the_write_time_of_its_state(state, absent_before):
    """Written by no writer of the contract, which sets ``updated_at``: a live user absent everywhere is absent since
    its state was written (its insert), due a grace later. A claimed one's state is the claim's, which found it
    absent a grace old: absent a grace before, due at once (the real run finishes it)."""
    state_written = NOW - timedelta(minutes=30)
    row = {"user_id": "u1", "present_in": None, "state": state, "updated_at": None,
           "writetime_state": micros(state_written) + 1}
    assert set(row) == set(USERS_TABLE.scanned.row_fields)
    absent_since = state_written - absent_before
    assert [(r["type"], r["dc"], r["event_time"]) for r in POLICY["users"].row_events("users", row)] == [
        ("user_removed", dc, at(absent_since)) for dc in DCS]
    verdict = row_verdict(POLICIES, USERS_TABLE.scanned, row)
    assert verdict.eligible_at_ms == epoch_ms(absent_since + USER_GRACE)
    assert purged_now(USERS_TABLE, Sample(row)) == (state == "purging")


def test_a_row_with_neither_its_timestamp_nor_a_write_time_says_nothing_and_is_not_due():
    message = a_message(updated_at=None, **{column: None for column in deletes.MESSAGES.written})
    payload = {"payload_id": "p1", "dcs": None, "state": None, "last_ref_at": None, "writetime_state": None,
               "referenced": False}
    for table, row in ((MESSAGES_TABLE, message), (PAYLOADS_TABLE, payload)):
        assert set(row) == set(table.scanned.row_fields)
        assert MAILBOX.row_events(table.table, row) == []
        assert not purged_now(table, Sample(row))

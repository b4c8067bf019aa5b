"""Every built-in policy through the whole job on the real servers (docs/policies.md): events through Kafka,
the stateful stage, double-checked deletes in Cassandra, the ledger and the daily report.

One purger runs ``rule_events``, ``users`` and ``units_of_work`` (and ``mailbox``, idle) for the four tests
of ``TestOnePurgerForThreePolicies``; the platform stand-ins write every case's rows once, and all their events are held back,
then sent shuffled and twice. Its periods (event time; the double-check reads the wall clock):

- ``rule_events``: complete 3s, failed 4s, unprocessed 20s, processing 1h. Unprocessed is longer than
  failed, so a FAILED rule event retried (UNPROCESSED) after its failed period is seen kept before its own
  period passes; processing is long, so one raised now is kept for the whole module.
- ``users``: grace 3s over dc1 and dc2.
- ``units_of_work``: the default P2Y, with the units-of-work cases of docs/policies.md moved to today (dated years back).

For ``TestAPurgerOfItsOwn``, a purger with ``mailbox`` and ``units_of_work`` only runs the examples whose
settings are not the defaults (``terminal_only``, archived-dependent BULK) and receives events of a built-in
policy it does not enable (``users``).

The cores are shared, so no two of the module's purgers run at once: each is a fixture of its class's scope,
stopped when its class's last test is done, whichever class runs first (or alone, with ``-k``);
``the_only_purger`` fails a start that would overlap another rather than let them share the cores.

The daily report is read as the running purger rewrites it (``ledger.report_interval``, 2 s here): a
``Report.refresh`` of the test's own would race that one for the same Delta partition.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

import pytest
from kafka import KafkaConsumer
from pyspark.sql import functions as F

from purger.config import with_policies
from purger.core.times import format_timestamp, now_ms
from purger.policies.rule_events import COMPLETE, FAILED, PROCESSING, UNPROCESSED
from purger.policies.units_of_work import Period, day_of
from purger.running import start_purger
from simulation.policy_objects import CHILDREN, PolicyObject, ledger_rows, mailboxes
from simulation.rule_events import RuleEventsPlatform
from simulation.units_of_work import EXAMPLES_DATE, NINE_EXAMPLES, UnitsOfWorkPlatform
from simulation.users import UsersPlatform
from purger.sinks.ledger import Ledger, Report
from tests.support.configs import own_config
from tests.support.waits import ago, now, observed, wait_for, wait_for_watermark

pytestmark = pytest.mark.integration

RULE_PERIODS = {"complete": timedelta(seconds=3), "failed": timedelta(seconds=4),
                "unprocessed": timedelta(seconds=20), "processing": timedelta(hours=1)}
USER_GRACE = timedelta(seconds=3)
DATA_CENTRES = ["dc1", "dc2"]
LONG_AGO = timedelta(seconds=60)

# The policy that names each kind's records in the ledger.
POLICY_OF_KIND = {
    "rule_event": "rule_events",
    "user": "users", "virtual_root": "users", "mailbox_permission": "users",
    "unit_of_work": "units_of_work", "uow_object": "units_of_work",
    "dead_letter": "engine",
}


def seconds(period: timedelta) -> str:
    return f"{period.total_seconds():g}s"


# --- helpers: holding events, moving the examples to today, what a purge deletes ------------------------


class _Held:
    """Takes a platform's producer's place while its events are held: keeps what it is given to send."""

    def __init__(self, records: list) -> None:
        self.records = records

    def send(self, topic, key=None, value=None) -> None:
        self.records.append((topic, key, value))


@contextmanager
def holding(*platforms):
    """The platforms write their rows as usual; the events they emit inside are kept, for ``send_all``."""
    records: list[tuple[str, bytes, bytes]] = []
    real = [p.producer for p in platforms]
    for p in platforms:
        p.producer = _Held(records)
    try:
        yield records
    finally:
        for p, producer in zip(platforms, real):
            p.producer = producer


def send_all(producer, records, seed: int) -> None:
    """Every held event twice, in a shuffled order, through a real producer."""
    shuffled = list(records) * 2
    random.Random(seed).shuffle(shuffled)
    for topic, key, value in shuffled:
        producer.send(topic, key=key, value=value)
    producer.flush()


def today_example(row: dict) -> dict:
    """An example's row moved to today: each time as far from today's lower bound as from 2021-05-17."""
    period = Period.parse("P2Y")
    shift = period.lower_bound(day_of(now_ms())) - period.lower_bound(EXAMPLES_DATE)
    return {k: v + shift if isinstance(v, datetime) else v for k, v in row.items()}


def write_unit(platform: UnitsOfWorkPlatform, uow: str, row: dict) -> None:
    platform.start(uow, row["journey_type"], row["started_at"], children=CHILDREN)
    for column, change in (("finished_at", platform.finish), ("archived_at", platform.archive)):
        if row[column] is not None:
            assert change(uow, row[column])


def unit_rows(uow: str) -> set[tuple[str, str, str]]:
    """What purging a unit of work deletes, as the ledger names it: (policy, kind, id)."""
    return ledger_rows(PolicyObject("units_of_work", "unit_of_work", uow, eligible=True))


def user_rows(user: str) -> set[tuple[str, str, str]]:
    """What purging a user deletes: its permission rows, its virtual root, its users row."""
    return ledger_rows(PolicyObject("users", "user", user, eligible=True))


def gone_at(condition, timeout_s: float, what: str) -> datetime:
    """The first moment ``condition`` was seen to hold (polled every 0.2 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return now()
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def warmed_up(query, timeout_s: float = 120) -> None:
    """Wait for the query's first batches (its start-up, the state store's first versions), which take far
    longer than the rest: the cases then meet a stream running at its pace, so a case meant to be seen
    kept for a while is seen before its own period has passed."""
    wait_for(lambda: (query.lastProgress or {}).get("batchId", -1) >= 2, timeout_s, what="the query's first batches")


def ignored(query) -> int:
    """The events ignored as a disabled built-in policy's (observed metric ``purger.input``)."""
    return sum(p.observedMetrics["purger.input"]["ignored"] for p in query.recentProgress
               if "purger.input" in p.observedMetrics)


def purged_records(spark, ledger_config, at_least: int, timeout_s: float = 60) -> list:
    """The ledger's ``purged`` records, once there are ``at_least`` (a batch writes them after its deletes)."""
    ledger, found = Ledger(spark, ledger_config), []

    def enough() -> bool:
        nonlocal found
        if not ledger.exists():
            return False
        found = (ledger.records().where(F.col("status") == "purged")
                 .select("policy", "kind", "id", "rule", "reason", F.unix_millis("deleted_at").alias("deleted_ms"))
                 .collect())
        return len(found) >= at_least

    wait_for(enough, timeout_s, what=f"{at_least} purged records in the ledger")
    return found


def expected_lower_bound(day: date) -> str:
    """Two years before ``day`` (28 February for a 29th), at 00:00 UTC: computed here, not by the policy."""
    try:
        bound = day.replace(year=day.year - 2)
    except ValueError:
        bound = day.replace(year=day.year - 2, day=28)
    return f"{bound.isoformat()}T00:00:00"


_RUNNING: list[str] = []  # the purger of this module that is running, if one is


@contextmanager
def the_only_purger(name: str):
    """Around a purger's run: fails if another purger of this module is running (see the module docstring)."""
    assert not _RUNNING, f"the purger {name} would start while {_RUNNING[0]} runs: they would share the cores"
    _RUNNING.append(name)
    try:
        yield
    finally:
        _RUNNING.remove(name)


# --- a purger of its own: mailbox and units_of_work with settings that are not the defaults --------------


@dataclass
class OwnRun:
    config: object
    running: object
    platform: UnitsOfWorkPlatform
    units: dict[int, str]  # example number -> unit_of_work_id
    sent: datetime
    malformed: bytes


OWN_SETTINGS = {"enabled": True, "terminal_only": True, "archived_dependent_journey_types": ["BULK"]}
OWN_EXAMPLES = [n for n, e in enumerate(NINE_EXAMPLES) if e.settings]


@pytest.fixture(scope="class")
def own_purger(spark, config, tmp_path_factory) -> OwnRun:
    """A purger with ``mailbox`` and ``units_of_work`` (``terminal_only``, archived-dependent BULK) only, for
    ``TestAPurgerOfItsOwn``; it has its events (every one twice, shuffled) once it has warmed up."""
    enabled = with_policies(config, {**config.policies, "units_of_work": OWN_SETTINGS})
    cfg = own_config(enabled, tmp_path_factory.mktemp("own-purger"), "own-purger", report_interval=timedelta(seconds=2))
    platform = UnitsOfWorkPlatform(cfg.kafka, cfg.cassandra, cfg.kafka.topics[0], cfg.cassandra.keyspace,
                                   cfg.policy_set.policy_of("unit_of_work").settings)
    run = uuid.uuid4().hex[:8]
    units = {n: f"uow-settings-{run}-{n}" for n in OWN_EXAMPLES}
    user = f"disabled-{run}"
    user_added = json.dumps({"event_id": str(uuid.uuid4()), "type": "user_added",
                             "event_time": format_timestamp(ago(USER_GRACE)), "user_id": user,
                             "dc": "dc1"}).encode()
    malformed = b'{"event_id": "x", "type": "user_add'
    with the_only_purger("own_purger"):
        running = start_purger(spark, cfg)
        try:
            warmed_up(running.query)
            with holding(platform) as events:
                for n in OWN_EXAMPLES:
                    write_unit(platform, units[n], today_example(NINE_EXAMPLES[n].row))
            topic = cfg.kafka.topics[0]
            events += [(topic, user.encode(), user_added), (topic, user.encode(), malformed)]
            send_all(platform.producer, events, seed=5)
            yield OwnRun(cfg, running, platform, units, now(), malformed)
        finally:
            running.stop()
            platform.close()
    assert running.failure is None


class TestAPurgerOfItsOwn:
    """One purger with ``mailbox`` and ``units_of_work`` only (``own_purger``): the units-of-work cases of docs/policies.md with
    settings that are not the defaults, and events of a built-in policy that is not enabled (``users``). It
    stops after this class, before or after ``TestOnePurgerForThreePolicies`` runs, never beside it."""

    def test_its_settings_are_those_of_the_examples(self, own_purger):
        """Examples 5, 7, 8 and 9 (counting from 1) under one purger with both settings: terminal_only changes
        nothing for the finished units (7, 8, 9), nor BULK being archived-dependent for the running BULK unit
        (5), which terminal_only keeps anyway."""
        settings = own_purger.config.policy_set.policy_of("unit_of_work").settings
        assert [NINE_EXAMPLES[n].name for n in OWN_EXAMPLES] == [
            "running, started before the lower bound, terminal only", "archived-dependent and archived",
            "archived-dependent and not archived", "not archived-dependent and not archived"]
        for n in OWN_EXAMPLES:
            assert all(getattr(settings, k) == v for k, v in NINE_EXAMPLES[n].settings.items())
        assert {p.name for p in own_purger.config.policy_set.policies} == {"mailbox", "units_of_work"}

    def test_the_examples_with_settings_of_their_own_are_purged_or_kept_whole(self, spark, own_purger):
        platform, units = own_purger.platform, own_purger.units
        purged = [n for n in OWN_EXAMPLES if NINE_EXAMPLES[n].purged]
        kept = [n for n in OWN_EXAMPLES if not NINE_EXAMPLES[n].purged]
        assert purged and kept
        wait_for(lambda: all(platform.rows(units[n]) == (None, 0) for n in purged), timeout_s=120,
                 what="the eligible units of work and every object of theirs to be deleted")
        wait_for_watermark(own_purger.running.query, own_purger.sent + timedelta(seconds=3))
        for n in kept:
            unit, children = platform.rows(units[n])
            assert unit is not None and unit["purge_started_at"] is None, NINE_EXAMPLES[n].name
            assert children == CHILDREN, f"{NINE_EXAMPLES[n].name}: an object of a kept unit was deleted"

        expected = set().union(*(unit_rows(units[n]) for n in purged))
        records = Counter((r["policy"], r["kind"], r["id"])
                          for r in purged_records(spark, own_purger.config.ledger, len(expected)))
        assert set(records) == expected and set(records.values()) == {1}

        # The daily report, as the running purger rewrites it every ledger.report_interval.
        report = Report(spark, own_purger.config.ledger, own_purger.config.policy_set)

        def units_row():
            found = [r for r in report.rows(now().date()) if r["kind"] == "unit_of_work"]
            return found[0] if found and found[0]["purged"] == len(purged) else None

        wait_for(units_row, timeout_s=90, what="the daily report to count the deleted units")
        row = units_row()
        assert row["policy"] == "units_of_work" and row["candidates"] >= row["purged"]
        assert row["started_at"] is not None and row["finished_at"] >= row["started_at"] and row["duration_s"] >= 0
        assert row["policy_fields"]["terminal_only"] == "true"
        assert row["policy_fields"]["archived_dependent_journey_types"] == "BULK"
        assert row["policy_fields"]["retention_period"] == "P2Y"

    def test_a_disabled_policys_event_is_ignored_and_counted_not_dead_lettered(self, spark, own_purger):
        policy_set = own_purger.config.policy_set
        assert "users" not in [p.name for p in policy_set.policies]
        assert {"user_added", "user_removed", "rule_event_status"} <= policy_set.ignored_types
        query = own_purger.running.query
        # Sent twice, like every event of this purger: both copies ignored, neither dead-lettered.
        wait_for(lambda: ignored(query) >= 2, timeout_s=90, what="the user_added events counted as ignored")
        wait_for(lambda: observed(query, "dead_lettered") >= 2, timeout_s=60,
                 what="the malformed records in the observed metrics")
        assert ignored(query) == 2
        assert observed(query, "dead_lettered") == 2

        consumer = KafkaConsumer(own_purger.config.kafka.dead_letter_topic,
                                 bootstrap_servers=own_purger.config.kafka.bootstrap_servers,
                                 auto_offset_reset="earliest", consumer_timeout_ms=3000)
        try:
            letters = list(consumer)
        finally:
            consumer.close()
        assert [x.value for x in letters] == [own_purger.malformed] * 2
        assert {dict(x.headers)["reason"] for x in letters} == {b"value is not a JSON object"}

        records = Ledger(spark, own_purger.config.ledger).records()
        letters_recorded = records.where(F.col("kind") == "dead_letter").select("policy", "status").collect()
        assert [tuple(r) for r in letters_recorded] == [("engine", "dead_lettered")] * 2
        assert records.where(F.col("id").startswith("disabled-")).count() == 0
        assert own_purger.running.sink.totals[("dead_letter", "dead_lettered")] == 2
        assert query.isActive


# --- one purger for rule_events, users and units_of_work -------------------------------------------------


@pytest.fixture(scope="module")
def policies_config(config, tmp_path_factory):
    enabled = with_policies(config, {
        **config.policies,
        "rule_events": {"enabled": True, **{status: seconds(p) for status, p in RULE_PERIODS.items()}},
        "users": {"enabled": True, "user_grace": seconds(USER_GRACE), "data_centres": DATA_CENTRES},
        "units_of_work": {"enabled": True},
    })
    assert {p.name for p in enabled.policy_set.policies} == {"mailbox", "rule_events", "users", "units_of_work"}
    return own_config(enabled, tmp_path_factory.mktemp("policies"), "policies", report_interval=timedelta(seconds=2))


@pytest.fixture(scope="module")
def platforms(policies_config):
    cfg = policies_config
    policies = cfg.policy_set
    topic, keyspace = cfg.kafka.topics[0], cfg.cassandra.keyspace
    made = (
        RuleEventsPlatform(cfg.kafka, cfg.cassandra, topic, keyspace),
        UsersPlatform(cfg.kafka, cfg.cassandra, topic, keyspace, policies.policy_of("user").settings),
        UnitsOfWorkPlatform(cfg.kafka, cfg.cassandra, topic, keyspace, policies.policy_of("unit_of_work").settings),
    )
    yield made
    for platform in made:
        platform.close()


@pytest.fixture(scope="class")
def purger(spark, policies_config):
    """The purger of ``TestOnePurgerForThreePolicies``, stopped when that class is done."""
    with the_only_purger("purger"):
        running = start_purger(spark, policies_config)
        try:
            warmed_up(running.query)
        except AssertionError:
            running.stop()
            raise
        yield running
        running.stop()
    assert running.failure is None


def _rule_cases():
    """name: (steps(platform, id), the rule that purges it, or None if it is kept)."""
    p = RULE_PERIODS
    return {
        "complete for its period": (lambda pl, r: (
            pl.raise_event(r, f"m-{r}", "route-to-archive", at=ago(LONG_AGO)),
            pl.set_status(r, PROCESSING, at=ago(LONG_AGO / 2)),
            pl.set_status(r, COMPLETE, at=ago(p["complete"]))), "rule_event_complete"),
        "failed for its period": (lambda pl, r: (
            pl.raise_event(r, f"m-{r}", "forward", at=ago(LONG_AGO)),
            pl.set_status(r, FAILED, at=ago(p["failed"]))), "rule_event_failed"),
        "unprocessed for its period": (lambda pl, r: (
            pl.raise_event(r, f"m-{r}", "forward", at=ago(p["unprocessed"])),), "rule_event_unprocessed"),
        "complete, then processing again": (lambda pl, r: (
            pl.raise_event(r, f"m-{r}", "forward", at=ago(LONG_AGO)),
            pl.set_status(r, COMPLETE, at=ago(LONG_AGO / 2)),
            pl.set_status(r, PROCESSING)), None),
        "raised just now": (lambda pl, r: (pl.raise_event(r, f"m-{r}", "forward", status=PROCESSING),), None),
    }


RETRIED = "failed for its period, then retried just now"


def _user_cases(grace: timedelta):
    """name: (steps as (add | remove, dc, when), gone). ``when`` None: now."""
    long_ago, removed = LONG_AGO, grace
    return {
        "absent from both past the grace": ([("add", "dc1", long_ago), ("add", "dc2", long_ago),
                                             ("remove", "dc1", removed + timedelta(seconds=3)),
                                             ("remove", "dc2", removed)], True),
        "removed from dc1, never in dc2": ([("add", "dc1", long_ago), ("remove", "dc1", removed)], True),
        "present in dc2 only": ([("add", "dc1", long_ago), ("add", "dc2", long_ago),
                                 ("remove", "dc1", removed)], False),
        "added in dc2 only": ([("add", "dc2", long_ago)], False),
        "re-added after removal": ([("add", "dc1", long_ago), ("remove", "dc1", removed), ("add", "dc1", None)],
                                   False),
    }


REMOVED_JUST_NOW = "removed from both, the last just now"


@dataclass
class Scenario:
    rule_events: dict[str, str] = field(default_factory=dict)  # case -> rule_event_id
    retried_at: datetime | None = None
    users: dict[str, str] = field(default_factory=dict)  # case -> user_id
    removed_at: datetime | None = None
    units: dict[int, str] = field(default_factory=dict)  # example number -> unit_of_work_id
    sent: datetime | None = None

    def rule_events_gone(self) -> dict[str, str]:
        """rule_event_id -> the rule that purges it."""
        rules = {self.rule_events[c]: rule for c, (_, rule) in _rule_cases().items() if rule}
        return {**rules, self.rule_events[RETRIED]: "rule_event_unprocessed"}

    def users_gone(self) -> list[str]:
        return [self.users[c] for c, (_, gone) in _user_cases(USER_GRACE).items() if gone] + [
            self.users[REMOVED_JUST_NOW]]

    def units_gone(self) -> list[str]:
        return [uow for n, uow in self.units.items() if NINE_EXAMPLES[n].purged]

    def expected_purged(self) -> set[tuple[str, str, str]]:
        """Every row the purger deletes, once each, as the ledger names it."""
        return ({("rule_events", "rule_event", r) for r in self.rule_events_gone()}
                | set().union(*(user_rows(u) for u in self.users_gone()))
                | set().union(*(unit_rows(uow) for uow in self.units_gone())))


@pytest.fixture(scope="class")
def scenario(purger, platforms) -> Scenario:
    """Every case's rows written, then all their events, shuffled and twice, while the purger runs."""
    rules, users, units = platforms
    run = uuid.uuid4().hex[:8]
    s = Scenario()
    with holding(rules, users, units) as events:
        for i, (case, (steps, _)) in enumerate(_rule_cases().items()):
            s.rule_events[case] = f"re-{run}-{i}"
            steps(rules, s.rule_events[case])
        retried = s.rule_events[RETRIED] = f"re-{run}-retried"
        rules.raise_event(retried, f"m-{retried}", "forward", at=ago(LONG_AGO))
        rules.set_status(retried, FAILED, at=ago(RULE_PERIODS["failed"]))  # eligible by itself...
        s.retried_at = now()
        rules.set_status(retried, UNPROCESSED, at=s.retried_at)  # ...but retried: a longer period from now

        for i, (case, (steps, _)) in enumerate(_user_cases(USER_GRACE).items()):
            user = s.users[case] = f"user-{run}-{i}"
            for change, dc, before in steps:
                at = None if before is None else ago(before)
                if change == "add":
                    users.add_user(user, dc, mailboxes=mailboxes(user), at=at)
                else:
                    users.remove_user(user, dc, at=at)
        last = s.users[REMOVED_JUST_NOW] = f"user-{run}-last"
        users.add_user(last, "dc1", mailboxes=mailboxes(last), at=ago(LONG_AGO))
        users.add_user(last, "dc2", mailboxes=mailboxes(last), at=ago(LONG_AGO))
        users.remove_user(last, "dc1", at=ago(LONG_AGO / 2))
        s.removed_at = now()
        users.remove_user(last, "dc2", at=s.removed_at)

        # The nine examples whose settings are the defaults (the others run in a purger of their own).
        for n, example in enumerate(NINE_EXAMPLES):
            if not example.settings:
                s.units[n] = f"uow-{run}-{n}"
                write_unit(units, s.units[n], today_example(example.row))
    send_all(rules.producer, events, seed=11)
    s.sent = now()
    return s


class TestOnePurgerForThreePolicies:
    """One purger for ``rule_events``, ``users`` and ``units_of_work`` (``purger``), with every case's events
    sent once it has warmed up (``scenario``)."""

    def test_rule_events_go_by_status_and_period_whatever_the_order(self, purger, platforms, scenario):
        """docs/policies.md, rule_events: an eligible rule event goes; one whose status went back (COMPLETE to PROCESSING, FAILED to
        UNPROCESSED on a retry) is kept for the new status's period; a recent one is kept."""
        rules, s = platforms[0], scenario
        cases = _rule_cases()
        eligible = [s.rule_events[c] for c, (_, rule) in cases.items() if rule]
        wait_for(lambda: all(rules.row(r) is None for r in eligible), timeout_s=120,
                 what="every rule event past its status's period to be deleted")
        # The retried one was FAILED from the same moment as "failed for its period", which is gone: it is
        # kept, unless (on a very slow machine) its new period has passed meanwhile.
        unprocessed = RULE_PERIODS["unprocessed"]
        row, left = rules.row(s.rule_events[RETRIED]), (s.retried_at + unprocessed - now()).total_seconds()
        assert (row is not None and row["status"] == UNPROCESSED) or left <= 0, \
            "the retried rule event was deleted under its old status"
        print(f"the retried rule event was seen kept {left:.1f}s before its new period passed")
        wait_for_watermark(purger.query, s.sent + timedelta(seconds=3))
        # Every deadline of the events as sent is behind the watermark now.
        assert rules.row(s.rule_events["complete, then processing again"])["status"] == PROCESSING
        assert rules.row(s.rule_events["raised just now"])["status"] == PROCESSING
        # Then it goes under the new status, once that status has been held for its period.
        seen_gone = gone_at(lambda: rules.row(s.rule_events[RETRIED]) is None, timeout_s=90,
                            what="the retried rule event, once UNPROCESSED for its period")
        assert seen_gone >= s.retried_at + unprocessed
        assert rules.row(s.rule_events["raised just now"]) is not None

    def test_users_go_only_when_absent_from_every_data_centre(self, purger, platforms, scenario):
        """docs/policies.md, users: every row of a user absent from both data centres past the grace goes (a data centre that
        never had the user counts as absent); a user present in any one, or added again, keeps every row."""
        users, s = platforms[1], scenario
        nothing = {"user": None, "virtual_root": None, "permissions": {}}
        cases = _user_cases(USER_GRACE)
        gone = [s.users[c] for c, (_, g) in cases.items() if g]
        wait_for(lambda: all(users.rows(u) == nothing for u in gone), timeout_s=120,
                 what="every row of the users absent everywhere past the grace")
        seen_gone = gone_at(lambda: users.rows(s.users[REMOVED_JUST_NOW]) == nothing, timeout_s=60,
                            what="the user removed from its last data centre just now, after the grace")
        assert seen_gone >= s.removed_at + USER_GRACE
        wait_for_watermark(purger.query, s.sent + timedelta(seconds=3))
        present = {"present in dc2 only": {"dc2"}, "added in dc2 only": {"dc2"}, "re-added after removal": {"dc1"}}
        for case, dcs in present.items():
            user = s.users[case]
            rows = users.rows(user)
            assert rows["user"] is not None and rows["user"]["state"] == "live", case
            assert rows["user"]["present_in"] == dcs, case
            assert rows["virtual_root"] == mailboxes(user)[0], f"{case}: virtual root deleted"
            assert set(rows["permissions"]) == set(mailboxes(user)), f"{case}: a permission row deleted"

    def test_units_of_work_the_examples_moved_to_today_are_purged_or_kept_whole(self, purger, platforms, scenario):
        """the units-of-work cases of docs/policies.md with the default settings (1, 2, 3, 4 and 6, counting from 1), dated relative to
        today: the eligible ones go with every object of theirs, the others stay whole."""
        units, s = platforms[2], scenario
        assert sorted(s.units) == [0, 1, 2, 3, 5]
        wait_for(lambda: all(units.rows(uow) == (None, 0) for uow in s.units_gone()), timeout_s=120,
                 what="the eligible units of work and every object of theirs to be deleted")
        wait_for_watermark(purger.query, s.sent + timedelta(seconds=3))
        for n, uow in s.units.items():
            if NINE_EXAMPLES[n].purged:
                continue
            unit, children = units.rows(uow)
            written = today_example(NINE_EXAMPLES[n].row)
            assert unit is not None and unit["purge_started_at"] is None, NINE_EXAMPLES[n].name
            assert unit["journey_type"] == written["journey_type"]
            assert children == CHILDREN, f"{NINE_EXAMPLES[n].name}: an object of a kept unit was deleted"

    def test_the_ledger_and_report_name_each_policy_one_record_per_deleted_row(self, spark, purger, platforms, scenario,
                                                                               policies_config):
        """Guarantee 5 for every policy: one ``purged`` record per deleted row, dependents included, each naming
        its policy and rule, none before the double-check allows; the daily report counts them per policy, and
        the units_of_work rows carry the payment store's report fields."""
        cfg, s = policies_config, scenario
        rules, users, units = platforms
        nothing = {"user": None, "virtual_root": None, "permissions": {}}
        wait_for(lambda: all(rules.row(r) is None for r in s.rule_events_gone())
                 and all(users.rows(u) == nothing for u in s.users_gone())
                 and all(units.rows(uow) == (None, 0) for uow in s.units_gone()),
                 timeout_s=120, what="every deletion of the scenario")
        expected = s.expected_purged()
        records = purged_records(spark, cfg.ledger, len(expected))
        counted = Counter((r["policy"], r["kind"], r["id"]) for r in records)
        assert set(counted) == expected, (set(counted) - expected, expected - set(counted))
        assert [k for k, v in counted.items() if v != 1] == [], "a deleted row recorded more than once"
        rule_of = {**{("rule_events", r): rule for r, rule in s.rule_events_gone().items()},
                   **{("users", u): "user_absent" for u in s.users_gone()},
                   **{("units_of_work", uow): "retention" for uow in s.units_gone()}}
        for r in records:
            object_id = r["id"] if r["kind"] in ("rule_event", "user", "unit_of_work", "virtual_root") else \
                r["id"].split("/")[0]
            assert r["rule"] == rule_of[(r["policy"], object_id)], r
            assert r["reason"] is None, r  # nothing found gone by a retry
        # Deleted no sooner than the double-check allows, by the wall clock.
        deleted_at = {(r["kind"], r["id"]): r["deleted_ms"] / 1000 for r in records}
        retried = s.rule_events[RETRIED]
        assert deleted_at[("rule_event", retried)] >= (s.retried_at + RULE_PERIODS["unprocessed"]).timestamp()
        for _, kind, row_id in user_rows(s.users[REMOVED_JUST_NOW]):
            assert deleted_at[(kind, row_id)] >= (s.removed_at + USER_GRACE).timestamp(), (kind, row_id)
        # Every record, purged or not, names the policy of its kind.
        kinds = Ledger(spark, cfg.ledger).records().select("policy", "kind").distinct().collect()
        assert all(POLICY_OF_KIND[r["kind"]] == r["policy"] for r in kinds), kinds

        # The daily report, as the running purger rewrites it every ledger.report_interval (2 s here).
        today = now().date()
        report = Report(spark, cfg.ledger, cfg.policy_set)
        deleted = Counter((policy, kind) for policy, kind, _ in expected)

        def report_counts_every_deletion() -> bool:
            purged = {(r["policy"], r["kind"]): r["purged"] for r in report.rows(today) if r["dc"] == "all"}
            return all(purged.get(key) == count for key, count in deleted.items())

        wait_for(report_counts_every_deletion, timeout_s=90, what="the daily report to count every deletion")
        rows = report.rows(today)
        assert {"rule_events", "users", "units_of_work"} <= {r["policy"] for r in rows}
        for r in rows:
            if r["policy"] == "units_of_work":
                fields = r["policy_fields"]
                assert fields["execution_date"] == today.isoformat()
                assert fields["retention_period"] == "P2Y"
                assert fields["retention_lower_bound"].startswith(expected_lower_bound(today))
                assert fields["terminal_only"] == "false"
                assert fields["archived_dependent_journey_types"] == ""
            else:
                assert r["policy_fields"] == {}, r

    def test_an_erasure_deletes_a_mailbox_and_a_user_now_but_what_a_hold_or_another_message_keeps(
            self, spark, purger, platforms, policies_config):
        """SPEC 11.3, after the ledger's test (its records are its own): a mailbox's messages, live for years,
        their payloads, their rule events, and a user present in a data centre, erased now through the running
        purger; a hold on one message keeps it (and its payload) until its release, which erases it with no new
        command; a payload another mailbox's message refers to is kept, as that message and its rule event are.
        Checked in Cassandra and both stores, then against the certificates."""
        from purger.core.holds import Scope
        from purger.erase import find_objects, new_request, send_erasure, wait_for_certificate
        from purger.holds import place_hold, release_hold
        from simulation.mailbox import Platform

        cfg = policies_config
        rules, users, _ = platforms
        mail = Platform(cfg)
        run = uuid.uuid4().hex[:8]
        subject, other = Scope("mailbox", f"erased-{run}"), f"kept-{run}"
        messages = [f"{run}-m{n}" for n in range(4)]
        held, shared, neighbour = messages[3], f"p-{messages[0]}", f"{run}-other"
        user, kept_user = f"{run}-u", f"{run}-u-kept"
        try:
            for m in messages:  # never dequeued: live for years; a stored payload each, in dc1 and dc2
                mail.enqueue(m, f"p-{m}", mailbox=subject.id)
            mail.enqueue(neighbour, shared, mailbox=other, shared=True)
            rules.raise_event(f"{run}-re", messages[1], "route", PROCESSING)
            rules.raise_event(f"{run}-re-kept", neighbour, "route", PROCESSING)
            users.add_user(user, "dc1", mailboxes=(subject.id,))
            users.add_user(kept_user, "dc1")
            mail.flush()
            assert place_hold(spark, cfg, Scope("message", held), "case 9", "test", wait_s=60).already is None

            request = new_request()
            asked = find_objects(spark, cfg, subject)
            assert asked == sorted([("message", m) for m in messages] + [("rule_event", f"{run}-re")])
            send_erasure(cfg, asked, request)
            erased = wait_for_certificate(spark, cfg, subject, request, asked, wait_s=120)
            assert [m for m in messages if mail.row(m) is not None] == [held]
            assert all(mail.payload_gone(f"p-{m}") for m in messages[1:3])
            assert mail.payload_intact(shared) and mail.references(shared) == {neighbour}
            assert mail.payload_intact(f"p-{held}") and mail.row(neighbour) is not None
            assert rules.row(f"{run}-re") is None and rules.row(f"{run}-re-kept") is not None
            assert erased.complete and erased.gone == []
            assert [(e.kind, e.id, e.reason.split(":")[0]) for e in erased.kept] == [
                ("message", held, "held"), ("payload", shared, "referenced")]
            deleted = {(e.kind, e.id, e.dc) for e in erased.deleted}
            assert deleted == ({("message", m, None) for m in messages[:3]} | {("rule_event", f"{run}-re", None)}
                               | {("payload_refs", json.dumps([f"p-{m}", m], separators=(",", ":")), None)
                                  for m in messages[:3]}
                               | {("payload", f"p-{m}", dc) for m in messages[1:3] for dc in ("dc1", "dc2", None)})
            assert all(e.record_id and e.at for e in erased.deleted)

            user_request = new_request()
            asked = find_objects(spark, cfg, Scope("user", user))
            assert asked == [("user", user)]
            send_erasure(cfg, asked, user_request)
            done = wait_for_certificate(spark, cfg, Scope("user", user), user_request, asked, wait_s=120)
            assert users.rows(user) == {"user": None, "virtual_root": None, "permissions": {}}
            assert users.rows(kept_user)["user"] is not None
            assert {(e.kind, e.id) for e in done.deleted} == {
                ("user", user), ("virtual_root", user), ("mailbox_permission", f"{user}/{subject.id}")}

            assert release_hold(cfg, Scope("message", held)) == 1
            wait_for(lambda: mail.row(held) is None and mail.payload_gone(f"p-{held}"), timeout_s=60,
                     what="the held message erased at its release, with its payload")
            again = wait_for_certificate(spark, cfg, subject, request, [], wait_s=60)
            assert [e.id for e in again.kept] == [shared]
            assert ("message", held, None) in {(e.kind, e.id, e.dc) for e in again.deleted}
        finally:
            mail.close()

"""A policy of one's own (docs/policies.md, A policy of one's own): ``examples/push_clients``, a module outside the purger's package, named in
the configuration and run by the unchanged engine, end to end on the real servers.

The module is found as a user's would be: its directory on ``sys.path`` (the driver) and on ``PYTHONPATH`` (the
executors' Python workers, which take it from the JVM's environment, fixed when the session starts); if the
session started before this module set it, the module is shipped with ``addPyFile``, as ``--py-files`` would.
"""

import os
import sys
import threading
import time
import uuid
from datetime import timedelta

import pytest

from tests.support import ROOT

HERE = ROOT / "examples" / "push_clients"
sys.path.insert(0, str(HERE))
# Before the session's JVM starts, if it has not yet (pytest collects every module before the first fixture).
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)

from purger.core.settings import ConfigError  # noqa: E402

from purger.config import build_config, with_policies
from purger.core.policy import (  # noqa: E402
    ALREADY_GONE, BEING_DELETED, EARLIER_ATTEMPT, NOT_YET_DUE, PURGED, SKIPPED, WOULD_DELETE, Attempt, Candidate,
    Eligibility, category, epoch_ms, now_ms,
)
from purger.policies import PolicyError, load_policy  # noqa: E402
from purger.running import start_purger  # noqa: E402
from push_clients_platform import PushClientsPlatform  # noqa: E402
from push_clients_policy import (  # noqa: E402
    INACTIVE, PUSH_CLIENT, PUSH_CLIENT_CONNECTED, PUSH_CLIENT_REGISTERED, PUSH_MESSAGE, ClientEvent,
    PushClientsPolicy,
)
from purger.sinks.ledger import Ledger  # noqa: E402
from tests.support.configs import own_config  # noqa: E402
from tests.support.faults import FAULTS  # noqa: E402
from tests.support.policies import RecordingControl, resources  # noqa: E402
from tests.support.waits import ago, now, wait_for, wait_for_watermark  # noqa: E402

# The policy as plain Python runs without a server; the tests below it use ``config`` or ``spark`` and are marked
# ``integration`` (here, and by conftest for any that would not be).
integration = pytest.mark.integration

INACTIVE_AFTER = timedelta(seconds=3)
SECTION = {"enabled": True, "module": "push_clients_policy", "inactive_after": "3s"}
DAY_MS = 86_400_000


# --- the policy as plain Python -----------------------------------------------------------------


def connected(t, event_id=None, event_type=PUSH_CLIENT_CONNECTED):
    return ClientEvent(event_id or f"{event_type}-{t}", event_type, t, "c1")


def test_the_fold_keeps_the_latest_connection_whatever_the_order_and_duplicates():
    kind = load_policy("push_clients", {"enabled": True, "module": "push_clients_policy"}).kinds[0]
    assert kind.name == PUSH_CLIENT
    assert kind.eligibility(kind.fold(None, [])) is None
    events = [connected(10, event_type=PUSH_CLIENT_REGISTERED), connected(50), connected(30)]
    expected = Eligibility(INACTIVE, 50 + 60 * DAY_MS)
    for order in (events, events[::-1], events + events, [events[1], events[0], events[1]]):
        assert kind.eligibility(kind.fold(None, order)) == expected
    # In batches, as micro-batches bring them: an older connection never moves the deadline back.
    state = kind.fold(kind.fold(None, [connected(50)]), [connected(30), connected(10)])
    assert kind.eligibility(state) == expected
    assert kind.eligibility(kind.fold(state, [connected(70)])) == Eligibility(INACTIVE, 70 + 60 * DAY_MS)


def test_the_rule_and_the_interface():
    policy = load_policy("push_clients", {**SECTION, "module": "push_clients_policy:PushClientsPolicy"})
    assert isinstance(policy, PushClientsPolicy) and policy.settings.inactive_after == INACTIVE_AFTER
    rule = policy.kind.rule
    assert (rule.name, rule.period_ms, rule.condition) == (INACTIVE, 3_000, "last_connected_at <= ?")
    assert {t.name: (t.kind, t.id_field) for t in policy.event_types} == {
        PUSH_CLIENT_REGISTERED: (PUSH_CLIENT, "client_id"), PUSH_CLIENT_CONNECTED: (PUSH_CLIENT, "client_id")}
    assert "purging" in policy.tables["push_routers"]


def test_a_bad_period_names_its_key():
    with pytest.raises(PolicyError, match=r"policies\.push_clients\.inactive_after"):
        load_policy("push_clients", {**SECTION, "inactive_after": "soon"})


@pytest.mark.parametrize("module, message", [
    ("no_such_push_module", r"policies\.push_clients\.module: cannot import 'no_such_push_module'"),
    ("push_clients_policy:NoSuchClass", r"policies\.push_clients\.module: .* names no Policy subclass"),
])
def test_a_wrong_module_is_a_config_error_naming_the_key(module, message):
    with pytest.raises(ConfigError, match=message):
        build_config({"policies": {"push_clients": {"enabled": True, "module": module}}})


def test_the_section_must_bear_the_policys_name():
    with pytest.raises(ConfigError, match=r"policies\.push: the module's policy is named 'push_clients'"):
        build_config({"policies": {"push": {"enabled": True, "module": "push_clients_policy"}}})


def test_the_configuration_names_the_module():
    config = build_config({"policies": {"push_clients": SECTION}})
    assert config.policies["push_clients"]["module"] == "push_clients_policy"


# --- against the servers ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def executors_import_the_module(spark):
    """The executors' Python workers import ``push_clients_policy``: by PYTHONPATH if the session started
    after this module set it, otherwise shipped with ``addPyFile`` (what ``--py-files`` does)."""
    def importable():
        def probe(_):
            import importlib
            importlib.invalidate_caches()
            try:
                importlib.import_module("push_clients_policy")
                return [True]
            except ImportError:
                return [False]
        return all(spark.sparkContext.parallelize(range(2), 2).mapPartitions(probe).collect())

    if importable():
        print("push_clients_policy: importable on the executors through PYTHONPATH")
    else:
        spark.sparkContext.addPyFile(str(HERE / "push_clients_policy.py"))
        assert importable(), "addPyFile did not make push_clients_policy importable on the executors"
        print("push_clients_policy: shipped to the executors with addPyFile")


@pytest.fixture(scope="module")
def cfg(config, tmp_path_factory):
    """The session's configuration with the policy of one's own enabled beside mailbox, topics, checkpoint and
    ledger of its own; ``own_config`` creates the topics and the enabled policies' tables."""
    with_own = with_policies(config, {**config.policies, "push_clients": SECTION})
    return own_config(with_own, tmp_path_factory.mktemp("push_clients"), "push_clients")


@pytest.fixture(scope="module")
def platform(cfg):
    platform = PushClientsPlatform(cfg.kafka, cfg.cassandra, cfg.kafka.topics[0])
    yield platform
    platform.close()


@pytest.fixture
def purge(cfg, platform):
    """purge(client_id, dry_run=False, batch="q/1") -> (outcomes, rechecks), by the policy's purger alone."""
    policy = load_policy("push_clients", SECTION)

    def run(client_id, dry_run=False, batch="q/1"):
        control = RecordingControl("push_clients")
        purger = policy.purges(resources(platform.session, cfg.cassandra.keyspace, control, dry_run))[PUSH_CLIENT]
        outcomes = list(purger.purge(Candidate(PUSH_CLIENT, client_id, INACTIVE, eligible_at_ms=0),
                                     Attempt(batch=batch)))
        return outcomes, control.rechecks

    return run


def raced(purger, client, n, writer):
    """Purge ``client`` and run ``writer()`` released together, the writer a little later each attempt (spread
    over the purge's round trips); the purge's outcomes and what the writer returned."""
    start = threading.Barrier(2)
    result = {}

    def purge_it():
        start.wait()
        result["outcomes"] = list(purger.purge(Candidate(PUSH_CLIENT, client, INACTIVE, 0), Attempt()))

    thread = threading.Thread(target=purge_it)
    thread.start()
    start.wait()
    time.sleep((n % 5) * 0.002)
    written = writer()
    thread.join(timeout=60)
    return result["outcomes"], written


def race_purger(platform, cfg):
    return load_policy("push_clients", SECTION).purges(
        resources(platform.session, cfg.cassandra.keyspace, RecordingControl("push_clients")))[PUSH_CLIENT]


def new_client(platform, name, at=None, messages=3, emit=False):
    """A client registered ``at`` (now by default) with ``messages`` messages, ``m0``, ``m1``, ..."""
    client = f"{name}-{uuid.uuid4().hex[:8]}"
    assert platform.connect(client, at=at, emit=emit) == PUSH_CLIENT_REGISTERED
    for i in range(messages):
        assert platform.send_message(client, f"m{i}", f"body {i}".encode())
    return client


@integration
def test_the_purger_claims_then_deletes_messages_then_the_router(platform, purge):
    client = new_client(platform, "direct", at=ago(INACTIVE_AFTER))
    outcomes, rechecks = purge(client)
    assert [(o.status, o.kind, o.id) for o in outcomes] == [
        *((PURGED, PUSH_MESSAGE, f"{client}/m{i}") for i in range(3)), (PURGED, None, None)]
    assert rechecks == [] and platform.router(client) is None and platform.messages(client) == {}
    # Found gone again (an attempt whose outcomes were lost, a later batch, a replay): recorded from the
    # purger's intent, under the batch that meant each deletion, so the ledger keeps the same records once.
    # A dry run: gone.
    again, _ = purge(client, batch="q/2")
    assert [(o.status, o.kind, o.id, category(o.reason), o.intent) for o in again] == [
        *((PURGED, PUSH_MESSAGE, f"{client}/m{i}", EARLIER_ATTEMPT, "q/1") for i in range(3)),
        (PURGED, None, None, EARLIER_ATTEMPT, "q/1")]
    assert [o.status for o in purge(client, dry_run=True)[0]] == [ALREADY_GONE]
    # A client the platform removed itself: no intent, so already gone.
    assert [o.status for o in purge(f"gone-{uuid.uuid4().hex[:8]}")[0]] == [ALREADY_GONE]


@integration
def test_a_recent_connection_keeps_the_client_and_a_dry_run_deletes_nothing(platform, purge):
    fresh = new_client(platform, "fresh")
    (outcome,), rechecks = purge(fresh)
    assert outcome.status == SKIPPED and outcome.reason.startswith(f"{NOT_YET_DUE}: {INACTIVE} at ")
    # When it will be due by its row, and not sooner than retry_ms.
    [(kind, object_id, rule, at_ms)] = rechecks
    assert (kind, object_id, rule) == (PUSH_CLIENT, fresh, INACTIVE)
    assert epoch_ms(platform.router(fresh)["last_connected_at"]) + 3_000 <= at_ms <= now_ms() + 3_000
    old = new_client(platform, "dry", at=ago(INACTIVE_AFTER), messages=2)
    outcomes, rechecks = purge(old, dry_run=True)
    assert [(o.status, o.kind) for o in outcomes] == [(WOULD_DELETE, PUSH_MESSAGE)] * 2 + [(WOULD_DELETE, None)]
    assert rechecks == [] and len(platform.messages(old)) == 2 and platform.router(old)["purging"] is None
    assert len(platform.messages(fresh)) == 3


@integration
def test_a_claimed_row_is_finished_by_the_next_attempt_and_a_dry_run_leaves_it(platform, purge, cfg):
    client = new_client(platform, "claimed", at=ago(INACTIVE_AFTER))
    # What a failed attempt leaves: its claim, and the rows it had not deleted yet.
    platform.session.execute(f"UPDATE {cfg.cassandra.keyspace}.push_routers SET purging = true "
                             "WHERE client_id = %s", (client,))
    (outcome,), _ = purge(client, dry_run=True)
    assert (outcome.status, outcome.reason) == (SKIPPED, f"{BEING_DELETED}: by a real run")
    # A message stored while a purge holds the row is refused and removed again: none is left without a router.
    assert platform.send_message(client, "late", b"x") is False and "late" not in platform.messages(client)
    outcomes, _ = purge(client)
    assert [o.status for o in outcomes] == [PURGED] * 4 and platform.router(client) is None


@integration
def test_a_client_connecting_while_it_is_purged_loses_nothing_it_needs(platform, cfg):
    """The race of the writer contract: a purge of an inactive client against the client connecting and a
    message being stored for it, started together, many times. Whatever the interleaving: a connection that
    applied before the claim keeps everything; one after it finds a new client with only the new message; and
    no message is ever left without its router."""
    purger = race_purger(platform, cfg)
    attempts = FAULTS.attempts // 10
    seen = {PUSH_CLIENT_CONNECTED: 0, PUSH_CLIENT_REGISTERED: 0}
    for n in range(attempts):
        client = new_client(platform, f"race{n}", at=ago(INACTIVE_AFTER), messages=2)
        outcomes, (how, stored) = raced(purger, client, n, lambda: (
            platform.connect(client, emit=False), platform.send_message(client, "new", b"after connect")))
        seen[how] += 1
        router, messages = platform.router(client), platform.messages(client)
        purged = [o for o in outcomes if o.status == PURGED]
        assert stored and router is not None and router["purging"] is None
        if how == PUSH_CLIENT_CONNECTED:  # before the claim: nothing deleted
            assert purged == [] and set(messages) == {"m0", "m1", "new"}
        else:  # after the purge: a new client, with only what was stored for it since
            assert len(purged) == 3 and set(messages) == {"new"}
    print(f"RELIABILITY push_clients race: {attempts} attempts, connected first {seen[PUSH_CLIENT_CONNECTED]}, "
          f"registered anew after the purge {seen[PUSH_CLIENT_REGISTERED]}")


@integration
def test_a_message_stored_while_its_client_is_purged_is_never_left_without_a_router(platform, cfg):
    """The other race of the contract: a message stored for an inactive client while it is purged. The sender
    either is told the client is gone (and its row is removed again) or its message goes with the client:
    once the purge is done, no message row is left."""
    purger = race_purger(platform, cfg)
    attempts = FAULTS.attempts // 10
    refused = 0
    for n in range(attempts):
        client = new_client(platform, f"sender{n}", at=ago(INACTIVE_AFTER), messages=2)
        outcomes, stored = raced(purger, client, n, lambda: platform.send_message(client, "mid", b"sent while purged"))
        refused += not stored
        assert [o.status for o in outcomes][-1] == PURGED
        assert platform.router(client) is None and platform.messages(client) == {}, f"attempt {n}: orphan left"
    print(f"RELIABILITY push_clients sender race: {attempts} attempts, refused as gone {refused}, "
          f"stored and purged with the client {attempts - refused}")


# --- end to end: the engine, unchanged, runs the module ---------------------------------------------


def ledger_rows(spark, cfg, clients):
    ledger = Ledger(spark, cfg.ledger)
    if not ledger.exists():
        return []
    return [r.asDict() for r in ledger.records().select("policy", "kind", "id", "status", "reason").collect()
            if r.id.split("/")[0] in clients]


@integration
def test_an_inactive_client_is_purged_end_to_end_and_the_active_ones_are_kept(
        spark, executors_import_the_module, cfg, platform):
    hour_ago = now() - timedelta(hours=1)
    inactive = new_client(platform, "inactive", at=hour_ago, emit=True)
    platform.connect(inactive, at=hour_ago + timedelta(minutes=1))
    active = new_client(platform, "active", messages=2, emit=True)
    platform.connect(active)
    # Its last connection by its events was inactive_after ago, so it is due at once; but it reconnects before
    # the purge, and the events of its reconnections come late (held back): only its row says it is active.
    reconnected = new_client(platform, "reconnected", at=ago(INACTIVE_AFTER), messages=2, emit=True)
    platform.connect(reconnected, emit=False)
    platform.flush()

    # Active clients keep connecting, more often than inactive_after.
    stop, failures = threading.Event(), []

    def heartbeat():
        while not stop.wait(0.5):
            try:
                platform.connect(active)
                platform.connect(reconnected, emit=False)
                platform.flush()
            except Exception as error:  # noqa: BLE001 - reported by the test below
                failures.append(error)

    beating = threading.Thread(target=heartbeat, name="push-heartbeat", daemon=True)
    beating.start()
    started = time.monotonic()
    running = start_purger(spark, cfg)
    try:
        wait_for(lambda: platform.router(inactive) is None and platform.messages(inactive) == {}, timeout_s=300,
                 what="the inactive client's router and message rows to be deleted")
        print(f"inactive client purged {time.monotonic() - started:.1f}s after the purger started")
        clients = {inactive, active, reconnected}
        wait_for(lambda: time.sleep(2) or any(r["id"] == reconnected and r["status"] == SKIPPED
                                              for r in ledger_rows(spark, cfg, clients)),
                 timeout_s=120, what="the reconnected client's double-check in the ledger")
        # The stream has moved past this moment: a wrong purge of either would have happened by now.
        moment = now()
        wait_for_watermark(running.query, moment, timeout_s=240)
        print(f"watermark passed {moment} at {now()}; last batch: {running.query.lastProgress['durationMs']}")
        for client, count in ((active, 2), (reconnected, 2)):
            router = platform.router(client)
            assert router is not None and router["purging"] is None, f"{client}: router wrongly touched"
            assert len(platform.messages(client)) == count, f"{client}: messages wrongly deleted"

        records = ledger_rows(spark, cfg, clients)
        assert records and {r["policy"] for r in records} == {"push_clients"}
        purged = sorted((r["kind"], r["id"]) for r in records if r["status"] == PURGED)
        assert purged == [(PUSH_CLIENT, inactive), *((PUSH_MESSAGE, f"{inactive}/m{i}") for i in range(3))]
        kept = [r for r in records if r["id"] == reconnected]
        assert kept and all(r["status"] == SKIPPED and r["reason"].startswith(f"{NOT_YET_DUE}: {INACTIVE} at ")
                            for r in kept)
        # Its events keep it from being a candidate; were one late, the double-check would keep it.
        assert all(r["status"] == SKIPPED for r in records if r["id"].split("/")[0] == active)
    finally:
        stopping = time.monotonic()
        running.stop()
        print(f"purger stopped in {time.monotonic() - stopping:.1f}s")
        stop.set()
        beating.join(timeout=30)
    assert running.failure is None
    assert failures == [], "the heartbeat failed: the active clients may have looked inactive"

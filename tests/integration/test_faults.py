"""Faults on the real servers: what was lost is counted, and must be zero. (Bad input runs through the module
purger of ``test_purge_stream.py``: ``test_a_corpus_of_bad_input_is_dead_lettered_and_deletes_nothing``.)

The fault matrix is bounded by default, as CI runs it (``tests.support.faults.FAULTS``: 400 attempts per race,
the kill test at one failpoint per step of the purge protocol and one random kill, servers down 10 s);
``PURGER_FAULTS=full`` (``make faults-full``) runs it in full. Each test prints its counts as a ``RELIABILITY``
line (``pytest -s``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from purger.config import with_policies
from purger.connectors import cassandra_session
from simulation.mailbox import Platform
from simulation.policy_objects import SETTINGS, PolicyObject, PolicyObjects
from purger.core.vocabulary import PURGED, SKIPPED
from tests.support.configs import own_config, write_config
from tests.support.faults import FAULTS, killed_at, reliability
from tests.support.mailbox import purge as purge_candidates
from tests.support.mailbox import (
    candidate, end_state, message_purge, purge_through_outages, unreferenced_payload, write_work,
)
from tests.support.races import revival_race
from tests.support.waits import wait_for
from tests.support import ROOT

pytestmark = pytest.mark.integration

ATTEMPTS = FAULTS.attempts


@pytest.fixture(scope="module")
def race_platform(config, tmp_path_factory):
    """A platform on topics of its own: the races' thousands of events are for no stream."""
    platform = Platform(own_config(config, tmp_path_factory.mktemp("races"), "races"))
    yield platform
    platform.close()


def test_a_revival_racing_the_double_check_is_never_lost(race_platform, config):
    """The platform revives a message (counter set again, conditionally on the row existing) while the
    sink deletes it. The double-check and the delete are one conditional statement, so either the revival
    lands first and the row is kept, or the delete does and the revival finds no row: both applying would
    be a lost revival (a live object deleted)."""
    session = cassandra_session(config.cassandra)
    deleter, _ = message_purge(session, config)
    race = revival_race(race_platform, deleter, session, config, ATTEMPTS)
    reliability("revival between double-check and delete", injected=ATTEMPTS, survived=ATTEMPTS,
                wrongly_deleted=len(race.lost), left_behind=len(race.left), **race.counts())
    assert race.lost == [] and race.left == []
    # The race was real: each side won some.
    assert race.outcomes[f"{PURGED}, revival found no row"] and race.outcomes[f"{SKIPPED}, revival applied"], race.outcomes


def test_a_payload_relinked_while_being_purged_is_never_lost(race_platform, config):
    """Writers link new messages to payloads by the writer contract while the sink purges the same
    payloads, one race per payload; a linked payload must keep its row and blobs, and an unlinked one
    must go."""
    attempts = ATTEMPTS
    platform = race_platform
    wrongly_deleted, left_behind, outcomes = [], [], Counter()

    def attempt(i: int) -> None:
        p = unreferenced_payload(platform, config)
        gate = threading.Barrier(2)
        result: dict[str, object] = {}

        def purge():
            gate.wait()
            time.sleep(random.random() * 0.01)
            result["purge"] = [o["status"] for o in purge_candidates(config, candidate("payload", p, "payload"))]

        def link():
            gate.wait()
            time.sleep(random.random() * 0.01)
            result["linked"] = platform.link(f"race-link-{uuid.uuid4().hex[:8]}", p)

        threads = [threading.Thread(target=purge), threading.Thread(target=link)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        outcomes[("linked" if result["linked"] else "link refused", "purged" if PURGED in result["purge"]
                  else "kept")] += 1
        if result["linked"] and not platform.payload_intact(p):
            wrongly_deleted.append(p)
        if not result["linked"] and not platform.payload_gone(p):
            left_behind.append(p)

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(attempt, range(attempts)))
    reliability("payload relinked while being purged", injected=attempts, survived=attempts,
                wrongly_deleted=len(wrongly_deleted), left_behind=len(left_behind),
                **{"_".join(k).replace(" ", "_"): v for k, v in outcomes.items()})
    assert wrongly_deleted == [] and left_behind == []
    assert outcomes[("linked", "kept")] and outcomes[("link refused", "purged")], outcomes


# --- kill -9 anywhere, then restart ---------------------------------------------------------------

# Every failpoint the kill test can kill at; bounded, one a run of one per step of the purge protocol (a claim, a
# dependent's delete, the object's own row, the ledger), taken in turn by the seed: four days' runs kill at all four.
# The others are the same steps of other kinds. The protocol's property tests
# (tests/core/test_purge_protocol.py) crash a purge after each of its deletes, whatever its dependents, each run.
FAILPOINTS = ("after_message_delete", "after_payload_dependent_delete", "before_ledger_write", "after_ledger_write",
              "after_user_dependent_delete", "before_unit_of_work_claim", "after_unit_of_work_dependent_delete")
ONE_PER_STEP = ("before_unit_of_work_claim", "after_payload_dependent_delete", "after_message_delete",
                "before_ledger_write")


def test_kill_9_anywhere_then_a_restart_ends_as_a_run_without_kills(spark, config, tmp_path_factory):
    """The purger runs as its own process (`python -m purger.job`). It is killed with SIGKILL at failpoints
    (right after a row's delete, between one data centre's blob and the next, before and after the ledger
    write: each in full, one of one per step in a bounded run) and at random moments, and restarted from its
    checkpoint each time. The end state
    must be that of a run without kills: eligible rows, payload rows and blobs gone, live ones intact, and
    exactly one `purged` ledger record per deletion. Every built-in policy runs, each with objects to
    delete and to keep, and the failpoints include those between a user's or a unit of work's rows."""
    tmp = tmp_path_factory.mktemp("kills")
    every_policy = with_policies(config, {**config.policies, **SETTINGS})
    own = own_config(every_policy, tmp, "kills")
    own = own.model_copy(update={"metrics": own.metrics.model_copy(update={"port": 0})})
    config_file = write_config(own, tmp / "purger.toml")
    platform, objects = Platform(own), PolicyObjects(own)
    eligible: list[str] = []
    live: list[str] = []
    written: list[PolicyObject] = []
    rng = random.Random(5)

    def more_work(n: int = 3) -> None:
        write_work(platform, "kill", n, own, eligible, live)
        written.extend(objects.write(f"kill-{uuid.uuid4().hex[:8]}"))
        objects.flush()

    def start(**env: str) -> subprocess.Popen:
        log = open(tmp / "purger.log", "ab")
        return subprocess.Popen([sys.executable, "-m", "purger.job", "--config", str(config_file)],
                                cwd=ROOT, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    kills = Counter()
    try:
        for point in FAULTS.cases(FAILPOINTS, ONE_PER_STEP, per_run=1):
            more_work()
            marker = tmp / f"{point}.fired"
            process = start(**killed_at(point, marker))
            try:
                assert process.wait(timeout=240) == -signal.SIGKILL and marker.exists(), point
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
            kills[point] += 1
        for _ in range(FAULTS.random_kills):  # and anywhere: at a random moment of a run
            more_work()
            process = start()
            time.sleep(rng.uniform(10, 25))
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            kills["random moment"] += 1

        process = start()
        try:
            wait_for(lambda: all(platform.row(m) is None and platform.payload_gone(f"p-{m}") for m in eligible)
                     and all(objects.gone(o) for o in written if o.eligible),
                     timeout_s=240, what="every eligible row and payload after the restarts")
        finally:
            # SIGTERM to the driver alone stops the query between batches (purger.job); to the whole
            # group it would take the JVM down in the middle of one.
            process.terminate()
            process.wait(timeout=120)
            if _group_alive(process.pid):  # Spark's worker daemon, if it outlived the driver
                os.killpg(process.pid, signal.SIGKILL)
        wrongly_deleted, missing, doubled, unexpected = end_state(spark, platform, own, eligible, live,
                                                                  objects, written)
        reliability("kill -9 and restart", injected=sum(kills.values()), survived=sum(kills.values()),
                    wrongly_deleted=len(wrongly_deleted), left_behind=0, ledger_missing=len(missing),
                    ledger_doubled=len(doubled), **{k.replace(" ", "_"): v for k, v in kills.items()})
        assert wrongly_deleted == []
        assert not missing and not doubled and not unexpected
    finally:
        platform.close()
        objects.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


# --- servers going away ------------------------------------------------------------------------------

def test_cassandra_down_and_a_kafka_restart_lose_nothing(spark, config, servers, tmp_path_factory):
    """Cassandra is stopped (10 s, 30 s in full) while candidates are being purged, then the Kafka broker is
    restarted. The sink records the failed attempts as errors and retries them; a query that fails is
    restarted from its checkpoint, as a supervisor would. At the end every eligible object is gone once,
    in the ledger once, and every live one is intact."""
    if servers != "local":
        pytest.skip("stopping and starting servers needs the local stack")
    from devstack.stack import LocalStack

    stack = LocalStack(log=lambda _: None)
    own = own_config(config, tmp_path_factory.mktemp("outages"), "outages")

    def outages(more_work) -> None:
        stack.stop("cassandra")
        time.sleep(FAULTS.outage_s)
        stack.start("cassandra")
        more_work()
        stack.stop("kafka")
        time.sleep(min(10, FAULTS.outage_s))
        stack.start("kafka")

    run = purge_through_outages(spark, own, "outage", outages)
    reliability(f"cassandra down {FAULTS.outage_s:.0f} s, kafka restarted", injected=2, survived=2, query_restarts=run.restarts,
                error_outcomes=run.error_records, wrongly_deleted=len(run.wrongly_deleted), left_behind=0,
                ledger_missing=len(run.missing), ledger_doubled=len(run.doubled))
    assert run.wrongly_deleted == [] and not run.missing and not run.doubled and not run.unexpected
    assert run.errors or run.error_records or run.restarts, "the outage was not seen by the purger"

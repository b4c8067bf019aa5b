"""Two data centres on a real two-node cluster: node 1 (dc1, 127.0.0.1, the stack's) and node 2 (dc2,
127.0.0.2, joined once for this package: ``tests/integration/two_nodes/conftest.py``). A keyspace of this
module's own is replicated to both; the purger talks to dc1, the platform to dc2.

- Revivals written through dc2 race the purger's double-checked deletes through dc1: none lost at the
  default serial consistency (SERIAL). The same race at LOCAL_SERIAL on both sides is measured, not
  asserted: each data centre then runs its own Paxos, and the count is what that setting risks (README).
- Node 2 stopped (10 s, 30 s in full) while a purger runs: nothing live deleted, nothing lost, every
  eligible message purged once it is back.

Each test prints its counts as a ``RELIABILITY`` line (``pytest -s``). The races' attempts and the outage's
length are the fault matrix's (``tests.support.faults.FAULTS``), each race bounded to ``RACE_TIME_LIMIT_S``.
"""

from __future__ import annotations

import time
import uuid

import pytest

from purger.connectors import cassandra_session
from purger.core.settings import PurgerConfig
from purger.core.vocabulary import PURGED, SKIPPED
from devstack.stack import SECOND_NODE, create_schema
from simulation.mailbox import Platform
from tests.support.configs import own_config
from tests.support.faults import FAULTS, reliability
from tests.support.mailbox import message_purge, purge_through_outages
from tests.support.races import RaceResult, revival_race

pytestmark = pytest.mark.integration

# At most 2,000 bounded (FaultMatrix.cross_dc_attempts), within RACE_TIME_LIMIT_S: at 400 attempts a fresh-clone
# run saw the delete through the other data centre never land first (the check that each side wins some failed).
# A bounded run ends sooner once each side has won WINS_EACH times, after as many attempts as a race in one data
# centre; a full run makes every attempt.
ATTEMPTS = FAULTS.cross_dc_attempts
RACE_TIME_LIMIT_S = 180
WINS_EACH = 10


@pytest.fixture(scope="module")
def purger_config(config, second_node, tmp_path_factory) -> PurgerConfig:
    """The session's configuration on a keyspace of its own replicated to dc1 and dc2, talking to dc1."""
    keyspace = f"two_dcs_{uuid.uuid4().hex[:8]}"
    cassandra = config.cassandra.model_copy(update={"hosts": ["127.0.0.1"], "local_data_centre": "dc1",
                                                    "keyspace": keyspace})
    two_dcs = config.model_copy(update={"cassandra": cassandra})
    create_schema(two_dcs, data_centres=("dc1", "dc2"))
    yield own_config(two_dcs, tmp_path_factory.mktemp("two-dcs"), "two-dcs")
    session = cassandra_session(config.cassandra)
    try:
        session.execute(f"DROP KEYSPACE {keyspace}", timeout=60)
    finally:
        session.cluster.shutdown()


def through_dc2(config: PurgerConfig) -> PurgerConfig:
    """The same configuration talking to node 2 in dc2, as the platform's other data centre does."""
    cassandra = config.cassandra.model_copy(update={"hosts": ["127.0.0.2"], "local_data_centre": "dc2"})
    return config.model_copy(update={"cassandra": cassandra})


def at_serial_consistency(config: PurgerConfig, level: str) -> PurgerConfig:
    return config.model_copy(update={"cassandra": config.cassandra.model_copy(update={"serial_consistency": level})})


def race_across_data_centres(config: PurgerConfig) -> RaceResult:
    """Revivals through dc2 against the purger's deletes through dc1, at ``config``'s serial consistency."""
    platform = Platform(through_dc2(config))
    session = cassandra_session(config.cassandra)
    try:
        deleter, _ = message_purge(session, config)
        return revival_race(platform, deleter, platform.session, config, ATTEMPTS, RACE_TIME_LIMIT_S,
                            enough=None if FAULTS.full else each_side_won)
    finally:
        session.cluster.shutdown()
        platform.close()


def each_side_won(race: RaceResult) -> bool:
    return race.attempts >= FAULTS.attempts and min(race.outcomes[f"{PURGED}, revival found no row"],
                                                    race.outcomes[f"{SKIPPED}, revival applied"]) >= WINS_EACH


def report(race: RaceResult, level: str) -> None:
    reliability(f"revival through dc2 racing the delete through dc1 at {level}", injected=race.attempts,
                survived=race.attempts, wrongly_deleted=len(race.lost), left_behind=len(race.left),
                seconds=round(race.seconds), **race.counts())


def test_a_revival_through_another_data_centre_is_never_lost_at_serial(purger_config):
    race = race_across_data_centres(at_serial_consistency(purger_config, "SERIAL"))
    report(race, "SERIAL")
    assert race.lost == [] and race.left == []
    assert race.outcomes[f"{PURGED}, revival found no row"] and race.outcomes[f"{SKIPPED}, revival applied"], \
        race.outcomes


@pytest.mark.skipif(not FAULTS.measured_races, reason="a measurement, not a guarantee: make faults-full")
def test_the_same_race_at_local_serial_is_measured(purger_config):
    """Not asserted: LOCAL_SERIAL runs each data centre's check apart, and the count printed is what it risks."""
    race = race_across_data_centres(at_serial_consistency(purger_config, "LOCAL_SERIAL"))
    report(race, "LOCAL_SERIAL")
    # The race was real: each side won some.
    assert race.outcomes[f"{PURGED}, revival found no row"] and race.outcomes[f"{SKIPPED}, revival applied"], \
        race.outcomes


def test_a_node_down_loses_nothing(spark, purger_config, second_node, tmp_path_factory):
    """Node 2 is stopped (``FAULTS.outage_s``) while the purger purges through node 1. At SERIAL its conditional deletes
    need both data centres, so they fail meanwhile, are recorded as errors and retried; once node 2 is back
    every eligible message is gone, in the ledger once, and every live one intact."""
    own = own_config(purger_config, tmp_path_factory.mktemp("dc-outage"), "dc-outage")

    def outage(more_work) -> None:
        second_node.stop(SECOND_NODE.name)
        time.sleep(FAULTS.outage_s)
        second_node.start(SECOND_NODE.name)

    run = purge_through_outages(spark, own, "dc-outage", outage)
    reliability(f"cassandra node 2 (dc2) down {FAULTS.outage_s:.0f} s", injected=1, survived=1, query_restarts=run.restarts,
                error_outcomes=run.errors, wrongly_deleted=len(run.wrongly_deleted), left_behind=0,
                ledger_missing=len(run.missing), ledger_doubled=len(run.doubled))
    assert run.wrongly_deleted == [] and not run.missing and not run.doubled and not run.unexpected

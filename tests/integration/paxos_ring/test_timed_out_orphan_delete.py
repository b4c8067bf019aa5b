"""An orphan sweep's conditional delete of a user's virtual root that timed out, its settling read failed too, and
the user added back once the sweep released its claim (issue 51; RELIABILITY.md, "Races with other writers").

The sweep deletes a user's rows only under its placeholder ``users`` row, which the writer of the contract waits
for; the writer's root and permissions are plain writes, made once its lightweight add applied. On Paxos v1 the
delete's proposal, accepted by node 1 alone and not committed, would be finished by the next Paxos round on the
root's row (the next sweep's serial read, the platform's own) under a newer ballot, over the root the writer wrote
after the release. So the sweep settles each of its deletes by a serial read before it releases its claims
(``ClaimingOrphanRowPurge.release_claims``).

The oracle is the root the writer wrote, read at ALL after a later serial read of its row.
"""

from __future__ import annotations

import uuid

import pytest
from cassandra import ConsistencyLevel

from purger.config import with_policies
from purger.core.times import duration_ms, now_ms
from purger.core.vocabulary import ALL_DCS, ERROR
from purger.reconcile.orphan_purges import Sweep, decide, ledger_query_id, orphan_purge
from purger.testing import injected
from simulation.policy_objects import SETTINGS

pytestmark = pytest.mark.integration

LONG_AGO_US = 1_000_000 * 1_700_000_000  # 2023: far older than any grace


@pytest.fixture(scope="module")
def users_config(ring_config):
    """The ring's configuration with the users policy, its tables made on the ring."""
    from devstack.stack import create_schema

    config = with_policies(ring_config, {**ring_config.policies, "users": SETTINGS["users"]})
    create_schema(config)
    return config


@pytest.fixture
def session(users_config):
    from purger.connectors import cassandra_session

    session = cassandra_session(users_config.cassandra, users_config.cassandra.keyspace)
    yield session
    session.cluster.shutdown()


def root_sweep(config) -> Sweep:
    policy = config.policy_set.policy_of("user")
    grace_ms = duration_ms(config.reconcile.orphan_grace)
    return Sweep(policy.name, policy.orphan_rows[0], "virtual_roots", None, grace_ms, now_ms() - grace_ms, False,
                 ledger_query_id(uuid.uuid4().hex[:12], policy.name, "virtual_roots", ALL_DCS),
                 tuple(sorted(policy.table_names().items())))


def test_a_user_added_back_after_the_sweep_keeps_the_root_whose_old_delete_timed_out_unsettled(
        paxos_ring, users_config, session):
    from simulation.users import UsersPlatform

    user = f"again-{uuid.uuid4().hex[:6]}"
    session.execute(f"INSERT INTO virtual_roots (user_id, mailbox) VALUES ('{user}', 'old-inbox') "
                    f"USING TIMESTAMP {LONG_AGO_US}")
    sweep = root_sweep(users_config)

    def at(name: str) -> None:
        if name == "before_virtual_roots_delete":
            paxos_ring.answer_late(accepts=True)  # node 1 alone accepts the delete: a timeout
        elif name == "after_virtual_roots_delete_failed":
            paxos_ring.answer_late(accepts=True, promises=True)  # the settling read's repair refused: it fails

    try:
        with injected(at):
            decided = decide(users_config, sweep, user, LONG_AGO_US // 1000, None)
    finally:
        paxos_ring.answer_late()
    assert decided[5] == ERROR, decided  # neither the delete nor its settling read answered

    orphan_purge(users_config, sweep).release_claims(sweep.query_id)  # the sweep's end
    platform = UsersPlatform(users_config.kafka, users_config.cassandra, users_config.kafka.topics[0],
                             users_config.cassandra.keyspace, users_config.policy_set.policy_of("user").settings)
    try:
        platform.add_user(user, "dc1", mailboxes=("new-inbox",))
    finally:
        platform.close()

    # The next Paxos round on the root's row: a later sweep's serial read.
    serial = session.prepare("SELECT mailbox FROM virtual_roots WHERE user_id = ?")
    serial.consistency_level = ConsistencyLevel.SERIAL
    session.execute(serial, (user,))
    at_all = session.prepare("SELECT mailbox FROM virtual_roots WHERE user_id = ?")
    at_all.consistency_level = ConsistencyLevel.ALL
    root = session.execute(at_all, (user,)).one()
    assert root is not None and root.mailbox == "new-inbox", "the writer's root went under the sweep's old delete"

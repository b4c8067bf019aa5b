"""Token-aware routing on the local stack's two Cassandra nodes: node 1 (dc1, 127.0.0.1, the stack's) and node 2
(dc2, 127.0.0.2, started for this module and decommissioned after it, unless it ran already).

The stack has one node per data centre, and the purger's session sends nothing outside its local data centre,
so there every request goes to node 1 whatever its key. A keyspace of this module's own replicated by
``SimpleStrategy`` with one replica, which ignores data centres, makes the two nodes hold different keys: node 2
owns the tokens (0, 2**62], a quarter of the ring, node 1 the rest. On it:

- a session that counts both nodes local (the driver's ``RoundRobinPolicy``), as the purger's counts the nodes of
  its own data centre, runs the mailbox's writes and purges for many messages: key-blind, as the purger's session
  was, about half the requests reach a replica of their key; token-aware, as it is now, every one does;
- the reconcile's token-range scan sends each page to a replica of its range;
- the purger's own session (``cassandra_session``, local data centre dc1) sends every request whose key has a
  replica in dc1 to it, and none to dc2, nor any page of a scan.

And on the stack's one node: a scan whose replica cannot be reached goes on through the session's policy.

Reads and writes run at QUORUM here: at LOCAL_QUORUM a key whose one replica is node 2 has none in dc1 to answer.
Each test prints its counts (``pytest -s``).
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, ResponseFuture, Session
from cassandra.policies import RoundRobinPolicy, TokenAwarePolicy

from purger.connectors import cassandra_session
from purger.reconcile.token_ranges import partition_key, scan_ranges, token_ranges
from purger.core.settings import PurgerConfig
from purger.core.vocabulary import PURGED
from purger.policies.mailbox.rules import EXPIRED_BY_COUNTER
from devstack.stack import create_schema
from tests.support.mailbox import message_purge, purge_message
from tests.support.waits import wait_for

MESSAGES = 60


@pytest.fixture(scope="module")
def ring_config(config, second_node) -> PurgerConfig:
    """The session's configuration on a keyspace of its own, one replica by SimpleStrategy (each node holds its
    tokens' share), talking to dc1 at QUORUM; node 2 joined."""
    keyspace = f"token_aware_{uuid.uuid4().hex[:8]}"
    cassandra = config.cassandra.model_copy(update={"local_data_centre": "dc1", "keyspace": keyspace,
                                                    "consistency": "QUORUM", "serial_consistency": "SERIAL"})
    own = config.model_copy(update={"cassandra": cassandra})
    session = cassandra_session(config.cassandra)
    try:
        session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}", timeout=60)
        create_schema(own)  # the tables and the journal; the keyspace exists, so its replication stays
        yield own
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
        session.cluster.shutdown()


def both_local(config: PurgerConfig, token_aware: bool) -> Session:
    """A session on both nodes that counts both local: token-aware as the purger's session is, or key-blind as it
    was (round robin over the local nodes)."""
    policy = TokenAwarePolicy(RoundRobinPolicy(), shuffle_replicas=True) if token_aware else RoundRobinPolicy()
    profile = ExecutionProfile(load_balancing_policy=policy, consistency_level=ConsistencyLevel.QUORUM,
                               serial_consistency_level=ConsistencyLevel.SERIAL, request_timeout=30)
    cluster = Cluster(config.cassandra.hosts, execution_profiles={EXEC_PROFILE_DEFAULT: profile}, protocol_version=5)
    session = cluster.connect()
    # The pools to the nodes open in the background: until both are open, the token-aware policy skips a replica
    # it has no pool to, and the first requests would measure the connecting, not the routing.
    wait_for(lambda: len(session.get_pool_state()) == len(cluster.metadata.all_hosts()) == 2, 30,
             "a pool to each of the two nodes")
    return session


class Sent:
    """Every request a session sends, from the driver's hook (as ``connectors.request_counts`` counts them); each
    future names the hosts it was sent to, in order (``attempted_hosts``), and the one that answered
    (``coordinator_host``)."""

    def __init__(self, session: Session) -> None:
        self.futures: list[ResponseFuture] = []
        session.add_request_init_listener(self.futures.append)

    def since(self, mark: int) -> list[ResponseFuture]:
        return self.futures[mark:]


def by_replica(session: Session, futures: list[ResponseFuture]) -> Counter[str]:
    """The keyed requests by where they went: ``replica`` of their key, ``other`` host; and ``unkeyed``."""
    metadata = session.cluster.metadata
    where: Counter[str] = Counter()
    for future in futures:
        query = future.query
        if query.routing_key is None:
            where["unkeyed"] += 1
            continue
        replicas = metadata.get_replicas(query.keyspace, query.routing_key)
        # Where the request was sent first: a retry after a timeout goes on to the next host of the plan, which
        # under load is the other node, whatever the routing.
        where["replica" if future.attempted_hosts[0] in replicas else "other"] += 1
    return where


def write_messages(session: Session, keyspace: str, count: int) -> list[tuple[str, str]]:
    """``count`` messages expired by their counter an hour ago, each with a stored payload referred to by it, as the
    platform writes them: (message id, payload id)."""
    insert_payload = session.prepare(f"INSERT INTO {keyspace}.payloads (payload_id, size, dcs, state, last_ref_at, "
                                     "created_at) VALUES (?, 64, {'dc1'}, 'live', ?, ?)")
    insert_ref = session.prepare(f"INSERT INTO {keyspace}.payload_refs (payload_id, message_id) VALUES (?, ?)")
    insert_message = session.prepare(
        f"INSERT INTO {keyspace}.messages (message_id, mailbox, payload_id, payload_size, extract_count, complete, "
        "created_at, updated_at) VALUES (?, 'inbox', ?, 64, 0, true, ?, ?)")
    an_hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    messages = [(f"m-{uuid.uuid4().hex[:12]}", f"p-{uuid.uuid4().hex[:12]}") for _ in range(count)]
    for message_id, payload_id in messages:
        session.execute(insert_payload, (payload_id, an_hour_ago, an_hour_ago))
        session.execute(insert_ref, (payload_id, message_id))
        session.execute(insert_message, (message_id, payload_id, an_hour_ago, an_hour_ago))
    return messages


def write_and_purge(session: Session, config: PurgerConfig) -> tuple[list[ResponseFuture], Counter[str]]:
    """The platform's writes and the purger's purge (its read, journal, conditional delete and payload release) of
    ``MESSAGES`` messages on ``session``: the requests sent, and the outcomes."""
    sent = Sent(session)
    messages = write_messages(session, config.cassandra.keyspace, MESSAGES)
    purge, _ = message_purge(session, config)
    outcomes = Counter(purge_message(purge, message_id, EXPIRED_BY_COUNTER, payload_id).status
                       for message_id, payload_id in messages)
    return sent.futures, outcomes


def test_every_request_of_a_purge_reaches_a_replica_of_its_key(ring_config):
    """The same writes and purges, key-blind then token-aware, over two local nodes that hold different keys."""
    where = {}
    for token_aware in (False, True):
        session = both_local(ring_config, token_aware)
        try:
            futures, outcomes = write_and_purge(session, ring_config)
            where[token_aware] = by_replica(session, futures)
        finally:
            session.cluster.shutdown()
        assert outcomes == Counter({PURGED: MESSAGES}), outcomes
    blind, aware = where[False], where[True]
    print("TOKEN-AWARE purge requests to a replica of their key: key-blind",
          f"{blind['replica']}/{blind.total()}, token-aware {aware['replica']}/{aware.total()}")
    assert aware == Counter(replica=aware.total()), aware  # every request keyed, every one routed
    assert blind["other"] > 0, blind  # round robin reached a replica only by chance


def test_each_page_of_a_token_range_scan_goes_to_a_replica_of_its_range(ring_config):
    """The reconcile's scan of the payloads, with their references beside them (``referenced_by``), in pages of 10
    rows: each page of each range to a replica of that range."""
    keyspace = ring_config.cassandra.keyspace
    session = both_local(ring_config, token_aware=True)
    try:
        payloads = {payload_id for _, payload_id in write_messages(session, keyspace, MESSAGES)}
        sent = Sent(session)
        token_map = session.cluster.metadata.token_map
        key = partition_key(session, keyspace, "payloads")
        pages, referenced = Counter(), set()
        for start, end in token_ranges(session, count=8):
            mark = len(sent.futures)
            for row in scan_ranges(session, keyspace, "payloads", key, ["payload_id"], [(start, end)], "QUORUM",
                                   page_size=10, referenced_by="payload_refs"):
                if row["referenced"]:
                    referenced.add(row["payload_id"])
            replicas = token_map.get_replicas(keyspace, token_map.token_class(end))
            pages.update("replica" if f.coordinator_host in replicas else "other" for f in sent.since(mark))
    finally:
        session.cluster.shutdown()
    print(f"TOKEN-AWARE scan pages to a replica of their range: {pages['replica']}/{pages.total()}")
    assert payloads <= referenced
    assert pages["other"] == 0 and pages["replica"] >= MESSAGES // 10, pages


def test_the_purgers_session_routes_to_replicas_of_its_own_data_centre(ring_config):
    """``cassandra_session``: token-aware over dc1. A key owned by node 2 (dc2) goes to node 1 all the same: the
    purger never leaves its local data centre."""
    session = cassandra_session(ring_config.cassandra)
    try:
        futures, outcomes = write_and_purge(session, ring_config)
        metadata = session.cluster.metadata
        went: Counter[tuple[str, str]] = Counter()
        for future in futures:
            replicas = metadata.get_replicas(future.query.keyspace, future.query.routing_key)
            coordinator = future.coordinator_host
            went[(replicas[0].datacenter, "replica" if coordinator in replicas else coordinator.datacenter)] += 1
        sent = Sent(session)
        key = partition_key(session, ring_config.cassandra.keyspace, "payloads")
        for _ in scan_ranges(session, ring_config.cassandra.keyspace, "payloads", key, ["payload_id"],
                             token_ranges(session, count=8), "QUORUM", page_size=10):
            pass
        scanned_through = Counter(future.coordinator_host.datacenter for future in sent.futures)
        policy = session.get_execution_profile(EXEC_PROFILE_DEFAULT).load_balancing_policy
    finally:
        session.cluster.shutdown()
    print("TOKEN-AWARE the purger's session, requests by (data centre of the key's replica, where they went):",
          dict(went), "scan pages by data centre:", dict(scanned_through))
    assert outcomes == Counter({PURGED: MESSAGES}), outcomes
    assert set(went) == {("dc1", "replica"), ("dc2", "dc1")}, went
    assert set(scanned_through) == {"dc1"}, scanned_through
    assert isinstance(policy, TokenAwarePolicy)


def test_a_scan_goes_on_through_the_policy_once_its_replica_stops_answering(config, monkeypatch):
    """On the stack's real node: the replica the scan names is one the session cannot reach (no node at that
    address, as a replica that went down after the token map was read); the driver refuses the named host, and
    the scan reads the range through the session's policy instead, every row once."""
    from cassandra.policies import SimpleConvictionPolicy
    from cassandra.pool import Host

    session = cassandra_session(config.cassandra, config.cassandra.keyspace)
    try:
        table = config.policy_set.policy_of("payload").settings.payloads_table
        ids = [f"gone-replica-{uuid.uuid4().hex[:8]}-{n}" for n in range(3)]
        insert = session.prepare(f"INSERT INTO {table} (payload_id, state) VALUES (?, 'live')")
        for payload_id in ids:
            session.execute(insert, (payload_id,))
        unreachable = Host("127.0.0.3", SimpleConvictionPolicy)
        monkeypatch.setattr("purger.reconcile.token_ranges._local_replica", lambda *_: unreachable)
        key = partition_key(session, config.cassandra.keyspace, table)
        rows = scan_ranges(session, config.cassandra.keyspace, table, key, ["payload_id"], token_ranges(session, 4),
                           "LOCAL_QUORUM", page_size=2)
        assert sorted(row["payload_id"] for row in rows if row["payload_id"] in ids) == sorted(ids)
    finally:
        session.execute(f"DELETE FROM {table} WHERE payload_id IN ({', '.join('%s' for _ in ids)})", ids)
        session.cluster.shutdown()

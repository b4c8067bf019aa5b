"""Three Cassandra nodes of their own on 127.0.0.4-6 (devstack.paxos_ring), started for this package's tests and
stopped after its last (``scope="package"``): 75 s to start and 20 s to stop on 2 cores, beside the suite's own
stack, so the package runs with ``PURGER_FAULTS=full`` (``make faults-full``) and is skipped otherwise, CI
included (docs/development.md)."""

import pytest


@pytest.fixture(scope="package")
def paxos_ring(servers):
    from devstack.paxos_ring import PaxosRing
    from tests.support.faults import fault_matrix

    if not fault_matrix().full:
        pytest.skip("three Cassandra nodes of their own (about 100 s): run with PURGER_FAULTS=full, make faults-full")

    ring = PaxosRing(log=lambda _: None)
    ring.up()
    yield ring
    ring.down()


@pytest.fixture(scope="package")
def ring_config(config, paxos_ring):
    """The suite's configuration with Cassandra the ring, its keyspace replicated to all three nodes, the mailbox
    policy's tables made; Kafka and the object stores the local stack's."""
    from purger.connectors import cassandra_session
    from devstack.stack import create_schema

    ring_config = config.model_copy(update={"cassandra": paxos_ring.client()})
    session = cassandra_session(ring_config.cassandra)
    try:
        session.execute(f"CREATE KEYSPACE IF NOT EXISTS {ring_config.cassandra.keyspace} WITH replication = "
                        "{'class': 'NetworkTopologyStrategy', 'dc1': 3}", timeout=60)
    finally:
        session.cluster.shutdown()
    create_schema(ring_config)
    return ring_config

"""The secured servers, started for this package's tests and stopped after its last (``scope="package"``): two
JVMs that would otherwise idle beside the rest of the suite."""

import pytest


@pytest.fixture(scope="package")
def secure_kafka_broker(tmp_path_factory):
    """A second Kafka broker that takes SASL_SSL only (PLAIN and SCRAM-SHA-512), with a certificate authority
    made for it (tests.support.secure_kafka): its address, the authority's file, a login per mechanism."""
    from tests.support.secure_kafka import secure_kafka

    with secure_kafka(tmp_path_factory.mktemp("secure-kafka")) as broker:
        yield broker


@pytest.fixture(scope="package")
def secure_cassandra_node(servers):
    """A Cassandra node of its own on 127.0.0.3 that requires a login and TLS (devstack.secure_cassandra)."""
    from devstack.secure_cassandra import SecureCassandra

    node = SecureCassandra(log=lambda _: None)
    node.up()
    yield node
    node.down()

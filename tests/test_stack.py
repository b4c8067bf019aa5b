"""The servers answer and hold what the purger expects."""

import pytest
from kafka.admin import KafkaAdminClient

from purger.connections import cassandra_session, s3_client
from purger.stack import LocalStack

pytestmark = pytest.mark.integration


def test_topics_keyspace_and_buckets_exist(config):
    admin = KafkaAdminClient(bootstrap_servers=config.kafka.bootstrap_servers)
    try:
        assert set(config.kafka.topics) | {config.kafka.clock_topic} <= set(admin.list_topics())
    finally:
        admin.close()
    session = cassandra_session(config.cassandra)
    try:
        tables = {r.table_name for r in session.execute(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (config.cassandra.keyspace,))}
    finally:
        session.cluster.shutdown()
    assert {"messages", "payload_refs", "payloads"} <= tables
    for store in config.stores.values():
        buckets = {b["Name"] for b in s3_client(store).list_buckets()["Buckets"]}
        assert store.bucket in buckets


def test_status_reports_the_recorded_processes(servers):
    if servers != "local":
        pytest.skip("the servers were not started by the local stack")
    status = LocalStack().status()
    assert all(state.startswith("running (pid") for state in status.values()), status

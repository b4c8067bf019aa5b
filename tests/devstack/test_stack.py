"""The servers answer and hold what the purger expects."""

import pytest
from kafka.admin import KafkaAdminClient

from purger.connectors import cassandra_session, s3_client
from devstack.stack import LocalStack

pytestmark = pytest.mark.integration


def test_topics_keyspace_and_buckets_exist(config):
    admin = KafkaAdminClient(bootstrap_servers=config.kafka.bootstrap_servers)
    try:
        assert set(config.kafka.topics) | {config.kafka.control_topic, config.kafka.dead_letter_topic} <= set(admin.list_topics())
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


def test_a_server_that_does_not_come_up_names_its_address_and_log(tmp_path):
    from dataclasses import dataclass

    from devstack import artifacts
    from devstack.stack import Server, StackError

    @dataclass
    class BrokenServer(Server):
        @property
        def home(self):
            return tmp_path / "broken"

    def never_ready():
        raise ConnectionRefusedError("nothing listens")

    broken = BrokenServer(
        "broken", "127.0.0.1:9", artifacts.KAFKA, "no.such.MainClass", "64m",
        lambda home: [], never_ready, start_timeout=60,
    )
    with pytest.raises(StackError) as error:
        LocalStack([broken], log=lambda line: None).up()
    message = str(error.value)
    assert "127.0.0.1:9" in message and "exited with code" in message
    assert "no.such.MainClass" in message  # the JVM's own words, from the log's tail
    assert broken.pid() is None


def test_a_server_that_stops_answering_while_the_stack_is_prepared_is_one_line_and_exit_1(capsys):
    """Two starters at once: one prepares the stack while the other stops a server it found half started."""
    import typer

    from devstack.__main__ import _or_exit
    from purger.connectors.errors import ServerUnavailable

    line = "Cassandra at 127.0.0.1:9042 does not answer (connection refused): check cassandra.hosts"

    def prepare() -> None:
        raise ServerUnavailable(line)

    with pytest.raises(typer.Exit) as stopped:
        _or_exit(prepare)
    assert stopped.value.exit_code == 1 and capsys.readouterr().err == line + "\n"

"""`purger setup` and the checks `purger run` makes before Spark starts, on the real servers: the purger's
own topics created once, and each thing missing on the platform reported in exactly one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from typer.testing import CliRunner

from purger.config import with_policies
from purger.connectors import cassandra_session
from purger.core.settings import PurgerConfig
from purger.core.sizing import Volume, size
from purger.policies.mailbox import MailboxPolicy
from purger.cli import app
from purger.output import sizing_lines
from tests.support.configs import free_port, write_config
from tests.support.policies import policy_keyspace
from tests.support import ROOT

pytestmark = pytest.mark.integration

# The file alone says where the servers are: an endpoint in the environment would override it.
NO_OVERRIDES = {"PURGER_KAFKA_BOOTSTRAP": None, "PURGER_CASSANDRA_HOSTS": None, "PURGER_S3_ENDPOINT": None}


def variant(config: PurgerConfig, **sections: dict) -> PurgerConfig:
    """``config`` with some keys of some sections changed: ``variant(config, kafka={"topics": [...]})``."""
    return config.model_copy(update={name: getattr(config, name).model_copy(update=keys)
                                     for name, keys in sections.items()})


def setup(config: PurgerConfig, tmp_path: Path):
    """``purger setup`` on ``config``: the CLI's result (exit code, stdout, stderr)."""
    config_file = write_config(config, tmp_path / f"purger-{uuid.uuid4().hex[:6]}.toml")
    return CliRunner().invoke(app, ["setup", "--config", str(config_file)], env=NO_OVERRIDES)


def problems(config: PurgerConfig, tmp_path: Path) -> list[str]:
    """``purger setup`` on a configuration with problems: it exits 2; the lines it printed on stderr."""
    result = setup(config, tmp_path)
    assert result.exit_code == 2, result.output
    return result.stderr.splitlines()


def cassandra_address(config: PurgerConfig) -> str:
    return ", ".join(f"{host}:{config.cassandra.port}" for host in config.cassandra.hosts)


def remove_what_setup_made(own: PurgerConfig, admin: KafkaAdminClient) -> None:
    """The purger's own topics (and a dry run's) and the tables ``setup`` made for ``own``."""
    admin.delete_topics([own.kafka.control_topic, own.kafka.dead_letter_topic, own.kafka.reconcile_topic,
                         f"{own.kafka.control_topic}.dry-run", f"{own.kafka.dead_letter_topic}.dry-run"])
    admin.close()
    session = cassandra_session(own.cassandra)
    for table in (own.cassandra.journal_table, own.cassandra.holds_table, own.cassandra.failures_table,
                  own.cassandra.restorations_table, own.cassandra.restoration_names_table):
        session.execute(f"DROP TABLE IF EXISTS {own.cassandra.keyspace}.{table}")
    session.cluster.shutdown()


def test_setup_creates_the_purgers_topics_once_then_has_nothing_to_do(config, tmp_path):
    run = uuid.uuid4().hex[:8]
    own = variant(config, kafka={"control_topic": f"test.{run}.setup.control",
                                 "dead_letter_topic": f"test.{run}.setup.dead-letter",
                                 "reconcile_topic": f"test.{run}.setup.reconcile"},
                  cassandra={"journal_table": f"journal_{run}", "holds_table": f"holds_{run}",
                             "failures_table": f"failures_{run}", "restorations_table": f"restorations_{run}",
                             "restoration_names_table": f"restoration_names_{run}"})
    keyspace = config.cassandra.keyspace
    bootstrap = config.kafka.bootstrap_servers
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        first = setup(own, tmp_path)
        assert first.exit_code == 0, first.output
        assert first.stderr == ""
        assert [line for line in first.stdout.splitlines() if line.startswith("created")] == [
            f"created topic test.{run}.setup.control (kafka.control_topic: 1 partition, kept 30 days) "
            f"on Kafka {bootstrap}",
            f"created topic test.{run}.setup.dead-letter (kafka.dead_letter_topic: 1 partition, kept 30 days) "
            f"on Kafka {bootstrap}",
            f"created topic test.{run}.setup.reconcile (kafka.reconcile_topic: 2 partitions, kept 7 days) "
            f"on Kafka {bootstrap}",
            f"created topic test.{run}.setup.control.dry-run (kafka.control_topic of a dry run: 1 partition, "
            f"kept 30 days) on Kafka {bootstrap}",
            f"created topic test.{run}.setup.dead-letter.dry-run (kafka.dead_letter_topic of a dry run: 1 partition, "
            f"kept 30 days) on Kafka {bootstrap}",
            f"created table {keyspace}.journal_{run} (cassandra.journal_table, the purger's journal) "
            f"on Cassandra {cassandra_address(config)}",
            f"created table {keyspace}.holds_{run} (cassandra.holds_table, the legal holds) "
            f"on Cassandra {cassandra_address(config)}",
            f"created table {keyspace}.failures_{run} (cassandra.failures_table, the failing purges) "
            f"on Cassandra {cassandra_address(config)}",
            f"created table {keyspace}.restorations_{run} (cassandra.restorations_table, the undo window's images) "
            f"on Cassandra {cassandra_address(config)}",
            f"created table {keyspace}.restoration_names_{run} (cassandra.restoration_names_table, where an erasure "
            f"finds a subject's images) on Cassandra {cassandra_address(config)}",
        ]
        described = {t["name"]: len(t["partitions"]) for t in admin.describe_topics(
            [own.kafka.control_topic, own.kafka.dead_letter_topic, own.kafka.reconcile_topic])}
        # The reconcile topic as the events topic: conftest's has 2 partitions.
        assert described == {own.kafka.control_topic: 1, own.kafka.dead_letter_topic: 1, own.kafka.reconcile_topic: 2}
        settings = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, own.kafka.control_topic)])
        control = settings["topic"][own.kafka.control_topic]
        assert control["retention.ms"]["value"] == str(30 * 86_400_000)
        assert control["cleanup.policy"]["value"] == "delete"

        again = setup(own, tmp_path)
        assert again.exit_code == 0, again.output
        assert again.stderr == "" and "created" not in again.stdout
        assert again.stdout.splitlines()[0] == "nothing to create: the purger's own topics and tables exist"
        assert f"in place on Kafka {bootstrap}: events topic {config.kafka.topics[0]}, " \
               f"topic {own.kafka.control_topic}, topic {own.kafka.dead_letter_topic}, " \
               f"topic {own.kafka.reconcile_topic}" in again.stdout
    finally:
        remove_what_setup_made(own, admin)


def test_setup_at_a_rate_prints_what_it_needs_and_gives_the_purgers_topics_its_partitions(config, tmp_path):
    """`purger setup --rate 20M`: the estimate and settings first, then the reconcile topic created with as many
    partitions as the state needs at that volume; at twice the rate, the topic is one line with the command
    that adds the partitions."""
    run = uuid.uuid4().hex[:8]
    own = variant(config, kafka={"control_topic": f"test.{run}.rate.control",
                                 "dead_letter_topic": f"test.{run}.rate.dead-letter",
                                 "reconcile_topic": f"test.{run}.rate.reconcile"},
                  cassandra={"journal_table": f"journal_{run}", "holds_table": f"holds_{run}",
                             "failures_table": f"failures_{run}", "restorations_table": f"restorations_{run}",
                             "restoration_names_table": f"restoration_names_{run}"})
    config_file = write_config(own, tmp_path / "purger.toml")
    admin = KafkaAdminClient(bootstrap_servers=config.kafka.bootstrap_servers)
    try:
        sized = size(Volume(20e6, reconcile_rows_per_s=own.reconcile.max_rows_per_second))
        result = CliRunner().invoke(app, ["setup", "--config", str(config_file), "--rate", "20M"], env=NO_OVERRIDES)
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines()[:len(sizing_lines(sized))] == sizing_lines(sized)
        described = {t["name"]: len(t["partitions"]) for t in admin.describe_topics(
            [own.kafka.control_topic, own.kafka.reconcile_topic])}
        assert sized.reconcile_topic_partitions == 24
        assert described == {own.kafka.control_topic: 1, own.kafka.reconcile_topic: 24}

        twice = size(Volume(40e6, reconcile_rows_per_s=own.reconcile.max_rows_per_second))
        result = CliRunner().invoke(app, ["setup", "--config", str(config_file), "--rate", "40M"], env=NO_OVERRIDES)
        assert result.exit_code == 2, result.output
        assert result.stderr.splitlines() == [
            f"Kafka {config.kafka.bootstrap_servers}: topic {own.kafka.reconcile_topic} (kafka.reconcile_topic) has 24 "
            f"partitions, {twice.reconcile_topic_partitions} at this rate: kafka-topics.sh --alter --topic "
            f"{own.kafka.reconcile_topic} --partitions {twice.reconcile_topic_partitions}"]
        # As JSON, for a script: the estimate, what was found, the problem (on stderr too), the same exit code.
        as_json = CliRunner().invoke(app, ["setup", "--config", str(config_file), "--rate", "40M", "--json"],
                                     env=NO_OVERRIDES)
        assert as_json.exit_code == 2 and as_json.stderr.splitlines() == result.stderr.splitlines()
        document = json.loads(as_json.stdout)
        assert document["problems"] == result.stderr.splitlines()
        assert document["sizing"]["reconcile_topic_partitions"] == twice.reconcile_topic_partitions
    finally:
        remove_what_setup_made(own, admin)


def test_an_events_topic_that_does_not_exist_is_one_line(config, tmp_path):
    missing = f"test.{uuid.uuid4().hex[:8]}.no-such-events"
    assert problems(variant(config, kafka={"topics": [missing]}), tmp_path) == [
        f"Kafka {config.kafka.bootstrap_servers}: events topic {missing} (kafka.topics) does not exist; it is the "
        "platform's: create it there, or correct kafka.topics"]


def test_a_table_that_does_not_exist_under_its_configured_name_is_one_line(config, tmp_path):
    renamed = {**config.policies, "mailbox": {**config.policies.get("mailbox", {}),
                                              "payloads_table": "no_such_payloads"}}
    lines = problems(with_policies(config, renamed), tmp_path)
    assert lines == [
        f"Cassandra {cassandra_address(config)}: table {config.cassandra.keyspace}.no_such_payloads does not exist "
        "(policy mailbox reads it); create it as in the policy's reference schema (run `purger schema` to see the "
        "reference CQL), or correct its name in [policies.mailbox]"]


def test_the_reference_schema_makes_the_tables_setup_checks_under_their_configured_names(config, tmp_path):
    """What `purger schema` prints, run on a fresh keyspace, is what `purger setup` then finds in place."""
    from purger.setup import policy_schema, reference_schema

    keyspace = f"test_schema_{uuid.uuid4().hex[:8]}"
    renamed = with_policies(variant(config, cassandra={"keyspace": keyspace}),
                            {**config.policies, "mailbox": {**config.policies.get("mailbox", {}),
                                                            "payloads_table": "blobs"}})
    session = cassandra_session(config.cassandra)
    # The keyspace as `purger schema --replication <the stack's data centre>:1` creates it.
    data_centre = session.cluster.metadata.all_hosts()[0].datacenter
    [create_keyspace] = [line for line in reference_schema(renamed, {data_centre: 1}).splitlines()
                         if line.startswith("CREATE KEYSPACE")]
    session.execute(create_keyspace, timeout=60)
    try:
        for statements in policy_schema(renamed).values():
            for statement in statements:
                session.execute(statement, timeout=60)
        result = setup(renamed, tmp_path)
        assert result.exit_code == 0, result.output
        assert f"keyspace {keyspace}, tables messages, payload_refs, blobs with the columns" in result.stdout
    finally:
        session.execute(f"DROP KEYSPACE {keyspace}", timeout=60)
        session.cluster.shutdown()


def test_a_column_that_does_not_exist_is_one_line(config, tmp_path):
    with policy_keyspace(MailboxPolicy, "test_setup", config.cassandra) as (session, keyspace):
        session.execute(f"ALTER TABLE {keyspace}.messages DROP deleted")
        lines = problems(variant(config, cassandra={"keyspace": keyspace}), tmp_path)
    assert lines == [
        f"Cassandra {cassandra_address(config)}: column {keyspace}.messages.deleted does not exist (policy mailbox "
        f"reads it); add it as in the policy's reference schema (ALTER TABLE {keyspace}.messages ADD deleted ...; "
        "`purger schema` shows the reference CQL)"]


def test_setup_says_what_the_keyspaces_replication_asks_of_the_platforms_writes(config, tmp_path):
    """The local stack's replication (one replica in its one data centre), then three replicas there (a factor
    above the nodes is only warned of, and setup reads the schema only), then SimpleStrategy."""
    writer_contract = "(docs/policies.md, the writer contract across data centres)"
    with policy_keyspace(MailboxPolicy, "test_replication", config.cassandra) as (session, keyspace):
        dc = session.execute("SELECT data_center FROM system.local").one().data_center
        own = variant(config, cassandra={"keyspace": keyspace})

        def replicate(replication: str) -> None:
            session.execute(f"ALTER KEYSPACE {keyspace} WITH replication = {replication}", timeout=60)

        one = setup(own, tmp_path)
        assert one.exit_code == 0, one.output
        assert one.stdout.splitlines()[-1] == (
            f"keyspace {keyspace}: NetworkTopologyStrategy {dc}=1; a platform write at LOCAL_QUORUM (1 of 1, in {dc}) "
            "is seen by the purger's SERIAL checks (any 1 of 1): revivals, payload links and users added again must "
            f"be lightweight transactions at SERIAL or LOCAL_SERIAL {writer_contract}")

        replicate(f"{{'class': 'NetworkTopologyStrategy', '{dc}': 3}}")
        three = setup(own, tmp_path)
        assert three.exit_code == 0, three.output
        assert three.stdout.splitlines()[-1].startswith(
            f"keyspace {keyspace}: NetworkTopologyStrategy {dc}=3; a platform write at LOCAL_QUORUM (2 of 3, in {dc}) "
            "is seen by the purger's SERIAL checks (any 2 of 3)")

        replicate("{'class': 'SimpleStrategy', 'replication_factor': 2}")
        simple = setup(own, tmp_path)
        assert simple.exit_code == 0, simple.output
        assert simple.stdout.splitlines()[-1].startswith(
            f"keyspace {keyspace}: SimpleStrategy replication_factor=2; a platform write at LOCAL_QUORUM (2 of 2, in "
            f"{dc}) is seen by the purger's SERIAL checks (any 2 of 2)")


def test_a_keyspace_that_does_not_exist_is_one_line_not_one_per_table(config, tmp_path):
    lines = problems(variant(config, cassandra={"keyspace": "no_such_keyspace"}), tmp_path)
    assert lines == [
        f"Cassandra {cassandra_address(config)}: keyspace no_such_keyspace does not exist; it is the platform's: "
        "create it there, or correct cassandra.keyspace"]


def test_a_bucket_that_does_not_exist_is_one_line(config, tmp_path):
    bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    stores = {**config.stores, "dc1": config.stores["dc1"].model_copy(update={"bucket": bucket})}
    lines = problems(config.model_copy(update={"stores": stores}), tmp_path)
    assert lines == [
        f"S3 {config.stores['dc1'].endpoint}: bucket {bucket} (stores.dc1.bucket) does not exist; create it, "
        "or correct stores.dc1.bucket"]


def test_a_kafka_address_that_refuses_is_one_line_naming_it(config, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    lines = problems(variant(config, kafka={"bootstrap_servers": address}), tmp_path)
    assert lines == [
        f"Kafka at {address} does not answer within 5 s: check kafka.bootstrap_servers and that the brokers run"]
    assert time.monotonic() - started < 30


def test_every_problem_is_listed_not_only_the_first(config, tmp_path):
    stores = {dc: store.model_copy(update={"endpoint": f"http://127.0.0.1:{free_port()}"})
              for dc, store in config.stores.items()}
    broken = variant(config.model_copy(update={"stores": stores}), kafka={"topics": ["test.no-such-events"]},
                     cassandra={"port": free_port()})
    lines = problems(broken, tmp_path)
    assert [line.split(" ")[0] for line in lines] == ["Kafka", "Cassandra", "S3", "S3"]
    assert all("does not answer" in line for line in lines[1:])


def test_purger_run_with_a_missing_topic_exits_2_in_one_line_before_spark_starts(config, tmp_path):
    missing = f"test.{uuid.uuid4().hex[:8]}.no-such-events"
    config_file = write_config(variant(config, kafka={"topics": [missing]}), tmp_path / "purger.toml")
    env = {k: v for k, v in os.environ.items() if k not in NO_OVERRIDES}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "purger.job", "--config", str(config_file)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [
        f"Kafka {config.kafka.bootstrap_servers}: events topic {missing} (kafka.topics) does not exist; it is the "
        "platform's: create it there, or correct kafka.topics"]
    assert run.stdout == ""
    assert time.monotonic() - started < 30


def test_purger_run_creates_nothing_and_names_the_own_topic_setup_would_create(config, tmp_path):
    control = f"test.{uuid.uuid4().hex[:8]}.no-such-control"
    config_file = write_config(variant(config, kafka={"control_topic": control}), tmp_path / "purger.toml")
    result = CliRunner().invoke(app, ["run", "--config", str(config_file)], env=NO_OVERRIDES)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"Kafka {config.kafka.bootstrap_servers}: topic {control} (kafka.control_topic, the purger's own) does not "
        "exist; create it with `purger setup` and this configuration"]
    admin = KafkaAdminClient(bootstrap_servers=config.kafka.bootstrap_servers)
    try:
        assert control not in admin.list_topics()
    finally:
        admin.close()

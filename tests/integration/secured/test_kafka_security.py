"""Kafka security for every Kafka client of the purger: the option translation (pure), then, on a real
broker that takes SASL_SSL only (tests.support.secure_kafka), `purger setup`, the purger's producers and
the Spark Kafka source with PLAIN and SCRAM-SHA-512, and one line for a refused login or an untrusted
certificate."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from pydantic import SecretStr

from purger.connectors import kafka_client, kafka_client_options, kafka_producer, spark_kafka_options
from purger.core.settings import ConfigError, KafkaConfig, KafkaSecurity, PurgerConfig
from purger.config import build_config
from devstack.certificates import make_certificates
from devstack.stack import create_topics
from purger.setup import check, set_up
from purger.sinks.dead_letters import DeadLetters
from purger.streams.control import ControlWriter
from purger.streams.source import read_records
from tests.support.secure_kafka import SecureKafka

SCRAM = KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", username="purger",
                      password=SecretStr('pa"ss\\word'), ca_file="/etc/purger/ca.pem")


# --- the options, pure ---------------------------------------------------------------------------


def test_plaintext_gives_the_clients_only_the_address():
    kafka = KafkaConfig(bootstrap_servers="k1:9092,k2:9092")
    assert kafka_client_options(kafka, KafkaConsumer) == {"bootstrap_servers": "k1:9092,k2:9092",
                                                          "security_protocol": "PLAINTEXT"}
    assert spark_kafka_options(kafka) == {"kafka.bootstrap.servers": "k1:9092,k2:9092",
                                          "kafka.security.protocol": "PLAINTEXT"}


def test_sasl_ssl_gives_kafka_python_the_login_and_the_authority():
    assert kafka_client_options(KafkaConfig(security=SCRAM), KafkaAdminClient) == {
        "bootstrap_servers": "127.0.0.1:9092", "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "purger", "sasl_plain_password": 'pa"ss\\word', "ssl_cafile": "/etc/purger/ca.pem",
        "ssl_check_hostname": True}


def test_sasl_ssl_gives_spark_a_jaas_login_and_a_pem_truststore():
    options = spark_kafka_options(KafkaConfig(security=SCRAM))
    assert options == {
        "kafka.bootstrap.servers": "127.0.0.1:9092", "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        # Quotes and backslashes escaped, as JAAS reads them.
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                  'username="purger" password="pa\\"ss\\\\word";',
        "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": "/etc/purger/ca.pem"}


def test_plain_uses_the_plain_login_module_and_no_hostname_check_is_an_empty_algorithm():
    security = SCRAM.model_copy(update={"sasl_mechanism": "PLAIN", "check_hostname": False, "ca_file": None})
    options = spark_kafka_options(KafkaConfig(security=security))
    assert options["kafka.sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"purger\" ")
    assert options["kafka.ssl.endpoint.identification.algorithm"] == ""
    assert "kafka.ssl.truststore.location" not in options  # the system's authorities
    assert kafka_client_options(KafkaConfig(security=security), KafkaProducer)["ssl_check_hostname"] is False


def test_properties_go_to_spark_all_and_to_each_python_client_where_it_has_them_typed_as_its_default():
    kafka = KafkaConfig(properties={"enable.metrics.push": "false", "linger.ms": "20",
                                    "enable.auto.commit": "false", "client.id": "purger-1"})
    assert spark_kafka_options(kafka) == {
        "kafka.enable.metrics.push": "false", "kafka.linger.ms": "20", "kafka.enable.auto.commit": "false",
        "kafka.client.id": "purger-1", "kafka.bootstrap.servers": "127.0.0.1:9092",
        "kafka.security.protocol": "PLAINTEXT"}
    producer = kafka_client_options(kafka, KafkaProducer)
    consumer = kafka_client_options(kafka, KafkaConsumer)
    assert producer["linger_ms"] == 20 and "enable_auto_commit" not in producer
    assert consumer["enable_auto_commit"] is False and "linger_ms" not in consumer
    assert producer["client_id"] == consumer["client_id"] == "purger-1"
    assert "enable_metrics_push" not in producer  # a Java client property kafka-python does not have


def test_a_property_kafka_python_cannot_read_names_the_key():
    with pytest.raises(ConfigError, match=r"kafka.properties.linger.ms: 'soon' is not a int"):
        kafka_client_options(KafkaConfig(properties={"linger.ms": "soon"}), KafkaProducer)
    with pytest.raises(ConfigError, match=r"kafka.properties.enable.auto.commit: 'yes' is not a bool"):
        kafka_client_options(KafkaConfig(properties={"enable.auto.commit": "yes"}), KafkaConsumer)


def test_properties_may_not_override_the_security_section():
    with pytest.raises(ConfigError, match=r"properties may not set sasl.jaas.config, security.protocol: the purger "
                                          r"derives it from kafka.bootstrap_servers and \[kafka.security\]"):
        build_config({"kafka": {"properties": {"security.protocol": "SSL", "sasl.jaas.config": "x"}}})


# --- on a SASL_SSL broker ------------------------------------------------------------------------

def on_broker(config: PurgerConfig, broker: SecureKafka, mechanism: str, **security) -> PurgerConfig:
    """``config`` with a Kafka section of its own topics on ``broker`` over SASL_SSL; ``security`` changes
    keys of ``kafka.security``."""
    run = uuid.uuid4().hex[:8]
    kafka = broker.kafka_config(mechanism, topics=[f"secure.{run}.events"], control_topic=f"secure.{run}.control",
                                dead_letter_topic=f"secure.{run}.dead-letter", reconcile_topic=f"secure.{run}.reconcile")
    kafka = kafka.model_copy(update={"security": kafka.security.model_copy(update=security)})
    return config.model_copy(update={"kafka": kafka})


def kafka_lines(lines: list[str]) -> list[str]:
    """The lines about Kafka (Cassandra and S3 are the local stack's, checked elsewhere)."""
    return [line for line in lines if line.startswith("Kafka")]


@pytest.mark.integration
def test_setup_over_scram_creates_the_purgers_topics_and_checks_the_events_topic(config, secure_kafka_broker):
    secure = on_broker(config, secure_kafka_broker, "SCRAM-SHA-512")
    kafka, where = secure.kafka, f"Kafka {secure_kafka_broker.bootstrap_servers}"
    admin = kafka_client(KafkaAdminClient, kafka)
    try:
        admin.create_topics([NewTopic(kafka.topics[0], 1, 1)])
        found = set_up(secure, create=True)
        assert kafka_lines(found.problems) == []
        assert found.created[:3] == [
            f"topic {kafka.control_topic} (kafka.control_topic: 1 partition, kept 30 days) on {where}",
            f"topic {kafka.dead_letter_topic} (kafka.dead_letter_topic: 1 partition, kept 30 days) on {where}",
            f"topic {kafka.reconcile_topic} (kafka.reconcile_topic: 1 partition, kept 7 days) on {where}"]
        assert kafka_lines(found.checked) == [f"{where}: events topic {kafka.topics[0]}"]
        assert {kafka.control_topic, kafka.dead_letter_topic, kafka.reconcile_topic} <= set(admin.list_topics())

        again = check(secure)
        assert kafka_lines(again.problems) == []
        assert kafka_lines(again.checked) == [
            f"{where}: events topic {kafka.topics[0]}, topic {kafka.control_topic}, topic {kafka.dead_letter_topic}, "
            f"topic {kafka.reconcile_topic}"]
    finally:
        admin.delete_topics([kafka.topics[0], kafka.control_topic, kafka.dead_letter_topic, kafka.reconcile_topic])
        admin.close()


@pytest.mark.integration
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_the_purgers_producers_write_and_the_spark_source_reads_over_sasl_ssl(config, secure_kafka_broker, spark,
                                                                              tmp_path: Path, mechanism):
    secure = on_broker(config, secure_kafka_broker, mechanism)
    kafka = secure.kafka
    create_topics(secure, partitions=1)  # the local stack's way, here over SASL_SSL
    events = [{"event_id": f"e{i}", "type": "message_created", "message_id": f"m{i}"} for i in range(3)]
    producer = kafka_producer(kafka, acks="all", linger_ms=20)  # as the sink's executors make it
    try:
        for event in events:
            producer.send(kafka.topics[0], key=event["message_id"].encode(), value=json.dumps(event).encode())
        ControlWriter(producer, kafka.control_topic, secure.policy_set).recheck("message", "m1", "expired", 0)
        DeadLetters(producer, kafka.dead_letter_topic).send(b"k", b"not json", "not an event", kafka.topics[0], 0, 7)
        producer.flush()
    finally:
        producer.close()

    # The purger's own streaming source, to its end.
    query = (read_records(spark, secure, starting_offsets="earliest").writeStream.format("memory")
             .queryName(f"secure_{mechanism.replace('-', '_').lower()}_{uuid.uuid4().hex[:6]}")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(180), "the Kafka source did not read to the end within 180 s"
        assert query.exception() is None
        read = spark.table(query.name).collect()
    finally:
        query.stop()
    assert sorted((json.loads(row.value) for row in read), key=lambda event: event["event_id"]) == events

    # The control and dead-letter topics, through a batch read with the same options.
    written = (spark.read.format("kafka").options(**spark_kafka_options(kafka))
               .option("subscribe", f"{kafka.control_topic},{kafka.dead_letter_topic}")
               .option("includeHeaders", "true").load().collect())
    by_topic = {row.topic: row for row in written}
    assert json.loads(by_topic[kafka.control_topic].value)["message_id"] == "m1"
    dead = by_topic[kafka.dead_letter_topic]
    assert bytes(dead.value) == b"not json"
    assert dict((h.key, bytes(h.value)) for h in dead.headers)["reason"] == b"not an event"


@pytest.mark.integration
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_a_wrong_password_is_one_line_naming_the_address_and_the_keys(config, secure_kafka_broker, mechanism):
    secure = on_broker(config, secure_kafka_broker, mechanism, password=SecretStr("not-the-password"))
    found = check(secure)
    assert kafka_lines(found.problems) == [
        f"Kafka at {secure_kafka_broker.bootstrap_servers} refused the login of user 'purger' ({mechanism}): "
        "check kafka.security.username and password"]
    assert "not-the-password" not in "\n".join(found.problems + found.checked)


@pytest.mark.integration
def test_an_untrusted_certificate_is_one_line_naming_the_address_and_the_key(config, secure_kafka_broker,
                                                                             tmp_path: Path):
    make_certificates(tmp_path, "127.0.0.1", "another-authority")  # not the one that signed the broker's
    other = tmp_path / "ca.pem"
    secure = on_broker(config, secure_kafka_broker, "SCRAM-SHA-512", ca_file=str(other))
    assert kafka_lines(check(secure).problems) == [
        f"Kafka at {secure_kafka_broker.bootstrap_servers} presented a certificate that kafka.security.ca_file "
        f"({other}) does not vouch for (self-signed certificate in certificate chain): set kafka.security.ca_file "
        "to the authority that signed the brokers' certificates"]

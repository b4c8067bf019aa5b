"""A second local Kafka broker that takes SASL_SSL only, with a certificate authority made for it.

The broker is single-node KRaft like the local stack's, on ports of its own, with the stack's jars and
process handling (``devstack.stack``: launched, waited for until a SASL_SSL login lists its topics,
stopped by pid). Its listener takes PLAIN (users in the listener's JAAS configuration) and SCRAM-SHA-512
(a user written into the storage when it is formatted); its certificate is signed by an authority
made for it (``devstack.certificates``), for 127.0.0.1. Logins and passwords are random per broker.

Example::

    with secure_kafka(tmp_path) as broker:
        kafka = broker.kafka_config("SCRAM-SHA-512")   # a KafkaConfig on it, over SASL_SSL
        broker.bootstrap_servers, broker.ca_file, broker.logins["PLAIN"]
"""

from __future__ import annotations

import secrets
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from purger.core.settings import KafkaConfig, KafkaSecurity
from devstack import artifacts
from devstack.certificates import make_certificates
from devstack.stack import LocalStack, Server, configure_kafka
from tests.support.configs import free_port

MECHANISMS = ("PLAIN", "SCRAM-SHA-512")
USERNAME = "purger"


@dataclass(frozen=True)
class Login:
    username: str
    password: str


@dataclass(frozen=True)
class SecureKafka:
    """A running SASL_SSL broker: where it is, the authority to trust, and a login per SASL mechanism."""

    bootstrap_servers: str
    ca_file: Path
    logins: dict[str, Login]

    def kafka_config(self, mechanism: str = "SCRAM-SHA-512", **config: object) -> KafkaConfig:
        """A Kafka section that reaches the broker over SASL_SSL with ``mechanism``'s login; ``config``
        sets other keys of the section (topics, ...)."""
        login = self.logins[mechanism]
        security = KafkaSecurity(protocol="SASL_SSL", sasl_mechanism=mechanism, username=login.username,
                                 password=login.password, ca_file=str(self.ca_file))
        return KafkaConfig(bootstrap_servers=self.bootstrap_servers, security=security, **config)


@contextmanager
def secure_kafka(directory: Path) -> Iterator[SecureKafka]:
    """Generate an authority and the broker's certificate in ``directory``, start the broker on free ports,
    yield it, and stop it and remove its data at the end."""
    keystore_password = secrets.token_hex(12)
    make_certificates(directory, "127.0.0.1", keystore_password)
    authority = directory / "ca.pem"
    port, controller_port = free_port(), free_port()
    logins = {mechanism: Login(USERNAME, secrets.token_hex(12)) for mechanism in MECHANISMS}
    inter_broker = Login("broker", secrets.token_hex(12))
    broker = SecureKafka(f"127.0.0.1:{port}", authority, logins)

    def configure(home: Path) -> list[str]:
        return _configure(home, port, controller_port, directory / "node.p12", keystore_password, authority, logins,
                          inter_broker)

    def ready() -> None:
        from kafka.admin import KafkaAdminClient

        from purger.connectors import kafka_client

        kafka_client(KafkaAdminClient, broker.kafka_config(), request_timeout_ms=5000).close()

    server = Server(f"kafka-sasl-ssl-{port}", broker.bootstrap_servers, artifacts.KAFKA, "kafka.Kafka", "256m",
                    configure, ready, 90)
    stack = LocalStack([server], log=lambda line: None)
    stack.start(server.name)
    try:
        yield broker
    finally:
        stack.stop(server.name)
        shutil.rmtree(server.home, ignore_errors=True)


def _configure(home: Path, port: int, controller_port: int, keystore: Path, keystore_password: str,
               authority: Path, logins: dict[str, Login], inter_broker: Login) -> list[str]:
    """Write the broker's properties and log configuration, format its storage with the SCRAM user."""
    plain_users = {inter_broker.username: inter_broker.password, logins["PLAIN"].username: logins["PLAIN"].password}
    plain_jaas = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
                  f'username="{inter_broker.username}" password="{inter_broker.password}" '
                  + " ".join(f'user_{name}="{password}"' for name, password in plain_users.items()) + ";")
    scram = logins["SCRAM-SHA-512"]
    return configure_kafka(home, port, controller_port, "SASL_SSL", security=[
        "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol=PLAIN",
        f"listener.name.sasl_ssl.plain.sasl.jaas.config={plain_jaas}",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "ssl.keystore.type=PKCS12",
        f"ssl.keystore.location={keystore}",
        f"ssl.keystore.password={keystore_password}",
        f"ssl.key.password={keystore_password}",
        # The broker checks at startup that a client of its own listener (inter-broker) trusts it.
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={authority}",
    ], format_options=["--add-scram", f"SCRAM-SHA-512=[name={scram.username},password={scram.password}]"],
        hidden=[scram.password, keystore_password])

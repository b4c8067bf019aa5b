"""A second local Kafka broker that takes SASL_SSL only, with a certificate authority made for it.

The broker is single-node KRaft like the local stack's, on ports of its own, with the stack's jars and
process handling (``devstack.stack``: launched, waited for until a SASL_SSL login lists its topics,
stopped by pid). Its listener takes PLAIN (users in the listener's JAAS configuration) and SCRAM-SHA-512
(a user written into the storage when it is formatted); its certificate is signed by an authority
generated here, for 127.0.0.1. Logins and passwords are random per broker.

Example::

    with secure_kafka(tmp_path) as broker:
        kafka = broker.kafka_config("SCRAM-SHA-512")   # a KafkaConfig on it, over SASL_SSL
        broker.bootstrap_servers, broker.ca_file, broker.logins["PLAIN"]
"""

from __future__ import annotations

import base64
import secrets
import shutil
import subprocess
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from core.config import KafkaConfig, KafkaSecurity
from devstack import artifacts
from devstack.stack import LocalStack, Server, StackError, _java
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


def certificate_authority(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed authority's certificate and key (PEM) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    certificate, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", str(key), "-out", str(certificate))
    return certificate, key


def broker_certificate(directory: Path, authority: tuple[Path, Path]) -> Path:
    """A key and a certificate for 127.0.0.1 signed by ``authority``, with the authority's certificate
    after them: one PEM file, a Kafka PEM keystore."""
    key, request, certificate = directory / "broker.key", directory / "broker.csr", directory / "broker.crt"
    extensions = directory / "broker.ext"
    # What a strict verifier asks of a server certificate: its names, its key's use, and its issuer's key id.
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                          "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
                          "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(key),
             "-out", str(request))
    _openssl("x509", "-req", "-in", str(request), "-CA", str(authority[0]), "-CAkey", str(authority[1]),
             "-CAcreateserial", "-days", "2", "-extfile", str(extensions), "-out", str(certificate))
    keystore = directory / "broker-keystore.pem"
    keystore.write_text(key.read_text() + certificate.read_text() + authority[0].read_text())
    return keystore


def _openssl(*arguments: str) -> None:
    result = subprocess.run(["openssl", *arguments], capture_output=True, text=True)
    if result.returncode != 0:
        raise StackError(f"openssl {arguments[0]} failed (exit {result.returncode}): {result.stderr}")


@contextmanager
def secure_kafka(directory: Path) -> Iterator[SecureKafka]:
    """Generate an authority and the broker's certificate in ``directory``, start the broker on free ports,
    yield it, and stop it and remove its data at the end."""
    authority = certificate_authority(directory, "purger-test-ca")
    keystore = broker_certificate(directory, authority)
    port, controller_port = free_port(), free_port()
    logins = {mechanism: Login(USERNAME, secrets.token_hex(12)) for mechanism in MECHANISMS}
    inter_broker = Login("broker", secrets.token_hex(12))
    broker = SecureKafka(f"127.0.0.1:{port}", authority[0], logins)

    def configure(home: Path) -> list[str]:
        return _configure(home, port, controller_port, keystore, authority[0], logins, inter_broker)

    def ready() -> None:
        from kafka.admin import KafkaAdminClient

        from connectors import kafka_client

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


def _configure(home: Path, port: int, controller_port: int, keystore: Path, authority: Path,
               logins: dict[str, Login], inter_broker: Login) -> list[str]:
    """Write the broker's properties and log configuration, format its storage with the SCRAM user."""
    plain_users = {inter_broker.username: inter_broker.password, logins["PLAIN"].username: logins["PLAIN"].password}
    plain_jaas = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
                  f'username="{inter_broker.username}" password="{inter_broker.password}" '
                  + " ".join(f'user_{name}="{password}"' for name, password in plain_users.items()) + ";")
    properties = home / "server.properties"
    properties.write_text("\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=SASL_SSL://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=SASL_SSL",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
        "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol=PLAIN",
        f"listener.name.sasl_ssl.plain.sasl.jaas.config={plain_jaas}",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={keystore}",
        # The broker checks at startup that a client of its own listener (inter-broker) trusts it.
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={authority}",
        f"log.dirs={home / 'data'}",
        "num.partitions=1",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
    ]) + "\n")
    # The properties hold passwords: readable by this user only.
    properties.chmod(0o600)
    log4j = home / "log4j.properties"
    log4j.write_text("log4j.rootLogger=INFO, stdout\n"
                     "log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
                     "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
                     "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
                     "log4j.logger.kafka=INFO\nlog4j.logger.org.apache.kafka=WARN\n")
    # A cluster id must not start with "-", which the tool would read as an option.
    cluster_id = "-"
    while cluster_id.startswith("-"):
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    scram = logins["SCRAM-SHA-512"]
    result = subprocess.run(
        [_java(), "-Xmx256m", f"-Dlog4j.configuration=file:{log4j}", "-cp", str(artifacts.KAFKA.directory / "*"),
         "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(properties),
         "--add-scram", f"SCRAM-SHA-512=[name={scram.username},password={scram.password}]"],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        output = (result.stdout + result.stderr).replace(scram.password, "**********")
        raise StackError(f"formatting the SASL_SSL broker's storage in {home} failed (exit {result.returncode}):\n"
                         f"{output}")
    return [f"-Dlog4j.configuration=file:{log4j}", "--", str(properties)]

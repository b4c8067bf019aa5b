"""Kafka clients built from the configuration (``kafka.bootstrap_servers``, ``kafka.security``,
``kafka.properties``): kafka-python's, with errors that say what to check, and a producer whose flush says
which records Kafka did not take (``CheckedProducer``); and the Spark Kafka source's options.

Example::

    from kafka import KafkaConsumer
    from purger.config import load_config
    from purger.connectors import kafka_client_options, kafka_producer, spark_kafka_options
    config = load_config()
    consumer = KafkaConsumer(**kafka_client_options(config.kafka, KafkaConsumer))
    producer = kafka_producer(config.kafka)           # its flush raises NotDelivered for a record Kafka did not take
    reader = spark.read.format("kafka").options(**spark_kafka_options(config.kafka))
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from purger.connectors.errors import ServerUnavailable
from purger.core.settings import ConfigError, KafkaConfig

if TYPE_CHECKING:
    from kafka import KafkaProducer


class KafkaRefused(ServerUnavailable):
    """Kafka brokers answered but refused this client: its login or their certificate. The message names the
    address and the keys to check."""


_Client = TypeVar("_Client")


def kafka_client_options(config: KafkaConfig, client: type) -> dict[str, Any]:
    """Keyword options for a kafka-python client of class ``client`` (``KafkaProducer``, ``KafkaConsumer``,
    ``KafkaAdminClient``): the bootstrap servers, ``kafka.security``, and each of ``kafka.properties``
    that kafka-python knows for that class (its name with dots as underscores), as the type of its default.
    The options hold the password: never log them."""
    known = client.DEFAULT_CONFIG
    options: dict[str, Any] = {}
    for name, value in config.properties.items():
        key = name.replace(".", "_")
        if key in known:
            options[key] = _as_type_of(known[key], value, name)
    security = config.security
    options.update(bootstrap_servers=config.bootstrap_servers, security_protocol=security.protocol)
    if security.protocol.startswith("SASL_"):
        # kafka-python takes the SCRAM login under the same names as the PLAIN one.
        options.update(sasl_mechanism=security.sasl_mechanism, sasl_plain_username=security.username,
                       sasl_plain_password=security.password.get_secret_value())
    if security.protocol.endswith("SSL"):
        options.update(ssl_cafile=security.ca_file, ssl_check_hostname=security.check_hostname)
    return options


def spark_kafka_options(config: KafkaConfig) -> dict[str, str]:
    """The Spark Kafka source's ``kafka.*`` options: the bootstrap servers, ``kafka.security`` and every
    one of ``kafka.properties``. The JAAS option holds the password: never log the options."""
    security = config.security
    options = {f"kafka.{name}": value for name, value in config.properties.items()}
    options.update({"kafka.bootstrap.servers": config.bootstrap_servers, "kafka.security.protocol": security.protocol})
    if security.protocol.startswith("SASL_"):
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if security.sasl_mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        options.update({
            "kafka.sasl.mechanism": security.sasl_mechanism,
            "kafka.sasl.jaas.config": f"{module} required username={_jaas_quoted(security.username)} "
                                      f"password={_jaas_quoted(security.password.get_secret_value())};",
        })
    if security.protocol.endswith("SSL"):
        if security.ca_file:
            options.update({"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": security.ca_file})
        if not security.check_hostname:
            # Kafka's way to turn the check of the broker's name against its certificate off.
            options["kafka.ssl.endpoint.identification.algorithm"] = ""
    return options


def kafka_client(client: type[_Client], config: KafkaConfig, **options: Any) -> _Client:
    """A kafka-python client of class ``client`` on ``config`` (``options`` added to or over
    ``kafka_client_options``). Brokers that refuse the login or whose certificate is not trusted raise
    ``KafkaRefused``, which says what to check; other failures raise kafka-python's own errors."""
    from kafka.errors import KafkaError

    # kafka-python retries a refused login until its bootstrap timeout, then raises a timeout: the
    # refusal itself is only in its log.
    refusals = _RefusalsSeen()
    logger = logging.getLogger("kafka")
    logger.addHandler(refusals)
    try:
        return client(**{**kafka_client_options(config, client), **options})
    except KafkaError:
        if refused := _untrusted_certificate(config) or refusals.explained(config):
            raise KafkaRefused(refused) from None
        raise
    finally:
        logger.removeHandler(refusals)


def kafka_producer(config: KafkaConfig, **options: Any) -> "CheckedProducer":
    """A producer on ``config`` (``options`` as for ``kafka_client``) whose flush raises ``NotDelivered`` for
    a record sent before it that Kafka did not take."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    def make() -> KafkaProducer:
        try:
            return kafka_client(KafkaProducer, config, **options)
        except KafkaTimeoutError:
            raise ServerUnavailable(f"Kafka at {config.bootstrap_servers} does not answer") from None

    return CheckedProducer(make, config.bootstrap_servers)


class NotDelivered(RuntimeError):
    """Records sent to Kafka were not delivered; the message names the topics, the address and what follows."""


# What follows a failed delivery in a Spark task (the feed's, the purge's): Spark runs the task again.
TASK_RUNS_AGAIN = "the task fails and runs again"


class CheckedProducer:
    """A kafka-python producer that keeps what it sent until Kafka took it: ``flush`` waits for every record
    sent before it and raises ``NotDelivered``, one line, if any was not delivered (kafka-python's own flush
    returns all the same). Safe to share between threads, as the purge's pool shares the control writer.

    A process's producer serves one Spark task at a time (a Python worker runs one at a time), so a flush
    checks every record still unchecked: those of its own task, and any left by an earlier task that
    failed before its flush, which then fails this task once more.

    After a failed flush the next send makes a new kafka-python producer: an idempotent one (its default)
    sends nothing more once Kafka refused a record for good (too large, not allowed), aborting every later
    batch as a "fatal error", and the task that runs again must not inherit that.

    Example::

        producer = kafka_producer(config.kafka, acks="all", linger_ms=20)
        producer.send("purger.control", key=b"m1", value=b"{...}")
        producer.flush(TASK_RUNS_AGAIN)   # NotDelivered: sending to Kafka at ... failed for 1 record of topic ...
    """

    def __init__(self, make: Callable[[], "KafkaProducer"], address: str) -> None:
        self._make = make
        self._address = address
        self._lock = threading.Lock()
        self._producer: KafkaProducer | None = make()  # None once a flush failed, until the next send
        # Records not yet known delivered, by their future, with their topic; a delivered one leaves at once.
        self._unchecked: dict[Any, str] = {}
        # Records refused at the send itself: no metadata for the topic in time, too large, no new producer.
        self._refused: list[tuple[str, Exception]] = []

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
             headers: list[tuple[str, bytes]] | None = None, partition: int | None = None) -> None:
        from kafka.errors import KafkaError

        try:
            with self._lock:
                if self._producer is None:
                    self._producer = self._make()
                producer = self._producer
            future = producer.send(topic, value=value, key=key, headers=headers, partition=partition)
        except (KafkaError, ServerUnavailable) as error:  # told at the flush, as a record Kafka did not take
            with self._lock:
                self._refused.append((topic, error))
            return
        with self._lock:
            self._unchecked[future] = topic
        future.add_callback(self._delivered, future)

    def _delivered(self, future: Any, _metadata: Any) -> None:
        with self._lock:
            self._unchecked.pop(future, None)

    def flush(self, consequence: str | None = None) -> None:
        """Wait until every record sent before this call is delivered or has failed; ``NotDelivered``, ending
        with ``consequence`` (what follows for the sender, e.g. ``TASK_RUNS_AGAIN``), if any failed."""
        from kafka.errors import KafkaError

        with self._lock:
            producer = self._producer
            sent, self._unchecked = self._unchecked, {}
            failed, self._refused = self._refused, []
        if producer is not None:
            try:
                producer.flush()  # what lingers goes now
            except KafkaError:  # kafka-python's flush gives up on a batch it is splitting: the records tell
                pass
        for future, topic in sent.items():
            try:
                future.get()
            except KafkaError as error:
                failed.append((topic, error))
        if failed:
            self._renew(producer)
            raise NotDelivered(self._explained(failed, consequence))

    def close(self) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.close()

    def _renew(self, failed: "KafkaProducer | None") -> None:
        """The next send's producer a new one; ``failed`` closed, its records all told."""
        from kafka.errors import KafkaError

        with self._lock:
            if self._producer is not failed:  # renewed already, by a flush of another thread
                return
            self._producer = None
        if failed is not None:
            try:
                failed.close()
            except KafkaError:  # its flush again, on batches it split: they are told already
                pass

    def _explained(self, failed: list[tuple[str, Exception]], consequence: str | None) -> str:
        by_topic: dict[str, list[str]] = {}
        for topic, error in failed:
            by_topic.setdefault(topic, []).append(_one_line(error))
        # Each topic's count and its distinct errors (a broker's refusal is the same for a batch's records).
        counts = " and ".join(f"{len(errors)} record{'s' if len(errors) > 1 else ''} of topic {topic} "
                              f"({'; '.join(dict.fromkeys(errors))})" for topic, errors in by_topic.items())
        return (f"sending to Kafka at {self._address} failed for {counts}: check that the brokers answer and that "
                "the topic exists and takes such records" + (f"; {consequence}" if consequence else ""))


def _one_line(error: Exception) -> str:
    """An error as ``Name: what it says`` on one line; a broker's refusal, which says nothing, by its description."""
    said = " ".join(str(arg) for arg in error.args if arg is not None) or getattr(error, "description", "")
    said = " ".join(said.split())
    return f"{type(error).__name__}: {said}" if said else type(error).__name__


class _RefusalsSeen(logging.Handler):
    """The refusals kafka-python logs while a client connects."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.errors: list[Exception] = []

    def emit(self, record: logging.LogRecord) -> None:
        from kafka.errors import KafkaConnectionError, SaslAuthenticationFailedError, UnsupportedSaslMechanismError

        args = record.args if isinstance(record.args, tuple) else ()
        self.errors.extend(a for a in args if isinstance(a, (SaslAuthenticationFailedError,
                                                             UnsupportedSaslMechanismError, KafkaConnectionError)))

    def explained(self, config: KafkaConfig) -> str | None:
        """The refusal as one line, once the brokers' certificate is known to be trusted."""
        from kafka.errors import KafkaConnectionError, SaslAuthenticationFailedError, UnsupportedSaslMechanismError

        security, address = config.security, config.bootstrap_servers
        if not security.protocol.startswith("SASL_"):
            return None
        if any(isinstance(e, UnsupportedSaslMechanismError) for e in self.errors):
            return (f"Kafka at {address} does not take the SASL mechanism {security.sasl_mechanism}: check "
                    "kafka.security.sasl_mechanism")
        # A broker sends its refusal and closes the connection at once; kafka-python at times reads the close
        # first and logs only "socket disconnected": on a connection made (its certificate trusted), that is
        # the refusal too.
        if any(isinstance(e, SaslAuthenticationFailedError)
               or (isinstance(e, KafkaConnectionError) and "socket disconnected" in str(e)) for e in self.errors):
            return (f"Kafka at {address} refused the login of user {security.username!r} "
                    f"({security.sasl_mechanism}): check kafka.security.username and password")
        return None


def _untrusted_certificate(config: KafkaConfig) -> str | None:
    """Why the first broker's certificate fails this configuration's TLS check, if it does."""
    security = config.security
    if not security.protocol.endswith("SSL"):
        return None
    address = config.bootstrap_servers.split(",")[0].strip()
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=security.ca_file)
    context.check_hostname = security.check_hostname
    try:
        with socket.create_connection((host, int(port)), timeout=5) as plain, \
                context.wrap_socket(plain, server_hostname=host):
            return None
    except ssl.SSLCertVerificationError as error:
        trusted = f"kafka.security.ca_file ({security.ca_file})" if security.ca_file else "the system's authorities"
        return (f"Kafka at {address} presented a certificate that {trusted} does not vouch for "
                f"({error.verify_message}): set kafka.security.ca_file to the authority that signed the brokers' "
                "certificates")
    except (OSError, ValueError):
        return None


def _as_type_of(default: Any, value: str, name: str) -> Any:
    """A property's text as the type kafka-python's default for it has (text when the default is None)."""
    try:
        if isinstance(default, bool):
            if value.lower() not in ("true", "false"):
                raise ValueError
            return value.lower() == "true"
        if isinstance(default, (int, float)):
            return type(default)(value)
    except ValueError:
        raise ConfigError(f"kafka.properties.{name}: {value!r} is not a {type(default).__name__}, as the "
                          "Kafka clients take it") from None
    if default is None or isinstance(default, str):
        return value
    raise ConfigError(f"kafka.properties.{name}: the purger's Python clients take no text for it (kafka-python "
                      f"wants a {type(default).__name__}); leave it out")


def _jaas_quoted(text: str) -> str:
    """A JAAS option value: in double quotes, with quotes and backslashes escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

"""Clients for the three servers, built from the configuration, with errors that name the address.

Example::

    from purger.config import load_config
    from purger.connectors import cassandra_session, s3_client
    config = load_config()
    session = cassandra_session(config.cassandra)
    read = read_serially(session, session.prepare("SELECT * FROM mailbox.messages WHERE message_id = ?"))
    s3 = s3_client(config.stores["dc1"])
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

from purger.core.config import CassandraConfig, CassandraTls, ConfigError, KafkaConfig, S3Endpoint
from purger.core.handles import Consistency, Tables

if TYPE_CHECKING:
    from cassandra.cluster import Session
    from cassandra.query import Statement

    AnyStatement = TypeVar("AnyStatement", bound=Statement)
    from kafka import KafkaProducer


class ServerUnavailable(RuntimeError):
    """A server did not answer; the message names its address."""


class KafkaRefused(ServerUnavailable):
    """Kafka brokers answered but refused this client: its login or their certificate. The message names the
    address and the keys to check."""


_Client = TypeVar("_Client")


def cassandra_session(config: CassandraConfig, keyspace: str | None = None) -> "Session":
    """A session on ``config``'s nodes (login, TLS, local data centre and consistency levels as configured);
    ``ServerUnavailable``, one line naming the address and what to do, when it cannot connect."""
    from cassandra import ConsistencyLevel, InvalidRequest
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
    from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy, TokenAwarePolicy

    auth = None
    if config.username:
        auth = PlainTextAuthProvider(config.username, config.password.get_secret_value() if config.password else "")
    address = ", ".join(f"{h}:{config.port}" for h in config.hosts)
    cluster = Cluster(
        config.hosts,
        port=config.port,
        auth_provider=auth,
        ssl_context=_tls_context(config.tls, address) if config.tls else None,
        execution_profiles={
            EXEC_PROFILE_DEFAULT: ExecutionProfile(
                # Each request to a replica of its partition in the local data centre (a bound prepared
                # statement carries its partition key), sparing a lightweight transaction or a read the
                # coordinator's extra hop; the replicas shuffled, so that a hot partition's requests spread
                # over all of them rather than loading the first.
                load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=config.local_data_centre),
                                                       shuffle_replicas=True),
                consistency_level=ConsistencyLevel.name_to_value[config.consistency],
                serial_consistency_level=ConsistencyLevel.name_to_value[config.serial_consistency],
                request_timeout=30,
            )
        },
        protocol_version=5,
        # After an outage, look for the nodes every few seconds rather than backing off to minutes:
        # the purger's retries (stream.retry_interval) should find them back.
        reconnection_policy=ExponentialReconnectionPolicy(base_delay=1.0, max_delay=10.0),
    )
    try:
        return cluster.connect(keyspace)
    except (NoHostAvailable, OSError) as error:
        cluster.shutdown()
        raise ServerUnavailable(f"Cassandra at {address} {_cassandra_refusal(error, config)}") from None
    except InvalidRequest:  # the keyspace does not exist
        cluster.shutdown()
        raise ServerUnavailable(f"Cassandra at {address}: keyspace {keyspace} does not exist; create it, or "
                                "correct cassandra.keyspace") from None


def read_serially(session: "Session", statement: "AnyStatement") -> "AnyStatement":
    """``statement``, a read, set to run at the session's serial consistency (cassandra.serial_consistency):
    it then sees the outcome of every lightweight transaction, including one not yet settled, in every
    data centre (SERIAL) or in the local one (LOCAL_SERIAL)."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT

    statement.consistency_level = session.get_execution_profile(EXEC_PROFILE_DEFAULT).serial_consistency_level
    return statement


class CassandraTables(Tables):
    """``Tables`` on a session: a policy's handle on its tables (``purger.core.policy.Tables``).

    Example::

        tables = CassandraTables(session, "mailbox", {"users": "users", "virtual_roots": "roots"})
        read = tables.prepare("SELECT state FROM {users} WHERE user_id = ?", "serial")
    """

    def __init__(self, session: "Session", keyspace: str, names: dict[str, str]) -> None:
        self.session = session
        self.qualified = {table: f"{keyspace}.{name}" for table, name in names.items()}

    def prepare(self, cql: str, consistency: Consistency = "configured") -> Any:
        from cassandra import ConsistencyLevel

        try:
            text = cql.format(**self.qualified)
        except KeyError as unknown:
            raise ValueError(f"CQL names table {unknown} that the policy's tables do not have: {cql}") from None
        statement = self.session.prepare(text)
        if consistency == "serial":
            read_serially(self.session, statement)
        elif consistency != "configured":
            statement.consistency_level = ConsistencyLevel.name_to_value[consistency.upper()]
        return statement

    def one(self, statement: Any, *values: Any, serial: bool = False) -> Any | None:
        if serial:
            statement = read_serially(self.session, statement.bind(values))
            return self.session.execute(statement).one()
        return self.session.execute(statement, values).one()

    def all(self, statement: Any, *values: Any) -> list[Any]:
        return list(self.session.execute(statement, values))

    def applied(self, statement: Any, *values: Any) -> bool:
        return self.session.execute(statement, values).was_applied

    def execute(self, statement: Any, *values: Any) -> None:
        self.session.execute(statement, values)


def _tls_context(tls: CassandraTls, address: str) -> ssl.SSLContext:
    """Client encryption from the configured PEM files; a file that cannot be read is one line naming it."""
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
        context.check_hostname = tls.check_hostname
    except (OSError, ssl.SSLError) as error:
        raise ServerUnavailable(f"Cassandra at {address}: cannot read the PEM files of [cassandra.tls] ({error}); "
                                "correct cassandra.tls.ca_file") from None
    return context


def _cassandra_refusal(error: Exception, config: CassandraConfig) -> str:
    """Why the nodes refused or did not answer, and what to do, from the driver's reason per host."""
    reasons = _reasons(error)
    if "AuthenticationFailed" in reasons or "Bad credentials" in reasons or "Provided username" in reasons:
        return (f"refused the login of {config.username!r}: correct cassandra.username and cassandra.password "
                "(or PURGER_CASSANDRA_USERNAME and PURGER_CASSANDRA_PASSWORD)")
    if "requires authentication" in reasons:
        return ("requires a login: set cassandra.username and cassandra.password (or PURGER_CASSANDRA_USERNAME "
                "and PURGER_CASSANDRA_PASSWORD)")
    if "SSL" in reasons or "certificate" in reasons.lower():
        return (f"refused TLS ({reasons}): set cassandra.tls.ca_file to the authority that signed the nodes' "
                "certificates, and check cassandra.tls.check_hostname against the names in them")
    if config.tls is None and ("reset" in reasons or "closed" in reasons.lower()):
        return (f"closed the connection ({reasons}): if its nodes require TLS, set [cassandra.tls] with ca_file")
    return f"does not answer ({reasons}): check cassandra.hosts, cassandra.port and that the nodes run"


def s3_client(config: S3Endpoint, attempts: int = 3, read_timeout_s: float = 30):  # -> botocore S3 client
    """``attempts`` and ``read_timeout_s`` bound how long a store that does not answer holds a call."""
    import boto3
    from botocore.config import Config

    keys = {}
    if config.credentials == "keys":
        keys = {"aws_access_key_id": config.access_key, "aws_secret_access_key": config.secret_key.get_secret_value()}
    client = boto3.client(
        "s3",
        endpoint_url=config.endpoint,
        **keys,  # or else boto3's own chain: AWS_* variables, ~/.aws, an instance or pod role
        region_name=config.region,
        config=Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": attempts, "mode": "standard"},
            connect_timeout=5,
            read_timeout=read_timeout_s,
            # Not every S3-compatible store accepts the newer default checksum headers.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )
    client.meta.events.register("before-sign.s3.DeleteObjects", _content_md5)
    return client


def _content_md5(request: Any, **_: Any) -> None:
    """A multi-object delete checksummed by ``Content-MD5``, which S3 and the S3-compatible stores all accept,
    instead of the CRC32 headers botocore sends since 1.36, which some refuse (S3Proxy: "NotImplemented")."""
    import base64
    import hashlib

    for header in [h for h in request.headers if h.lower().startswith("x-amz-checksum-")
                   or h.lower() == "x-amz-sdk-checksum-algorithm"]:
        del request.headers[header]
    request.headers["Content-MD5"] = base64.b64encode(hashlib.md5(request.body).digest()).decode()


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


def _reasons(error: Exception) -> str:
    """The driver's reason per host, without its ``Tried connecting to ...`` preamble."""
    per_host = getattr(error, "errors", None) or {}
    return "; ".join(f"{host}: {str(e).rsplit('Last error: ', 1)[-1]}" for host, e in per_host.items()) or str(error)

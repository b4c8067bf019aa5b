"""The local stack: real Kafka, Cassandra and S3Proxy as processes on 127.0.0.1, without Docker.

``up`` fetches the jars (cached), starts each server with a small heap, waits
until it really answers (a record produced and consumed, a CQL query, a bucket
listing), then creates the events topic, the keyspace of docs/reference.md, Tables and one
bucket per data centre. Process ids are recorded, so ``down`` stops exactly what
``up`` started.

Example::

    from devstack.stack import LocalStack
    stack = LocalStack()
    stack.up()       # idempotent: servers already running are left alone
    stack.status()   # {'kafka': 'running (pid 1234) on 127.0.0.1:9092', ...}
    stack.down()
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from devstack import artifacts
from purger.config import build_config
from purger.core.settings import CassandraConfig, PurgerConfig, S3Endpoint
from purger.policies import events_topics
from purger.output import human_duration

if TYPE_CHECKING:
    from cassandra.cluster import Session

KAFKA_PORT = 9092
KAFKA_CONTROLLER_PORT = 9093
CASSANDRA_PORT = 9042
S3_PORT = 9000
EVENT_TOPIC_PARTITIONS = 4


class StackError(RuntimeError):
    pass


@dataclass
class Server:
    name: str
    address: str
    bundle: artifacts.Bundle
    main_class: str
    heap: str
    configure: Callable[[Path], list[str]]  # writes config files, returns program args + extra JVM args
    ready: Callable[[], None]  # raises until the server answers
    start_timeout: float

    @property
    def home(self) -> Path:
        return artifacts.purger_home() / "stack" / self.name

    @property
    def pid_file(self) -> Path:
        return self.home / "pid"

    @property
    def log_file(self) -> Path:
        return self.home / "server.log"

    def pid(self) -> int | None:
        """The recorded pid, if that process is still the server we started."""
        try:
            pid = int(self.pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return None
        # A recycled pid belongs to another program: never signal it.
        return pid if self.main_class.encode() in cmdline else None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java:
        raise StackError("java is not on PATH; the stack needs a JDK 17")
    return str(java)


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0


# --- Kafka ---------------------------------------------------------------------------------


def configure_kafka(home: Path, port: int = KAFKA_PORT, controller_port: int = KAFKA_CONTROLLER_PORT,
                    listener: str = "PLAINTEXT", security: Sequence[str] = (), format_options: Sequence[str] = (),
                    hidden: Sequence[str] = ()) -> list[str]:
    """A single-node KRaft broker on 127.0.0.1, as ``Server.configure``: its properties, with one client
    listener of protocol ``listener`` (also the brokers' own) and ``security``, that listener's further
    properties; its log settings; its storage, formatted with ``format_options`` added (a SCRAM user, for
    instance). ``hidden`` texts (passwords) are masked in a failed format's output."""
    data = home / "data"
    properties = home / "server.properties"
    properties.write_text(
        "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
                f"listeners={listener}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
                f"advertised.listeners={listener}://127.0.0.1:{port}",
                "controller.listener.names=CONTROLLER",
                f"inter.broker.listener.name={listener}",
                f"listener.security.protocol.map=CONTROLLER:PLAINTEXT,{listener}:{listener}",
                *security,
                f"log.dirs={data}",
                "num.partitions=1",
                "offsets.topic.replication.factor=1",
                "offsets.topic.num.partitions=1",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "group.initial.rebalance.delay.ms=0",
                "auto.create.topics.enable=false",
            ]
        )
        + "\n"
    )
    properties.chmod(0o600)  # ``security`` may hold passwords
    (home / "log4j.properties").write_text(
        "log4j.rootLogger=INFO, stdout\n"
        "log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
        "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
        "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
        "log4j.logger.kafka=INFO\nlog4j.logger.org.apache.kafka=WARN\n"
    )
    # KRaft needs formatted storage; the cluster id is 16 random bytes in URL-safe base64, and
    # like Kafka's own ids must not start with "-", which the tool would read as an option.
    # A restart on existing data keeps the id the data was formatted with.
    meta = data / "meta.properties"
    known = [line.split("=", 1)[1] for line in (meta.read_text().splitlines() if meta.exists() else [])
             if line.startswith("cluster.id=")]
    cluster_id = known[0] if known else "-"
    while cluster_id.startswith("-"):
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    classpath = str(artifacts.KAFKA.directory / "*")
    result = subprocess.run(
        [_java(), "-Xmx256m", f"-Dlog4j.configuration=file:{home / 'log4j.properties'}", "-cp", classpath,
         "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(properties), "--ignore-formatted",
         *format_options],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        output = result.stdout + result.stderr
        for text in hidden:
            output = output.replace(text, "**********")
        raise StackError(f"formatting Kafka storage in {data} failed (exit {result.returncode}):\n{output}")
    return [f"-Dlog4j.configuration=file:{home / 'log4j.properties'}", "--", str(properties)]


def _kafka_ready() -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    bootstrap = f"127.0.0.1:{KAFKA_PORT}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        admin.create_topics([NewTopic("devstack.stack.probe", 1, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()
    marker = uuid.uuid4().hex.encode()
    producer = KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    producer.send("devstack.stack.probe", marker).get(timeout=10)
    producer.close()
    consumer = KafkaConsumer(
        "devstack.stack.probe", bootstrap_servers=bootstrap, auto_offset_reset="earliest",
        consumer_timeout_ms=10000, enable_auto_commit=False,
    )
    try:
        if not any(record.value == marker for record in consumer):
            raise StackError("a record produced to Kafka was not consumed back")
    finally:
        consumer.close()


def create_topics(config: PurgerConfig, partitions: int = EVENT_TOPIC_PARTITIONS) -> None:
    """Create the events topics (of ``partitions`` each), and the control, reconcile and dead-letter topics as
    ``purger setup`` does, if they do not exist."""
    from kafka.admin import KafkaAdminClient
    from kafka.errors import TopicAlreadyExistsError

    from purger.connectors import kafka_client
    from purger.setup import own_topics

    admin = kafka_client(KafkaAdminClient, config.kafka)
    try:
        existing = set(admin.list_topics())
        options = {topic: {"num_partitions": partitions, "replication_factor": 1} for topic in events_topics(config)}
        options.update({topic.name: topic.options for topic in own_topics(config.kafka, partitions)})
        wanted = {name: shape for name, shape in options.items() if name not in existing}
        if wanted:
            try:
                admin.create_topics(wanted)
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()


# --- Cassandra -----------------------------------------------------------------------------

# From Cassandra's conf/jvm17-server.options: the module openings it needs on Java 17.
_CASSANDRA_JPMS = [
    *(f"--add-exports={m}=ALL-UNNAMED" for m in (
        "java.base/jdk.internal.misc", "java.management.rmi/com.sun.jmx.remote.internal.rmi",
        "java.rmi/sun.rmi.registry", "java.rmi/sun.rmi.server", "java.sql/java.sql",
        "java.base/java.lang.ref", "jdk.unsupported/sun.misc", "jdk.compiler/com.sun.tools.javac.file",
        "jdk.attach/sun.tools.attach",
    )),
    *(f"--add-opens={m}=ALL-UNNAMED" for m in (
        "java.base/java.lang.module", "java.base/jdk.internal.loader", "java.base/jdk.internal.ref",
        "java.base/jdk.internal.reflect", "java.base/jdk.internal.math", "java.base/jdk.internal.module",
        "java.base/jdk.internal.util.jar", "jdk.management/com.sun.management.internal",
        "java.base/sun.nio.ch", "java.base/java.io", "java.base/java.lang.reflect",
        "jdk.compiler/com.sun.tools.javac", "java.base/java.lang", "java.base/java.util",
    )),
]


@dataclass(frozen=True)
class CassandraNode:
    """What sets one Cassandra node apart: its address, data centre, token, JMX port and cluster, and for
    a node that checks its clients, a login and client encryption. The stack's nodes and the tests' secure
    node are all written by ``_configure_cassandra`` from one of these."""

    address: str = "127.0.0.1"
    data_centre: str = "dc1"
    initial_token: int = 0
    jmx_port: int = 7199
    cluster_name: str = "purger-local"
    seed: str = "127.0.0.1"
    # PasswordAuthenticator and CassandraAuthorizer rather than letting every client in.
    password_login: bool = False
    # Client encryption (TLS required): a PKCS12 keystore with the node's certificate, and its password.
    keystore: Path | None = None
    keystore_password: str = ""
    # Cassandra 5.0's default, written out: what the writer contract says of conditional deletes is its (v1's).
    paxos_variant: str = "v1"
    # More JVM options (a fault test's agent).
    jvm_options: tuple[str, ...] = ()


def _configure_cassandra(node: CassandraNode, home: Path) -> list[str]:
    data = home / "data"
    yaml = home / "cassandra.yaml"
    security = (
        "authenticator: PasswordAuthenticator\nauthorizer: CassandraAuthorizer\nrole_manager: CassandraRoleManager\n"
        if node.password_login else "authenticator: AllowAllAuthenticator\nauthorizer: AllowAllAuthorizer\n"
    )
    if node.keystore:
        security += f"""client_encryption_options:
  enabled: true
  optional: false
  keystore: {node.keystore}
  keystore_password: "{node.keystore_password}"
  store_type: PKCS12
  require_client_auth: false
"""
    yaml.write_text(
        f"""cluster_name: {node.cluster_name}
num_tokens: 1
initial_token: {node.initial_token}
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: GossipingPropertyFileSnitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{node.seed}:7000"
listen_address: {node.address}
rpc_address: {node.address}
storage_port: 7000
native_transport_port: {CASSANDRA_PORT}
start_native_transport: true
data_file_directories: [{data}/data]
commitlog_directory: {data}/commitlog
hints_directory: {data}/hints
saved_caches_directory: {data}/saved_caches
cdc_raw_directory: {data}/cdc_raw
commitlog_sync: periodic
commitlog_sync_period: 10000ms
memtable_heap_space: 64MiB
memtable_offheap_space: 64MiB
concurrent_reads: 8
concurrent_writes: 8
concurrent_compactors: 1
auto_snapshot: false
paxos_variant: {node.paxos_variant}
{security}"""
    )
    rackdc = home / "cassandra-rackdc.properties"
    rackdc.write_text(f"dc={node.data_centre}\nrack=rack1\n")
    jamm = next(artifacts.CASSANDRA.directory.glob("jamm-*.jar"))
    return [
        f"-Dcassandra.config=file://{yaml}",
        f"-Dcassandra-rackdc.properties=file://{rackdc}",
        f"-Dcassandra.storagedir={data}",
        f"-Dcassandra.logdir={home}",
        _logback_option(home, "INFO"),
        "-Dcassandra-foreground=yes",
        "-Dcassandra.skip_wait_for_gossip_to_settle=0",
        # A node joining a running cluster waits this long for gossip before it bootstraps (30 s by default).
        "-Dcassandra.ring_delay_ms=5000",
        f"-Dcassandra.initial_token={node.initial_token}",
        f"-Dcassandra.jmx.local.port={node.jmx_port}",
        # The default superuser (cassandra/cassandra) is created 10 s after start unless told otherwise.
        *(["-Dcassandra.superuser_setup_delay_ms=0"] if node.password_login else []),
        "-Djava.net.preferIPv4Stack=true",
        "-Djdk.attach.allowAttachSelf=true",
        "-Dio.netty.tryReflectionSetAccessible=true",
        "-XX:+UseG1GC",
        "-Xss512k",
        f"-javaagent:{jamm}",
        *_CASSANDRA_JPMS,
        *node.jvm_options,
    ]


def _cassandra_answers(client: CassandraConfig) -> None:
    from purger.connectors import cassandra_session

    session = cassandra_session(client)
    try:
        session.execute("SELECT release_version FROM system.local").one()
    finally:
        session.cluster.shutdown()


def cassandra_server(name: str, node: CassandraNode, heap: str, client: CassandraConfig) -> Server:
    """A Cassandra node as a ``Server`` for ``Processes``: ready once ``client`` (its address, and login and TLS
    if it checks them) can query it."""
    return Server(name, f"{node.address}:{CASSANDRA_PORT}", artifacts.CASSANDRA,
                  "org.apache.cassandra.service.CassandraDaemon", heap, partial(_configure_cassandra, node),
                  partial(_cassandra_answers, client), 180)


def nodetool(node: CassandraNode, *command: str) -> None:
    """Run a nodetool command against ``node`` over its JMX port."""
    result = subprocess.run(
        [_java(), "-Xmx128m", *_CASSANDRA_JPMS, "-cp", str(artifacts.CASSANDRA.directory / "*"),
         "org.apache.cassandra.tools.NodeTool", "-h", "127.0.0.1", "-p", str(node.jmx_port), *command],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        raise StackError(f"nodetool {' '.join(command)} on Cassandra {node.address} (JMX port {node.jmx_port}) "
                         f"failed (exit {result.returncode}):\n{result.stdout}{result.stderr}")


def keyspace_replication(session: "Session", data_centres: Sequence[str] = ()) -> str:
    """A keyspace's replication: one replica in each of ``data_centres``, by default only in the data centre
    of the node ``session`` talks to, so that stopping a node of another data centre never makes it
    unavailable."""
    if not data_centres:
        data_centres = [session.execute("SELECT data_center FROM system.local").one().data_center]
    return "{'class': 'NetworkTopologyStrategy', " + ", ".join(f"'{dc}': 1" for dc in data_centres) + "}"


def create_schema(config: PurgerConfig, data_centres: Sequence[str] = ()) -> None:
    """Create the keyspace (replicated as ``keyspace_replication`` says) and the enabled policies' reference
    tables (docs/reference.md, Tables; docs/policies.md) under the configured names, as `purger schema` prints
    them (``purger.setup.policy_schema``), if they do not exist; a real platform already has them."""
    from purger.connectors import cassandra_session
    from purger.setup import create_own_tables, policy_schema

    keyspace = config.cassandra.keyspace
    session = cassandra_session(config.cassandra)
    try:
        session.execute(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} "
                        f"WITH replication = {keyspace_replication(session, data_centres)}", timeout=60)
        # Under the configured table names, as `purger schema` prints them.
        for statements in policy_schema(config).values():
            for statement in statements:
                session.execute(statement, timeout=60)
        create_own_tables(session, config.cassandra)
    finally:
        session.cluster.shutdown()


def _logback_option(home: Path, level: str) -> str:
    """The JVM option that points logback (Cassandra's and S3Proxy's logger) at a console log at ``level``."""
    (home / "logback.xml").write_text(
        '<configuration><appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">'
        "<encoder><pattern>%-5level [%thread] %date{ISO8601} %logger - %msg%n</pattern></encoder></appender>"
        f'<root level="{level}"><appender-ref ref="STDOUT"/></root></configuration>'
    )
    return f"-Dlogback.configurationFile={home / 'logback.xml'}"


# --- S3Proxy -------------------------------------------------------------------------------


def s3proxy_server(name: str, store: S3Endpoint) -> Server:
    """An S3Proxy on the port of ``store.endpoint`` that takes ``store``'s keys, its buckets as directories."""
    port = int(store.endpoint.rsplit(":", 1)[1])

    def configure(home: Path) -> list[str]:
        (home / "data").mkdir(parents=True, exist_ok=True)
        properties = home / "s3proxy.properties"
        properties.write_text("\n".join([
            f"s3proxy.endpoint=http://127.0.0.1:{port}",
            "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={store.access_key}",
            f"s3proxy.credential={store.secret_key.get_secret_value()}",
            "jclouds.provider=filesystem",
            f"jclouds.filesystem.basedir={home / 'data'}",
        ]) + "\n")
        # Without a configuration logback logs at DEBUG: S3Proxy wrote 135 MB in 24 minutes of the test suite,
        # a line per socket event, on the cores the suite runs on.
        return [_logback_option(home, "WARN"), "--", "--properties", str(properties)]

    def ready() -> None:
        from purger.connectors import s3_client

        s3_client(store).list_buckets()

    return Server(name, f"127.0.0.1:{port}", artifacts.S3PROXY, "org.gaul.s3proxy.Main", "256m", configure, ready, 90)


def create_buckets(config: PurgerConfig) -> None:
    """Create one bucket per configured data centre if it does not exist."""
    from purger.connectors import s3_client

    for store in config.stores.values():
        client = s3_client(store)
        existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        if store.bucket not in existing:
            client.create_bucket(Bucket=store.bucket)


def prepare(config: PurgerConfig, partitions: int = EVENT_TOPIC_PARTITIONS, data_centres: Sequence[str] = ()) -> None:
    """Create what a configuration expects on any servers: its topics, keyspace (replicated to
    ``data_centres``, as ``keyspace_replication``) and buckets."""
    create_topics(config, partitions)
    create_schema(config, data_centres)
    create_buckets(config)


# The stack's Cassandra nodes: node 1 in data centre dc1, always; node 2 in dc2 with `up(data_centres=2)`.
CASSANDRA_NODES = [
    CassandraNode(),
    CassandraNode("127.0.0.2", "dc2", initial_token=2**62, jmx_port=7299),
]
SECOND_NODE = cassandra_server("cassandra-dc2", CASSANDRA_NODES[1], "768m",
                               CassandraConfig(hosts=["127.0.0.2"], local_data_centre="dc2"))

SERVERS = [
    Server("kafka", f"127.0.0.1:{KAFKA_PORT}", artifacts.KAFKA, "kafka.Kafka", "512m",
           configure_kafka, _kafka_ready, 90),
    cassandra_server("cassandra", CASSANDRA_NODES[0], "1g", CassandraConfig()),
    s3proxy_server("s3proxy", S3Endpoint(endpoint=f"http://127.0.0.1:{S3_PORT}")),
]


class Processes:
    """Server processes started by pid: launch one and wait until it answers, stop it, say how each is.
    The local stack and the Spark cluster each keep one (composed, not inherited)."""

    def __init__(self, servers: list[Server], log: Callable[[str], None] = print) -> None:
        self.servers = servers
        self.log = log

    def named(self, name: str) -> Server:
        for server in self.servers:
            if server.name == name:
                return server
        raise StackError(f"no server named {name!r}; there are {', '.join(s.name for s in self.servers)}")

    def launch(self, server: Server, command: list[str], env: dict[str, str] | None = None) -> None:
        """Start ``command`` as ``server`` in a session of its own, record its pid, wait until it answers."""
        with open(server.log_file, "ab") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=server.home, env=env, start_new_session=True,
            )
        server.pid_file.write_text(str(process.pid))
        self.log(f"{server.name}: started (pid {process.pid}), waiting for {server.address}")
        deadline = time.monotonic() + server.start_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise StackError(
                    f"{server.name} on {server.address} exited with code {process.returncode}; "
                    f"last lines of {server.log_file}:\n{server.log_tail()}"
                )
            try:
                server.ready()
                self.log(f"{server.name}: answering on {server.address}")
                return
            except Exception as error:  # not up yet: any client error means "try again"
                last_error = error
                time.sleep(2)
        self.stop(server)
        raise StackError(
            f"{server.name} did not answer on {server.address} within {human_duration(server.start_timeout)} "
            f"(last error: {last_error}); last lines of {server.log_file}:\n{server.log_tail()}"
        )

    def stop(self, server: Server) -> None:
        """Stop the server's process group, by its recorded pid (never by name)."""
        pid = server.pid()
        if pid is None:
            server.pid_file.unlink(missing_ok=True)
            return
        self.log(f"{server.name}: stopping pid {pid}")
        os.killpg(pid, signal.SIGTERM)
        for _ in range(60):
            if server.pid() is None or _zombie(pid):
                break
            time.sleep(0.5)
        else:
            os.killpg(pid, signal.SIGKILL)
        server.pid_file.unlink(missing_ok=True)

    def stop_all(self) -> None:
        for server in reversed(self.servers):
            self.stop(server)

    def status(self) -> dict[str, str]:
        result = {}
        for server in self.servers:
            pid = server.pid()
            result[server.name] = f"running (pid {pid}) on {server.address}" if pid else "stopped"
        return result

    def running(self) -> bool:
        return all(server.pid() for server in self.servers)


class LocalStack:
    """Starts, checks and stops the local servers. See the module docstring."""

    def __init__(self, servers: list[Server] | None = None, log: Callable[[str], None] = print) -> None:
        self.processes = Processes(servers if servers is not None else SERVERS, log)
        self.log = log

    def up(self, config: PurgerConfig | None = None, data_centres: int = 1) -> None:
        """Start every server that is not running, wait for each, then create topics, schema, buckets. With
        ``data_centres=2``, Cassandra's second node (data centre dc2) too, and the keyspace replicated to both."""
        if data_centres not in (1, 2):
            raise StackError(f"the local stack has 1 or 2 data centres, not {data_centres}")
        config = config or build_config({})
        artifacts.spark_connector_jars()  # so the first Spark session starts without a download
        for server in self.processes.servers:
            self.start_server(server)
        if data_centres == 2:
            self.add_second_node()
        self.log("creating topics, keyspace and buckets")
        prepare(config, data_centres=[node.data_centre for node in CASSANDRA_NODES[:data_centres]])

    def add_second_node(self) -> None:
        """Start Cassandra's node 2 (data centre dc2 on 127.0.0.2) from empty data, and wait until it has
        joined node 1's cluster."""
        self.start_server(SECOND_NODE)

    def remove_second_node(self) -> None:
        """Decommission node 2, so that the ranges it took of the system keyspaces replicated by
        SimpleStrategy (system_distributed, system_traces) go back to node 1, then stop it."""
        if SECOND_NODE.pid():
            self.log(f"{SECOND_NODE.name}: decommissioning")
            # --force: system_distributed asks for 3 replicas, which one node left cannot hold anyway.
            nodetool(CASSANDRA_NODES[1], "decommission", "--force")
        self.processes.stop(SECOND_NODE)

    def stop(self, name: str) -> None:
        """Stop one server, keeping its data (fault tests: a server going away)."""
        self.processes.stop(self._server(name))

    def start(self, name: str) -> None:
        """Start one server again on the data it had."""
        self.start_server(self._server(name), fresh=False)

    def _server(self, name: str) -> Server:
        return SECOND_NODE if name == SECOND_NODE.name else self.processes.named(name)

    def start_server(self, server: Server, fresh: bool = True) -> None:
        """Start ``server`` unless it runs, from empty data when ``fresh``, and wait until it answers."""
        if pid := server.pid():
            self.log(f"{server.name}: already running (pid {pid}) on {server.address}")
            return
        host, port = server.address.rsplit(":", 1)
        if _port_open(int(port), host):
            raise StackError(
                f"{server.name}: {server.address} is taken by a process this stack did not start; "
                "stop it or point the purger at it with the PURGER_* environment variables"
            )
        self.log(f"{server.name}: fetching jars")
        artifacts.fetch(server.bundle)
        if fresh:
            # Every `up` starts from empty data: the stack is for demos and tests.
            shutil.rmtree(server.home, ignore_errors=True)
        server.home.mkdir(parents=True, exist_ok=True)
        extra = server.configure(server.home)
        jvm_args, program_args = (extra[: extra.index("--")], extra[extra.index("--") + 1:]) if "--" in extra else (extra, [])
        self.processes.launch(server, [
            _java(), f"-Xms{server.heap}", f"-Xmx{server.heap}", "-XX:+ExitOnOutOfMemoryError",
            *jvm_args, "-cp", str(server.bundle.directory / "*"), server.main_class, *program_args,
        ])

    def down(self) -> None:
        """Stop the servers this stack started, by their recorded process ids (the next `up` starts from empty
        data, so node 2 needs no decommission)."""
        self.processes.stop(SECOND_NODE)
        self.processes.stop_all()

    def status(self) -> dict[str, str]:
        """Each server's state; Cassandra's node 2 only while it runs."""
        status = self.processes.status()
        if pid := SECOND_NODE.pid():
            status[SECOND_NODE.name] = f"running (pid {pid}) on {SECOND_NODE.address}"
        return status

    def running(self) -> bool:
        return self.processes.running()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True

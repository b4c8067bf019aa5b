"""``purger setup``: the purger's own topics created, and what it needs of the platform checked.

The purger owns three Kafka topics, the control, reconcile and dead-letter topics,
and three Cassandra tables in the platform's keyspace, its journal
(``sinks.journal``), its legal holds (``sinks.holds``) and its failing purges
(``sinks.failures``): ``set_up`` creates them when they are missing
(``own_topics`` says how for the topics), and a dry run's control and
dead-letter topics beside them (``dry_run_topics``), which `purger run
--dry-run` then finds.
The rest is the platform's and is only checked: the events topics, the keyspace,
every enabled policy's tables with the columns it reads
(``Policy.columns_read``, under the configured table names), and each data
centre's bucket. Every problem is one line that names what is missing, where
(address, topic, ``keyspace.table``, column, bucket and endpoint) and what to
do; a server that does not answer within ``ANSWER_TIMEOUT_S`` is one line
naming its address. All problems are listed, not only the first. Running it
again changes nothing. It also reads the keyspace's replication and says at
which consistency levels the platform's writes are sure to be seen by the
purger's checks (``replication_lines``, from ``core.writer_contract``).

``purger run``, ``replay`` and ``submit`` make the same checks before Spark
starts (``check``), and create nothing: creating is ``setup``'s, so a running
purger never changes the platform's Kafka and needs no right to create topics.

Example::

    from purger.setup import check, set_up
    found = set_up(config)     # creates the control and dead-letter topics if missing
    found.created              # ['topic purger.control (kafka.control_topic: 1 partition, kept 30 days) on ...']
    found.problems             # [] when everything is in place
    found.replication          # ['keyspace mailbox: NetworkTopologyStrategy dc1=1; a platform write at ...']
    check(config).problems     # the same checks; nothing created
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Iterator

from purger.core.times import duration_ms
from purger.connectors import KafkaRefused, ServerUnavailable, cassandra_session, kafka_client, s3_client
from purger.core.sizing import Sizing
from purger.core.settings import CassandraConfig, KafkaConfig, PurgerConfig
from purger.core.writer_contract import (
    KNOWN_STRATEGIES, SERIAL_LEVELS, Replication, reach, replication_from_schema, seen, seen_from_every_data_centre)
from purger.output import human_duration
from purger.sinks.failures import FAILURES_COLUMNS, failures_schema
from purger.sinks.holds import HOLDS_COLUMNS, holds_schema
from purger.sinks.journal import JOURNAL_COLUMNS, journal_schema
from purger.sinks.restorations import NAMES_COLUMNS, RESTORATIONS_COLUMNS, restoration_names_schema, restorations_schema
from purger.sinks.objects import bucket_versioning

if TYPE_CHECKING:
    from kafka.admin import KafkaAdminClient

# How long a server may take to answer before it is reported as not answering.
ANSWER_TIMEOUT_S = 5


@dataclass(frozen=True)
class OwnTopic:
    """A topic the purger owns and creates: its name, the configuration key that names it, its shape."""

    name: str
    key: str
    partitions: int
    retention: timedelta

    @property
    def options(self) -> dict[str, Any]:
        """The topic as Kafka's admin client creates it."""
        return {
            "num_partitions": self.partitions,
            # -1: the brokers' default.replication.factor, so a real cluster's durability applies.
            "replication_factor": -1,
            # Deleted by age, never compacted: clock ticks have no key, which a compacted topic refuses.
            "configs": {"cleanup.policy": "delete", "retention.ms": str(duration_ms(self.retention))},
        }

    def __str__(self) -> str:
        partitions = f"{self.partitions} partition" + ("s" if self.partitions != 1 else "")
        return f"topic {self.name} ({self.key}: {partitions}, kept {self.retention.days} days)"


def own_topics(kafka: KafkaConfig, events_partitions: int = 1, sizing: Sizing | None = None) -> list[OwnTopic]:
    """The control, reconcile and dead-letter topics, as ``setup`` and the local stack create them; the
    reconcile topic with ``events_partitions`` partitions, the most of the events topics', or the state's
    partitions at the volume ``sizing`` is for, if more; the control topic with what that volume's
    rechecks and released payloads need (``core.sizing``)."""
    control = sizing.control_topic_partitions if sizing else 1
    reconcile = max(events_partitions, sizing.reconcile_topic_partitions if sizing else 1)
    return [
        # A few records a second (clock ticks, rechecks, released payloads): one partition. A replay reads
        # it from its end and rebuilds rechecks and releases from the events, so only a restart from an
        # existing checkpoint needs its history: what the last batches sent before the stop, still unread.
        # Its retention is thus the longest stop a plain restart recovers from; after a longer one, replay
        # (the query does not fail on records gone, so their rechecks would be lost).
        OwnTopic(kafka.control_topic, "kafka.control_topic", control, timedelta(days=30)),
        # Bad records, kept for an operator to read, fix and send again.
        OwnTopic(kafka.dead_letter_topic, "kafka.dead_letter_topic", 1, timedelta(days=30)),
        # Rows re-expressed as events by a reconcile, keyed by object id: as many partitions as the events,
        # since a bootstrap feeds as many objects as they ever held. A replay reads it from its start; a
        # reconcile feeds again whatever it still finds, so a week covers several scheduled runs.
        OwnTopic(kafka.reconcile_topic, "kafka.reconcile_topic", reconcile, timedelta(days=7)),
    ]


def dry_run_topics(kafka: KafkaConfig) -> list[OwnTopic]:
    """The topics of a dry run on this configuration that are its own (``KafkaConfig.as_dry_run``: its
    control and dead-letter topics), shaped as the purger's: a dry run shares neither with a real purger.
    None for a dry run's configuration, whose own topics they already are."""
    real = {t.key: t.name for t in own_topics(kafka)}
    return [replace(t, key=f"{t.key} of a dry run") for t in own_topics(kafka.as_dry_run()) if t.name != real[t.key]]


@dataclass
class Findings:
    """What ``set_up`` or ``check`` created, what it found in place (a line per server), each problem as one
    line, and what the keyspace's replication asks of the platform's writes."""

    created: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # The keyspace's replication and the consistency levels it asks of the platform's writes.
    replication: list[str] = field(default_factory=list)


def set_up(config: PurgerConfig, create: bool = True, sizing: Sizing | None = None) -> Findings:
    """Create the purger's own topics when missing (unless ``create`` is false, when a missing one is a
    problem), with the partitions the volume of ``sizing`` needs if given, and check the events topics, the
    tables and columns the enabled policies read, and the buckets."""
    findings = Findings()
    with _clients_quiet():
        _kafka(config, create, findings, sizing)
        _cassandra(config, create, findings)
        _stores(config, findings)
    return findings


# The client libraries the checks use. Each logs what fails as it meets it (the Cassandra driver each
# connection error with its traceback, kafka-python each retry of a bootstrap), on top of the one line per
# problem the checks report: shown wherever a handler takes other libraries' warnings (`purger run`'s,
# ``purger.logs.log_to_stderr``), not under `purger setup`, which sets none.
CLIENT_LOGGERS = ("cassandra", "kafka", "botocore", "urllib3")


@contextmanager
def _clients_quiet() -> Iterator[None]:
    """The client libraries' records kept from the process's handlers while the checks run: their findings are
    the checks' lines. Their levels stay, so a handler of the checks' own on a client's logger (the Kafka
    refusals, ``connectors.kafka_clients._RefusalsSeen``) still sees them."""
    loggers = [logging.getLogger(name) for name in CLIENT_LOGGERS]
    kept = [(each, each.propagate, logging.NullHandler()) for each in loggers]
    for each, _, null in kept:
        each.propagate = False
        each.addHandler(null)  # else logging's last resort would print them
    try:
        yield
    finally:
        for each, propagate, null in kept:
            each.removeHandler(null)
            each.propagate = propagate


def check(config: PurgerConfig) -> Findings:
    """``set_up``'s checks, creating nothing: what ``purger run`` verifies before it starts."""
    return set_up(config, create=False)


# --- Kafka ---------------------------------------------------------------------------------------


def _kafka(config: PurgerConfig, create: bool, findings: Findings, sizing: Sizing | None = None) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.errors import KafkaError

    kafka = config.kafka
    where = f"Kafka {kafka.bootstrap_servers}"
    try:
        admin = kafka_client(KafkaAdminClient, kafka, bootstrap_timeout_ms=ANSWER_TIMEOUT_S * 1000,
                             request_timeout_ms=ANSWER_TIMEOUT_S * 2000)
    except KafkaRefused as error:
        findings.problems.append(str(error))
        return
    except KafkaError:
        findings.problems.append(f"Kafka at {kafka.bootstrap_servers} does not answer within "
                                 f"{human_duration(ANSWER_TIMEOUT_S)}: "
                                 "check kafka.bootstrap_servers and that the brokers run")
        return
    try:
        existing = set(admin.list_topics())
        present = []
        for topic, key in _events_topics(config).items():
            if topic in existing:
                present.append(topic)
            else:
                findings.problems.append(f"{where}: events topic {topic} ({key}) does not exist; it is the "
                                         f"platform's: create it there, or correct {key}")
        partitions = [len(t["partitions"]) for t in admin.describe_topics(present)] if present else []
        own = own_topics(kafka, max(partitions, default=1), sizing)
        if create:  # only `purger run --dry-run` needs them: not checked
            own.extend(dry_run_topics(kafka))
        missing = [t for t in own if t.name not in existing]
        if create:
            _create_topics(admin, missing, where, findings)
        else:
            findings.problems.extend(
                f"{where}: topic {t.name} ({t.key}, the purger's own) does not exist; create it with "
                "`purger setup` and this configuration" for t in missing)
        if sizing is not None:
            _fewer_partitions_than_sized(admin, [t for t in own if t.name in existing], where, findings)
        found = [*(f"events topic {t}" for t in present), *(f"topic {t.name}" for t in own if t.name in existing)]
        if found:
            findings.checked.append(f"{where}: {', '.join(found)}")
    except KafkaError as error:
        findings.problems.append(f"{where}: {error}; check kafka.bootstrap_servers and that the brokers run")
    finally:
        admin.close()


def _fewer_partitions_than_sized(admin: "KafkaAdminClient", own: list[OwnTopic], where: str,
                                findings: Findings) -> None:
    """A line for each of the purger's own topics that exists with fewer partitions than the volume needs: Kafka
    adds partitions to a topic in place; the purger's topics may take them at any time."""
    have = {t["name"]: len(t["partitions"]) for t in admin.describe_topics([t.name for t in own])} if own else {}
    for topic in own:
        if have.get(topic.name, topic.partitions) < topic.partitions:
            findings.problems.append(
                f"{where}: topic {topic.name} ({topic.key}) has {have[topic.name]} partitions, {topic.partitions} "
                f"at this rate: kafka-topics.sh --alter --topic {topic.name} --partitions {topic.partitions}")


def _create_topics(admin: "KafkaAdminClient", missing: list[OwnTopic], where: str, findings: Findings) -> None:
    from kafka.errors import TopicAlreadyExistsError

    if not missing:
        return
    response = admin.create_topics({t.name: t.options for t in missing}, raise_errors=False, wait_for_metadata=True)
    # A topic that exists by now was created by another setup meanwhile: that is no problem.
    refused = {r["name"]: r["error_message"] or f"error code {r['error_code']}" for r in response["topics"]
               if r["error_code"] not in (0, TopicAlreadyExistsError.errno)}
    for topic in missing:
        if topic.name in refused:
            findings.problems.append(f"{where}: could not create topic {topic.name} ({topic.key}): "
                                     f"{refused[topic.name]}; create it yourself, or correct {topic.key}")
        else:
            findings.created.append(f"{topic} on {where}")


def _events_topics(config: PurgerConfig) -> dict[str, str]:
    """Each events topic (as ``policies.events_topics``) with the configuration key that names it."""
    keys = {topic: "kafka.topics" for topic in config.kafka.topics}
    for policy in config.policy_set.policies:
        for topic in policy.settings.topics:
            keys.setdefault(topic, f"policies.{policy.name}.topics")
    return keys


# --- Cassandra -----------------------------------------------------------------------------------


def _cassandra(config: PurgerConfig, create: bool, findings: Findings) -> None:
    from cassandra import DriverException

    cassandra = config.cassandra
    where = "Cassandra " + ", ".join(f"{host}:{cassandra.port}" for host in cassandra.hosts)
    try:
        session = cassandra_session(cassandra)
    except ServerUnavailable as error:
        findings.problems.append(str(error))  # names the address, the reason and what to do
        return
    try:
        keyspace = _cql_name(cassandra.keyspace)
        found = session.execute("SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = %s",
                                (keyspace,)).one()
        if found is None:
            findings.problems.append(f"{where}: keyspace {keyspace} does not exist; it is the platform's: create "
                                     "it there, or correct cassandra.keyspace")
            return
        _replication(config, keyspace, found.replication, _local_data_centre(session), where, findings)
        columns: dict[str, set[str]] = defaultdict(set)
        for row in session.execute("SELECT table_name, column_name FROM system_schema.columns "
                                   "WHERE keyspace_name = %s", (keyspace,)):
            columns[row.table_name].add(row.column_name)
        _own_tables(session, cassandra, where, columns, create, findings)
        checked = []
        for policy in config.policy_set.policies:
            for configured, read in policy.columns_read().items():
                table = _cql_name(configured)
                if table not in columns:
                    findings.problems.append(
                        f"{where}: table {keyspace}.{table} does not exist (policy {policy.name} reads it); create "
                        "it as in the policy's reference schema (run `purger schema` to see the reference CQL), "
                        f"or correct its name in [policies.{policy.name}]")
                    continue
                findings.problems.extend(
                    f"{where}: column {keyspace}.{table}.{column} does not exist (policy {policy.name} reads it); "
                    f"add it as in the policy's reference schema (ALTER TABLE {keyspace}.{table} ADD {column} ...; "
                    "`purger schema` shows the reference CQL)"
                    for column in sorted(read - columns[table]))
                checked.append(table)
        findings.checked.append(f"{where}: keyspace {keyspace}, tables {', '.join(checked) or '(none)'} with the "
                                "columns the purger reads")
    except DriverException as error:
        findings.problems.append(f"{where}: reading the schema failed ({error}); check that the nodes answer")
    finally:
        session.cluster.shutdown()


# --- the keyspace's replication -----------------------------------------------------------------

WRITER_CONTRACT_DOC = "docs/policies.md, the writer contract across data centres"


def _local_data_centre(session: Any) -> str:
    """The data centre the purger's session talks to: cassandra.local_data_centre, or the first contact
    point's, as the driver's load balancing chose it."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT

    policy = session.get_execution_profile(EXEC_PROFILE_DEFAULT).load_balancing_policy
    # Token-aware routing wraps the data-centre-aware policy (``connectors.cassandra_session``).
    return getattr(policy, "_child_policy", policy).local_dc


def _replication(config: PurgerConfig, keyspace: str, options: dict[str, str], local_dc: str, where: str,
                 findings: Findings) -> None:
    """The keyspace's replication and what it asks of the platform's writers, or one problem line when the
    purger's local data centre holds no replica for its LOCAL_ reads and checks."""
    cassandra = config.cassandra
    replication = replication_from_schema(options, local_dc)
    local_levels = [level for level in (cassandra.consistency, cassandra.serial_consistency)
                    if level.startswith("LOCAL_")]
    if replication.strategy in KNOWN_STRATEGIES and local_levels and local_dc not in replication.replicas:
        elsewhere = ", ".join(sorted(replication.replicas)) or "(none)"
        findings.problems.append(
            f"{where}: keyspace {keyspace} ({replication}) has no replica in data centre {local_dc}, where the purger "
            f"reads at {' and '.join(local_levels)}; replicate the keyspace there, or set "
            f"cassandra.local_data_centre to one of {elsewhere}")
        return
    payload_refs = next((policy.table_names().get("payload_refs", "payload_refs")
                         for policy in config.policy_set.policies if policy.name == "mailbox"), None)
    findings.replication.extend(replication_lines(keyspace, replication, cassandra.serial_consistency,
                                                  cassandra.consistency, local_dc, payload_refs))


def replication_lines(keyspace: str, replication: Replication, serial_consistency: str, consistency: str,
                      local_dc: str, payload_refs: str | None) -> list[str]:
    """What ``purger setup`` says of the keyspace's replication: the consistency levels at which the
    platform's writes are sure to be seen by the purger's conditional deletes and claims (at
    ``serial_consistency``, through ``local_dc``), and, with the mailbox policy's ``payload_refs`` table, by
    its plain read of the references (at ``consistency``). Pure: ``core.writer_contract``'s arithmetic.

    Example::

        replication_lines("mailbox", Replication("NetworkTopologyStrategy", {"dc1": 3, "dc2": 3}), "SERIAL",
                          "LOCAL_QUORUM", "dc1", None)
        # ["keyspace mailbox: NetworkTopologyStrategy dc1=3 dc2=3; a platform write at LOCAL_QUORUM (2 of 6, in
        #   dc2) is not sure to be seen by the purger's SERIAL checks (any 4 of 6): revivals, payload links and
        #   users added again must be lightweight transactions at SERIAL (docs/policies.md, the writer contract
        #   across data centres)"]
    """
    if replication.strategy not in KNOWN_STRATEGIES:
        return [f"keyspace {keyspace}: replication class {replication.strategy}, whose placement the purger does "
                "not know: use NetworkTopologyStrategy to know which platform writes its checks are sure to see "
                f"({WRITER_CONTRACT_DOC})"]

    def everywhere(levels: tuple[str, ...], read: str) -> list[str]:
        return [level for level in levels if seen_from_every_data_centre(level, read, replication, local_dc)]

    def writer_missed(read: str) -> str:
        """A data centre whose LOCAL_QUORUM writes ``read`` may miss, another than the purger's if any; the
        purger's when ``read`` misses none."""
        missed = [dc for dc in replication.replicas if not seen("LOCAL_QUORUM", read, replication, dc, local_dc)]
        return sorted(missed, key=lambda dc: (dc == local_dc, dc))[0] if missed else local_dc

    serial = serial_consistency
    writer = writer_missed(serial)
    local_quorum_seen = seen("LOCAL_QUORUM", serial, replication, writer, local_dc)
    # A plain revival, at any level, is lost to a conditional delete that timed out before it (docs/policies.md):
    # only a lightweight transaction is ordered with the delete.
    conditional = everywhere(SERIAL_LEVELS, serial)
    advice = ("revivals, payload links and users added again must be lightweight transactions at "
              f"{_either(conditional)}" if conditional else
              "revivals, payload links and users added again must run their lightweight transactions through "
              f"{local_dc}")
    lines = [f"keyspace {keyspace}: {replication}; a platform write at LOCAL_QUORUM "
             f"({_reached('LOCAL_QUORUM', replication, writer)}) is {'' if local_quorum_seen else 'not sure to be '}"
             f"seen by the purger's {serial} checks ({_reached(serial, replication, local_dc)}): {advice} "
             f"({WRITER_CONTRACT_DOC})"]
    reference_writer = writer_missed(consistency)
    if payload_refs is not None and not seen("LOCAL_QUORUM", consistency, replication, reference_writer, local_dc):
        lines.append(f"payload references ({payload_refs}) are read at {consistency} "
                     f"({_reached(consistency, replication, local_dc)}): one written at LOCAL_QUORUM "
                     f"({_reached('LOCAL_QUORUM', replication, reference_writer)}) is not sure to be seen; write "
                     f"them at {_either(everywhere(('QUORUM', 'EACH_QUORUM', 'ALL'), consistency))} "
                     f"({WRITER_CONTRACT_DOC})")
    return lines


def _reached(level: str, replication: Replication, dc: str) -> str:
    """The replicas ``level`` waits for through ``dc``, in words: ``any 4 of 6``, ``2 of 6, in dc2``."""
    found = reach(level, replication, dc)
    if found.anywhere is not None:
        return f"any {found.anywhere} of {replication.total}"
    if level == "EACH_QUORUM":
        return f"{sum(found.in_each.values())} of {replication.total}, a majority in each data centre"
    return f"{found.in_each[dc]} of {replication.total}, in {dc}"


def _either(levels: list[str]) -> str:
    return levels[0] if len(levels) == 1 else ", ".join(levels[:-1]) + f" or {levels[-1]}"


# --- the reference schema ------------------------------------------------------------------------

_TABLE_IN_SCHEMA = re.compile(r"\{keyspace\}\.(\w+)")


def policy_schema(config: PurgerConfig) -> dict[str, list[str]]:
    """Each enabled policy's reference schema (``Policy.schema``) as CQL statements, rendered under the
    configured keyspace (``cassandra.keyspace``) and the policy's configured table names
    (``Policy.table_names``): what ``purger schema`` prints and the local stack creates.

    Example::

        policy_schema(load_config("purger.toml"))["mailbox"][0]
        # 'CREATE TABLE IF NOT EXISTS mailbox.messages (\n  message_id text PRIMARY KEY, ...);'
    """
    rendered: dict[str, list[str]] = {}
    for policy in config.policy_set.policies:
        names = policy.table_names()

        def configured(match: re.Match[str]) -> str:
            name = names.get(match.group(1), match.group(1))
            return "{keyspace}." + name.replace("{", "{{").replace("}", "}}")

        cql = _TABLE_IN_SCHEMA.sub(configured, policy.schema).format(keyspace=config.cassandra.keyspace)
        rendered[policy.name] = [f"{statement.strip()};" for statement in cql.split(";") if statement.strip()]
    return rendered


def reference_schema(config: PurgerConfig, replication: dict[str, int] | None = None) -> str:
    """``policy_schema`` as one CQL script, a comment before each policy's statements, and the purger's own
    own tables last (``purger setup`` creates those). The keyspace's data centres are the platform's,
    which the configuration does not know: with ``replication`` (data centre -> replicas), its CREATE KEYSPACE
    comes first; without, a comment says how to get it."""
    keyspace = config.cassandra.keyspace
    head = (f"-- keyspace {keyspace} (cassandra.keyspace): the platform's, with NetworkTopologyStrategy and replicas "
            "in each data centre,\n-- whose counts set the consistency levels the platform's writes need\n"
            f"-- ({WRITER_CONTRACT_DOC}: `purger setup` names them)")
    if replication:
        factors = ", ".join(f"'{dc}': {count}" for dc, count in replication.items())
        head += (f"\nCREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = "
                 f"{{'class': 'NetworkTopologyStrategy', {factors}}};")
    else:
        head += "\n-- (`purger schema --replication dc1:3,dc2:3` prints its CREATE KEYSPACE)"
    parts = [head]
    parts += [f"-- {name}: the policy's reference tables (cassandra.keyspace, [policies.{name}])\n"
              + "\n".join(statements) for name, statements in policy_schema(config).items()]
    parts += [f"-- {own.what}, the purger's own (cassandra.{own.key}): `purger setup` creates it\n"
              f"{own.schema(keyspace, getattr(config.cassandra, own.key))};" for own in OWN_TABLES]
    return "\n\n".join(parts)


@dataclass(frozen=True)
class OwnTable:
    """A Cassandra table of the purger's own, in the platform's keyspace: its key in ``[cassandra]``, what it is,
    its columns, its CQL and what to do when one of them is missing."""

    key: str
    what: str
    columns: frozenset[str]
    schema: Callable[[str, str], str]
    mend: str


OWN_TABLES = (
    OwnTable("journal_table", "the purger's journal", JOURNAL_COLUMNS, journal_schema,
             "drop the table and run `purger setup` again (it holds nothing a stopped purger needs)"),
    OwnTable("holds_table", "the legal holds", HOLDS_COLUMNS, holds_schema,
             "add it as the holds table's schema in docs/operations.md has it (the holds in it stand meanwhile)"),
    OwnTable("failures_table", "the failing purges", FAILURES_COLUMNS, failures_schema,
             "drop the table and run `purger setup` again (a failing purge is then tried again at once)"),
    OwnTable("restorations_table", "the undo window's images", RESTORATIONS_COLUMNS, restorations_schema,
             "drop the table and run `purger setup` again (the deletions it kept can then no longer be restored)"),
    OwnTable("restoration_names_table", "where an erasure finds a subject's images", NAMES_COLUMNS,
             restoration_names_schema, "drop the table and run `purger setup` again (an erasure then finds the images "
                                       "kept since)"),
)


def create_own_tables(session: Any, cassandra: CassandraConfig, keyspace: str | None = None) -> None:
    """The purger's own tables, created in ``keyspace`` (by default the configured one) where missing."""
    for own in OWN_TABLES:
        session.execute(own.schema(keyspace or cassandra.keyspace, getattr(cassandra, own.key)), timeout=60)


def _own_tables(session: Any, cassandra: CassandraConfig, where: str, columns: dict[str, set[str]], create: bool,
                findings: Findings) -> None:
    """The purger's own tables: each created when missing, or one problem line."""
    keyspace = _cql_name(cassandra.keyspace)
    for own in OWN_TABLES:
        name = getattr(cassandra, own.key)
        table = _cql_name(name)
        if table in columns:
            findings.problems.extend(
                f"{where}: column {keyspace}.{table}.{column} of {own.what} does not exist; {own.mend}"
                for column in sorted(own.columns - columns[table]))
        elif create:
            session.execute(own.schema(cassandra.keyspace, name), timeout=60)
            findings.created.append(f"table {keyspace}.{table} (cassandra.{own.key}, {own.what}) on {where}")
        else:
            findings.problems.append(f"{where}: table {keyspace}.{table} (cassandra.{own.key}, the purger's own) "
                                     "does not exist; create it with `purger setup` and this configuration")


def _cql_name(name: str) -> str:
    """A keyspace or table name as the schema tables hold it: CQL folds unquoted names to lower case."""
    return name[1:-1] if name.startswith('"') and name.endswith('"') else name.lower()


# --- object stores -------------------------------------------------------------------------------


def _stores(config: PurgerConfig, findings: Findings) -> None:
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

    silent: dict[str, list[str]] = defaultdict(list)  # endpoint -> its data centres, once it did not answer
    checked: dict[str, list[str]] = defaultdict(list)
    for dc, store in config.stores.items():
        where = f"S3 {store.endpoint}"
        if store.endpoint in silent:
            silent[store.endpoint].append(dc)
            continue
        try:
            client = s3_client(store, attempts=1, read_timeout_s=ANSWER_TIMEOUT_S)
            client.head_bucket(Bucket=store.bucket)
            checked[where].append(f"{store.bucket} (stores.{dc}, {_versioning(client, config, dc, findings)}"
                                  f"{_undo_copies(client, config, dc, findings)})")
        except (ConnectionError, HTTPClientError):
            silent[store.endpoint].append(dc)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchBucket"):
                findings.problems.append(f"{where}: bucket {store.bucket} (stores.{dc}.bucket) does not exist; "
                                         f"create it, or correct stores.{dc}.bucket")
            elif code in ("403", "AccessDenied"):
                findings.problems.append(f"{where}: bucket {store.bucket} (stores.{dc}) refuses these credentials; "
                                         f"grant stores.{dc}.access_key reading and deleting in it, or correct "
                                         f"stores.{dc}.access_key and secret_key")
            else:
                findings.problems.append(f"{where}: bucket {store.bucket} (stores.{dc}) answered {code}: {error}")
    for endpoint, dcs in silent.items():
        findings.problems.append(f"S3 at {endpoint} does not answer within {human_duration(ANSWER_TIMEOUT_S)}: check "
                                 + ", ".join(f"stores.{dc}.endpoint" for dc in dcs))
    findings.checked.extend(f"{where}: buckets {', '.join(buckets)}" for where, buckets in checked.items())


def _versioning(client: Any, config: PurgerConfig, dc: str, findings: Findings) -> str:
    """Whether ``dc``'s bucket keeps versions, and what a blob's purge does there (``stores.<dc>.
    noncurrent_versions``, docs/operations.md "Versioned buckets"); with ``lifecycle``, a problem when no
    enabled rule expires the noncurrent versions under every prefix the enabled policies keep blobs at."""
    store = config.stores[dc]
    status = bucket_versioning(client, store.bucket)
    if status is None:
        return "unversioned"
    versioning = "versioning on" if status == "Enabled" else "versioning suspended"
    if store.noncurrent_versions == "delete":
        return f"{versioning}: a purge deletes every version of a blob"
    rules = _lifecycle_rules(client, store.bucket)
    prefixes = sorted({blobs.prefix for policy in config.policy_set.policies for blobs in policy.blobs})
    uncovered = [prefix for prefix in prefixes if not any(expires_noncurrent_versions(rule, prefix) for rule in rules)]
    if uncovered:
        findings.problems.append(
            f"S3 {store.endpoint}: bucket {store.bucket} (stores.{dc}) keeps versions and stores.{dc}."
            f"noncurrent_versions is lifecycle, but no enabled lifecycle rule expires noncurrent versions under "
            f"{', '.join(uncovered)}: add one (NoncurrentVersionExpiration, and ExpiredObjectDeleteMarker), or set "
            f"stores.{dc}.noncurrent_versions = \"delete\"")
    covering = sorted({rule.get("ID", "") for rule in rules for prefix in prefixes
                       if expires_noncurrent_versions(rule, prefix)})
    return f"{versioning}: noncurrent versions left to lifecycle rule {', '.join(covering) or '(none)'}"


def _lifecycle_rules(client: Any, bucket: str) -> list[dict[str, Any]]:
    """The bucket's lifecycle rules as ``GetBucketLifecycleConfiguration`` gives them; none when it has no
    configuration. Any other refusal is raised (a store without lifecycle rules answers ``NotImplemented``)."""
    from botocore.exceptions import ClientError

    try:
        return client.get_bucket_lifecycle_configuration(Bucket=bucket).get("Rules", [])
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "NoSuchLifecycleConfiguration":
            raise
        return []


UNDO_RULE = "purger-undo-window"


def _undo_copies(client: Any, config: PurgerConfig, dc: str, findings: Findings) -> str:
    """With an undo window, the bucket's lifecycle rule that expires the blobs' copies under ``undo.prefix`` a day
    after the window (docs/operations.md, "Undo"), added beside the bucket's other rules where missing or different;
    a store without lifecycle rules leaves them to the purger's daily upkeep (``expire_copies``), and says so."""
    from botocore.exceptions import ClientError

    if config.undo.window_days is None:
        return ""
    store, days = config.stores[dc], config.undo.window_days + 1
    wanted = {"ID": UNDO_RULE, "Filter": {"Prefix": config.undo.prefix}, "Status": "Enabled",
              "Expiration": {"Days": days}}
    try:
        rules = _lifecycle_rules(client, store.bucket)
        if any(rule.get("ID") == UNDO_RULE and rule.get("Filter") == wanted["Filter"]
               and rule.get("Expiration", {}).get("Days") == days and rule.get("Status") == "Enabled"
               for rule in rules):
            return f"; undo copies expired by lifecycle rule {UNDO_RULE}"
        others = [rule for rule in rules if rule.get("ID") != UNDO_RULE]
        client.put_bucket_lifecycle_configuration(Bucket=store.bucket,
                                                  LifecycleConfiguration={"Rules": [*others, wanted]})
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") not in ("NotImplemented", "501", "MethodNotAllowed",
                                                                 "UnsupportedOperation"):
            raise
        return "; no lifecycle rules: the purger's daily upkeep expires the undo copies"
    findings.created.append(f"lifecycle rule {UNDO_RULE} on bucket {store.bucket} (stores.{dc}): expires "
                            f"{config.undo.prefix} after {days} days (undo.window)")
    return f"; undo copies expired by lifecycle rule {UNDO_RULE}"


def expires_noncurrent_versions(rule: dict[str, Any], prefix: str) -> bool:
    """Whether a lifecycle rule, as ``GetBucketLifecycleConfiguration`` gives it, expires the noncurrent versions
    of every key under ``prefix``: enabled, with ``NoncurrentVersionExpiration``, filtered by a prefix of it alone
    (a tag or size filter leaves keys out)."""
    found = rule.get("Filter", {"Prefix": rule.get("Prefix", "")})
    return (rule.get("Status") == "Enabled" and "NoncurrentVersionExpiration" in rule
            and set(found) <= {"Prefix"} and prefix.startswith(found.get("Prefix", "")))

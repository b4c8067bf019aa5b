"""The purger's settings: the sections of its TOML file, as pure pydantic models.

The file is loaded once, at the edge, by ``purger.config.load_config``, which
also builds the enabled policies from their ``[policies.<name>]`` sections and
hands the one ``PurgerConfig`` (settings and ``policy_set``) down.

Every key has a default that matches the documented defaults (docs/configuration.md) or the local stack, so an
empty file is a valid configuration for the demo. Endpoints can be overridden
from the environment (``PURGER_KAFKA_BOOTSTRAP``, ``PURGER_CASSANDRA_HOSTS``,
``PURGER_S3_ENDPOINT``) so the same file serves the local stack, Docker and a
real deployment. So can credentials (``PURGER_KAFKA_USERNAME``,
``PURGER_KAFKA_PASSWORD``, ``PURGER_CASSANDRA_USERNAME``,
``PURGER_CASSANDRA_PASSWORD``, ``PURGER_S3_ACCESS_KEY``, ``PURGER_S3_SECRET_KEY``,
``PURGER_LEDGER_PSEUDONYM_KEY``),
which then need not be in the file. Secrets are ``SecretStr``: printed, logged
or dumped, they read ``**********``.

Example::

    from purger.core.settings import parse_settings
    settings = parse_settings({"stream": {"trigger_interval": "2s"}})
    settings.stream.trigger_interval  # datetime.timedelta(seconds=2)

    from purger.config import load_config   # the file, with its policies: what the application uses
    config = load_config("purger.toml")
    config.stream.trigger_interval  # datetime.timedelta(seconds=2)
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
import types
import typing
import uuid
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Sequence, Union

if TYPE_CHECKING:
    from purger.core.policy_set import PolicySet

from pydantic import (
    BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, SecretStr, ValidationError, field_validator,
    model_validator,
)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: Any) -> timedelta:
    """Read ``"30d"``, ``"12h"``, ``"10m"``, ``"5s"``, ``"250ms"``, ``"0"`` or a number of seconds.

    >>> parse_duration("12h")
    datetime.timedelta(seconds=43200)
    """
    if isinstance(value, timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return timedelta(seconds=value)
    if isinstance(value, str):
        if value.strip() == "0":  # nothing, in any unit
            return timedelta(0)
        match = _DURATION.match(value)
        if match:
            return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])
    raise ValueError(
        f"{value!r} is not a duration; write a number and a unit of ms, s, m, h or d, e.g. '30d' or '5s'"
    )


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


class _Section(BaseModel):
    # A misspelt key must fail loudly rather than silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaSecurity(_Section):
    """How every Kafka client of the purger connects: the Spark source, the producers (clock, control
    reports, dead letters), the replay's and setup's clients."""

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    username: str | None = None
    password: SecretStr | None = None
    # A PEM file: the authority that signed the brokers' certificates (the system's when unset). A path
    # that every executor can read too: the Spark source and the sink's producers open it there.
    ca_file: str | None = None
    check_hostname: bool = True

    @model_validator(mode="after")
    def _sasl_needs_a_login(self) -> "KafkaSecurity":
        if self.protocol.startswith("SASL") and not (self.username and self.password):
            raise ValueError(f"protocol {self.protocol} needs username and password "
                             "(or PURGER_KAFKA_USERNAME and PURGER_KAFKA_PASSWORD)")
        return self


class KafkaConfig(_Section):
    bootstrap_servers: str = "127.0.0.1:9092"
    security: KafkaSecurity = Field(default_factory=KafkaSecurity)
    # Any other Kafka client property by its Java name, e.g. "client.dns.lookup": given to the Spark
    # source as kafka.<name>, and to the Python clients where kafka-python has it (dots as underscores).
    properties: dict[str, str] = Field(default_factory=dict)
    topics: list[str] = Field(default_factory=lambda: ["mailbox.events"], min_length=1)
    # Where a fresh checkpoint starts reading; an existing checkpoint always resumes.
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    # The events topics' records read per batch at most; the clock ticks on through a larger backlog, at the
    # Kafka time read so far (streams.clock).
    max_offsets_per_trigger: int = Field(default=100_000, gt=0)
    # The purger's own topic: clock ticks that advance the watermark, and the purge
    # sink's reports back to the stateful stage (rechecks, released payloads). Read from its end.
    # A dry run's is `<control_topic>.dry-run` (``PurgerConfig.as_dry_run``).
    control_topic: str = "purger.control"
    # Bad input, with the original bytes as the record value and the reason in its headers. A dry run's is
    # `<dead_letter_topic>.dry-run`, so that the platform's operators see each bad record once.
    dead_letter_topic: str = "purger.dead-letter"
    # The purger's own topic of rows re-expressed as events by `purger reconcile`, read by the stream beside
    # the events topics (docs/reconciliation.md); only the purger writes it.
    reconcile_topic: str = "purger.reconcile"
    # The reconcile topic's records read per batch at most (a source of its own): a bootstrap's feed is read
    # a slice a batch, beside the live events, and the clock ticks on through its backlog (streams.clock).
    reconcile_max_offsets_per_trigger: int = Field(default=5_000, gt=0)

    @property
    def written_by_purger(self) -> list[str]:
        """The topics only the purger writes: their records may carry its control types."""
        return [self.control_topic, self.reconcile_topic]

    def as_dry_run(self) -> "KafkaConfig":
        """A dry run's: its own control and dead-letter topics (``dry_run_name``). It reads the same events and
        reconcile topics, and writes to neither (a dry run's reconcile feeds nothing back)."""
        return self.model_copy(update={key: dry_run_name(getattr(self, key), f"kafka.{key}")
                                       for key in ("control_topic", "dead_letter_topic")})

    @model_validator(mode="after")
    def _properties_leave_security_alone(self) -> "KafkaConfig":
        taken = sorted(set(self.properties) & KAFKA_PROPERTIES_FROM_SECTION)
        if taken:
            raise ValueError(f"properties may not set {', '.join(taken)}: the purger derives it from "
                             "kafka.bootstrap_servers and [kafka.security]; set those instead")
        return self


# The Kafka client properties the purger derives from bootstrap_servers and [kafka.security]: given again
# in kafka.properties, one of the two would silently win.
KAFKA_PROPERTIES_FROM_SECTION = frozenset({
    "bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.jaas.config", "ssl.truststore.type",
    "ssl.truststore.location", "ssl.endpoint.identification.algorithm",
})


class CassandraTls(_Section):
    # The authority that signed the nodes' certificates (PEM), readable by every executor.
    ca_file: str
    check_hostname: bool = True


class CassandraConfig(_Section):
    hosts: list[str] = Field(default_factory=lambda: ["127.0.0.1"], min_length=1)
    port: int = Field(default=9042, gt=0, lt=65536)
    keyspace: str = "mailbox"
    # The purger's own table in that keyspace (sinks.journal), created by `purger setup`.
    journal_table: str = "purger_journal"
    # The legal holds (`purger hold`), a table of the purger's own that the platform may write too.
    holds_table: str = "purger_holds"
    # The objects whose purge fails, each failure's retry backed off (stream.retry_cap), a table of its own.
    failures_table: str = "purger_failures"
    # What `purger restore` puts back (undo.window): each deleted row's image, each blob's copy, kept for the window.
    restorations_table: str = "purger_restorations"
    # Where an erasure finds a data subject's images in it: each image's partition by the names it is found by.
    restoration_names_table: str = "purger_restoration_names"
    # PasswordAuthenticator's login.
    username: str | None = None
    password: SecretStr | None = None
    # Client encryption: set to connect over TLS.
    tls: CassandraTls | None = None
    # The data centre whose nodes the purger talks to (the first contact point's when unset).
    local_data_centre: str | None = None
    # Reads and plain writes. The conditional deletes' check runs at serial_consistency: SERIAL, a majority
    # of all the replicas, sees a revival written through another data centre at the levels the writer
    # contract names (docs/policies.md); LOCAL_SERIAL, the local data centre's majority, only local ones.
    consistency: Literal["ONE", "LOCAL_ONE", "QUORUM", "LOCAL_QUORUM", "EACH_QUORUM", "ALL"] = "LOCAL_QUORUM"
    serial_consistency: Literal["SERIAL", "LOCAL_SERIAL"] = "SERIAL"


class S3Endpoint(_Section):
    endpoint: str = "http://127.0.0.1:9000"
    # "keys": access_key and secret_key below (the local stack's by default); "aws": the standard AWS
    # credential chain (AWS_* environment variables, ~/.aws, an instance or pod role), keys unused.
    credentials: Literal["keys", "aws"] = "keys"
    access_key: str = "purger"
    secret_key: SecretStr = SecretStr("purger-secret")
    region: str = "us-east-1"


class ObjectStoreConfig(S3Endpoint):
    bucket: str
    # A blob's purge in a bucket with versioning on (docs/operations.md, "Versioned buckets"): "delete" removes
    # every version of the key its delete left, its delete marker included; "lifecycle" leaves the delete
    # marker and the noncurrent versions to the bucket's lifecycle rule, which `purger setup` checks.
    noncurrent_versions: Literal["delete", "lifecycle"] = "delete"


# The suffix of a dry run's own names: its checkpoint, control and dead-letter topics, ledger and reports
# (``PurgerConfig.as_dry_run``), which a real purger's may not end in.
DRY_RUN_SUFFIX = ".dry-run"
# A URI naming only a bucket (or host), with no path in it: ``s3a://bucket``.
_ROOT_URI = re.compile(r"[A-Za-z][\w+.-]*://[^/]*")


def is_dry_run_name(name: str) -> bool:
    """Whether ``name`` (a topic, a path or a URI) is a dry run's own, as ``dry_run_name`` makes them."""
    return name.rstrip("/").endswith(DRY_RUN_SUFFIX)


def dry_run_name(name: str, key: str) -> str:
    """A dry run's own name for a real purger's topic, path or URI ``name`` (the setting ``key``): ``name`` and
    ``DRY_RUN_SUFFIX``, after any trailing ``/``, so that a path's is beside it and never inside it; a dry
    run's own name is its own. The one rule for all of a dry run's names.

    >>> dry_run_name("purger.control", "kafka.control_topic"), dry_run_name("s3a://b/ledger/", "ledger.path")
    ('purger.control.dry-run', 's3a://b/ledger.dry-run')
    """
    if is_dry_run_name(name):
        return name
    bare = name.rstrip("/")
    if _ROOT_URI.fullmatch(bare):  # `s3a://bucket.dry-run` would be another bucket
        raise ConfigError(f"{key}: {name} is a bucket's root, with nothing beside it for a dry run's own "
                          f"(<{key}>{DRY_RUN_SUFFIX}); name a folder in it, e.g. {bare}/ledger")
    return f"{bare}{DRY_RUN_SUFFIX}"


class StreamConfig(_Section):
    query_name: str = "purger"
    checkpoint: str = "checkpoints/purger"
    trigger_interval: Duration = timedelta(seconds=2)
    # How long after a deadline the purger waits for straggling events before acting on it. Events
    # are never dropped as late (streams/processor.py); a longer delay only purges later.
    watermark_delay: Duration = timedelta(seconds=2)
    # How often the clock ticks: at the wall clock once the query has read every event, at the Kafka time read
    # so far during a backlog (see streams/clock.py).
    # A tick is a few bytes: a short interval keeps the watermark within a second of the wall clock while the
    # purger reads events or a timer comes due.
    clock_interval: Duration = timedelta(seconds=1)
    # How often the clock ticks on a quiet stream (nothing read, no known timer due): each tick starts a batch
    # (about a core-second of work). A timer the clock does not know (beyond the earliest 1,000, kept across
    # restarts beside the checkpoint) fires at most this much late (streams/timers.py); the watermark may lag
    # the wall clock by this much.
    quiet_clock_interval: Duration = timedelta(minutes=1)
    # When to try again a purge that failed (a data centre's store or Cassandra did not answer): after
    # retry_interval, then twice as long at each failure in a row, to retry_cap; its error is recorded in the
    # ledger once a day (docs/operations.md, "Failures that go on").
    retry_interval: Duration = timedelta(minutes=1)
    retry_cap: Duration = timedelta(hours=1)
    # How long an object that never was a candidate and has nothing due (a late duplicate of one purged, a
    # feed record read after its object went) is kept after its last event; then it is forgotten and
    # counted (purger_forgotten_total). A live object forgotten so is found again by the next reconcile.
    forget_after: Duration = timedelta(days=30)
    shuffle_partitions: int = Field(default=2, gt=0)
    # A cap on deletions (double-checked purges of a message or a payload) per second, over all
    # partitions together: the share of the database's headroom the purger may take (docs/operations.md, "Throttling").
    max_deletions_per_second: float = Field(default=1000, gt=0)
    # Candidates purged at once by each task: a conditional delete is four round trips to the
    # replicas, so one at a time leaves Cassandra idle (BENCHMARKS.md).
    delete_concurrency: int = Field(default=16, gt=0, le=256)
    # Decide and record `would_delete` in the ledger, delete nothing. Uses its own checkpoint
    # (`<checkpoint>.dry-run`), so a later real run starts its decisions afresh, and its own control and
    # dead-letter topics, ledger and reports (``PurgerConfig.as_dry_run``), so that nothing it sends or
    # writes reaches a real purger.
    dry_run: bool = False
    master: str = "local[2]"
    driver_memory: str = "2g"
    # RocksDB's caches and write buffers for the state, one pool per executor (the driver in local
    # mode), outside the JVM's heap: size the process for driver_memory plus this (docs/sizing.md).
    state_memory_mb: int = Field(default=500, gt=0)

    @model_validator(mode="after")
    def _quiet_clock_not_faster(self) -> "StreamConfig":
        if self.quiet_clock_interval < self.clock_interval:
            raise ValueError(f"stream.quiet_clock_interval ({self.quiet_clock_interval.total_seconds():g}s) is "
                             f"shorter than stream.clock_interval ({self.clock_interval.total_seconds():g}s): make it "
                             "as long or longer")
        return self

    @property
    def checkpoint_location(self) -> str:
        return dry_run_name(self.checkpoint, "stream.checkpoint") if self.dry_run else self.checkpoint


class LedgerConfig(_Section):
    """The audit ledger and the daily purge report: Delta tables, local paths or ``s3a://bucket/path``."""

    path: str = "ledger/records"
    report_path: str = "ledger/daily_report"
    # One row per reconcile run, policy, table and data centre (docs/reconciliation.md).
    reconcile_path: str = "ledger/reconcile_report"
    # How often the running purger rewrites today's report from the ledger.
    report_interval: Duration = timedelta(minutes=1)
    # How long records are kept (an audit period): the running purger's daily upkeep deletes older days.
    retention: Duration = timedelta(days=400)
    # The S3 endpoint for s3a:// paths.
    s3: S3Endpoint = Field(default_factory=S3Endpoint)
    # No personal data in clear in the ledger: ids written as keyed hashes (HMAC-SHA256 under pseudonym_key) and
    # reasons as their category alone (purger.core.pseudonyms); `purger ledger find ID` finds an id's records.
    pseudonymise: bool = False
    # The hashes' key, a secret (or PURGER_LEDGER_PSEUDONYM_KEY). Lost or changed, the ids written under it can no
    # longer be found.
    pseudonym_key: SecretStr | None = None

    @model_validator(mode="after")
    def _key_when_pseudonymised(self) -> "LedgerConfig":
        if self.pseudonymise and not (self.pseudonym_key and self.pseudonym_key.get_secret_value()):
            raise ValueError("ledger.pseudonymise needs ledger.pseudonym_key (or PURGER_LEDGER_PSEUDONYM_KEY): a "
                             "secret of 32 random bytes or more, kept as long as the ledger")
        return self

    @field_validator("retention")
    @classmethod
    def _retention_is_days(cls, value: timedelta) -> timedelta:
        if value < timedelta(days=1):
            raise ValueError("at least 1d (the upkeep deletes whole days of records); "
                             "write e.g. '400d'")
        return value

    def as_dry_run(self) -> "LedgerConfig":
        """A dry run's: its own ledger, daily report and reconcile report, each ``<path>.dry-run``
        (``dry_run_name``), so that no Delta commit of a dry run meets a real purger's. The reconcile report
        needs no sharing: the schedule (``purger.reconcile.run.last_reconcile_finished_s``) counts only the runs
        of its own kind, real or dry (its ``dry_run`` column still tells them apart in a report written before
        dry runs had their own)."""
        return self.model_copy(update={key: dry_run_name(getattr(self, key), f"ledger.{key}")
                                       for key in ("path", "report_path", "reconcile_path")})


class ReconcileConfig(_Section):
    """``[reconcile]``: the store as a second source of candidates (docs/reconciliation.md)."""

    # How often the running purger reconciles; 0 turns the schedule off (`purger reconcile` still runs).
    interval: Duration = timedelta(days=1)
    # The scan's reads. LOCAL_QUORUM sees every acknowledged write of the local data centre.
    consistency: Literal["ONE", "LOCAL_ONE", "QUORUM", "LOCAL_QUORUM", "ALL"] = "LOCAL_QUORUM"
    # Rows read per second by all the scan's tasks together: the share of the cluster a scan may take.
    max_rows_per_second: float = Field(default=20_000, gt=0)
    # Rows per page of the scan's reads.
    page_size: int = Field(default=1000, gt=0, le=100_000)
    # Spark tasks of a scan per core: a micro-batch waits for a core at most one task's time (the scan's
    # pool gives each core it frees to the batches first), so a task's rows, the table's ÷ (cores x this),
    # should take seconds.
    tasks_per_core: int = Field(default=16, gt=0)
    # Token ranges per Spark task of a scan (more, smaller ranges even the tasks out).
    ranges_per_task: int = Field(default=4, gt=0)
    # A row its own events say has been due for longer than this, though the stream knows it, is fed back.
    overdue_after: Duration = timedelta(hours=1)
    # A blob in payloads/ with no payloads row is deleted only once older than this: an upload writes its
    # blob before its row.
    orphan_grace: Duration = timedelta(days=3)
    # Refuse an orphan_grace under 24 hours (set to false to allow one, e.g. in tests).
    orphan_grace_check: bool = True

    @model_validator(mode="after")
    def _grace_covers_an_upload(self) -> "ReconcileConfig":
        if self.orphan_grace_check and self.orphan_grace < timedelta(hours=24):
            raise ValueError("orphan_grace under 24h may delete a blob whose upload has not written its row "
                             "yet; raise it, or set orphan_grace_check = false if no upload takes that long")
        return self


class MetricsConfig(_Section):
    # The purger's own Prometheus endpoint on the driver (http://host:port/metrics); 0 turns it off.
    port: int = Field(default=9108, ge=0, lt=65536)
    # The address it listens on: the driver's loopback alone unless set, so that only that machine reads it.
    # A scraper on another host needs one of the driver's addresses, or "0.0.0.0" for every interface
    # (docs/operations.md, "Securing a running purger").
    host: str = Field(default="127.0.0.1", min_length=1)

    @property
    def url(self) -> str | None:
        """Where a client on the driver's machine reads the endpoint; None when it is off. An endpoint on every
        interface is read on the loopback."""
        if not self.port:
            return None
        host = _EVERY_INTERFACE.get(self.host, self.host)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"


# The wildcard addresses, each with the loopback address a client on the same machine connects to instead.
_EVERY_INTERFACE = {"0.0.0.0": "127.0.0.1", "::": "::1"}


def _default_stores() -> dict[str, ObjectStoreConfig]:
    return {dc: ObjectStoreConfig(bucket=dc) for dc in ("dc1", "dc2")}


class UndoConfig(_Section):
    """The undo window (docs/operations.md, "Undo"): before each delete, the row's image goes to the restorations
    table and the blob is copied aside in its own bucket, kept ``window`` long, so `purger restore` can put them back.
    Off by default: a deletion is then final."""

    # How long a deletion can be undone; None (the default): not at all.
    window: Duration | None = None
    # Where a blob's copy is kept in its own bucket: under this prefix, then its key.
    prefix: str = "purger-restore/"

    @field_validator("window")
    @classmethod
    def _window_is_whole_seconds(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < timedelta(seconds=1):
            raise ValueError("at least 1s, or leave it out to have no undo; write e.g. '7d'")
        return value

    @property
    def window_days(self) -> int | None:
        """The window in whole days, rounded up: the copies' day folders it keeps."""
        return None if self.window is None else -(-self.window // timedelta(days=1))

    @field_validator("prefix")
    @classmethod
    def _prefix_is_a_folder(cls, value: str) -> str:
        if not value.endswith("/") or value.startswith("/"):
            raise ValueError("a folder of the bucket: a name ending in '/', e.g. 'purger-restore/'")
        return value


class PurgerConfig(_Section):
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    cassandra: CassandraConfig = Field(default_factory=CassandraConfig)
    # One object store per data centre, keyed by the data-centre name used in events' `dcs`.
    stores: dict[str, ObjectStoreConfig] = Field(default_factory=_default_stores)
    # One section per policy, [policies.<name>], as written: each is validated by its policy's own
    # settings model when the file is loaded (``purger.config``), which builds ``policy_set`` from them.
    policies: dict[str, dict[str, Any]] = Field(default_factory=dict)
    stream: StreamConfig = Field(default_factory=StreamConfig)
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    reconcile: ReconcileConfig = Field(default_factory=ReconcileConfig)
    undo: UndoConfig = Field(default_factory=UndoConfig)
    # Set once by the loader: the enabled policies built from ``policies``.
    _policy_set: "PolicySet | None" = PrivateAttr(default=None)
    # Names this configuration, as loaded or copied, in an executor's cache of clients (``sinks.clients``).
    _key: str = PrivateAttr(default_factory=lambda: uuid.uuid4().hex)

    @property
    def key(self) -> str:
        """Names this configuration object and its copies made by pickling; a changed copy gets a new one."""
        return self._key

    @property
    def policy_set(self) -> "PolicySet":
        """The enabled policies, built once when the file was loaded (``purger.config.load_config``)."""
        if self._policy_set is None:
            raise ConfigError("this configuration's policies were not loaded: build it with "
                              "purger.config.load_config or build_config (or with_policies after a change)")
        return self._policy_set

    def with_policy_set(self, policies: "PolicySet") -> "PurgerConfig":
        """This configuration carrying ``policies`` (built from its ``policies`` sections by the loader)."""
        loaded = self.model_copy()
        loaded._policy_set = policies
        return loaded

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> "PurgerConfig":
        copy = super().model_copy(update=update, deep=deep)
        copy._key = uuid.uuid4().hex
        if update and "policies" in update:
            copy._policy_set = None  # built from the old sections: purger.config.with_policies rebuilds it
        return copy

    def as_dry_run(self) -> "PurgerConfig":
        """This configuration as a dry run's (SPEC 9.5: it shares nothing with a real purger that could change
        the real one's decisions): ``stream.dry_run`` set, hence its own checkpoint
        (``StreamConfig.checkpoint_location``); its own control topic, on which its clock ticks and the sink's
        reports go and which its query reads, and dead-letter topic (``KafkaConfig.as_dry_run``); its own
        ledger, daily report and reconcile report (``LedgerConfig.as_dry_run``). Each is the real one's name
        with ``.dry-run`` (``dry_run_name``); a dry run's configuration is its own dry run."""
        return self.model_copy(update={"stream": self.stream.model_copy(update={"dry_run": True}),
                                       "kafka": self.kafka.as_dry_run(), "ledger": self.ledger.as_dry_run()})

    def _named_apart(self) -> list[tuple[str, str, str]]:
        """The settings whose dry run's name is its own (``as_dry_run``): key, what it names, value."""
        return [("stream.checkpoint", "checkpoint", self.stream.checkpoint),
                ("kafka.control_topic", "control topic", self.kafka.control_topic),
                ("kafka.dead_letter_topic", "dead-letter topic", self.kafka.dead_letter_topic),
                ("ledger.path", "ledger", self.ledger.path),
                ("ledger.report_path", "daily report", self.ledger.report_path),
                ("ledger.reconcile_path", "reconcile report", self.ledger.reconcile_path)]

    @model_validator(mode="after")
    def _at_least_one_store(self) -> "PurgerConfig":
        if not self.stores:
            raise ValueError("stores: configure at least one data centre, e.g. [stores.dc1]")
        return self

    @model_validator(mode="after")
    def _a_real_purger_leaves_a_dry_runs_names_alone(self) -> "PurgerConfig":
        if not self.stream.dry_run:
            taken = [f"{key}: {name} ends in {DRY_RUN_SUFFIX}, as a dry run's {what} does; name a real purger's "
                     "otherwise" for key, what, name in self._named_apart() if is_dry_run_name(name)]
            if taken:
                raise ValueError("\n  ".join(taken))
        return self


class ConfigError(ValueError):
    """A configuration a user can fix: the message names the key and what it accepts."""


def _environment_overrides(raw: dict[str, Any]) -> dict[str, Any]:
    if bootstrap := os.environ.get("PURGER_KAFKA_BOOTSTRAP"):
        raw.setdefault("kafka", {})["bootstrap_servers"] = bootstrap
    for name, key in (("USERNAME", "username"), ("PASSWORD", "password")):
        if value := os.environ.get(f"PURGER_KAFKA_{name}"):
            raw.setdefault("kafka", {}).setdefault("security", {})[key] = value
        if value := os.environ.get(f"PURGER_CASSANDRA_{name}"):
            raw.setdefault("cassandra", {})[key] = value
    if hosts := os.environ.get("PURGER_CASSANDRA_HOSTS"):
        # host[:port][,host...]
        names = [h.strip() for h in hosts.split(",") if h.strip()]
        section = raw.setdefault("cassandra", {})
        section["hosts"] = [n.rsplit(":", 1)[0] for n in names]
        if ":" in names[0]:
            section["port"] = int(names[0].rsplit(":", 1)[1])
    if pseudonym_key := os.environ.get("PURGER_LEDGER_PSEUDONYM_KEY"):
        raw.setdefault("ledger", {})["pseudonym_key"] = pseudonym_key
    for name, key in (("ENDPOINT", "endpoint"), ("ACCESS_KEY", "access_key"), ("SECRET_KEY", "secret_key")):
        if value := os.environ.get(f"PURGER_S3_{name}"):
            for store in raw.setdefault("stores", {dc: {"bucket": dc} for dc in ("dc1", "dc2")}).values():
                store[key] = value
            if key != "endpoint":  # the ledger's endpoint is [ledger.s3]'s own; the keys are one login for both
                raw.setdefault("ledger", {}).setdefault("s3", {})[key] = value
    return raw


def _model_at(model: type[BaseModel], path: Sequence[str | int]) -> type[BaseModel] | None:
    """The settings model that holds the keys at ``path`` under ``model`` (through sections, optional
    sections, and tables of sections such as ``stores.<dc>``), or None where the keys are free."""
    current: Any = model
    for part in path:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        elif typing.get_origin(current) in (dict, list, tuple):
            current = typing.get_args(current)[-1 if typing.get_origin(current) is dict else 0]
        else:
            return None
        # An optional section (``CassandraTls | None``) or an annotated type: the model in it.
        while typing.get_origin(current) in (Union, types.UnionType, Annotated):
            args = typing.get_args(current)
            current = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), args[0])
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def closest_key(model: type[BaseModel], loc: Sequence[str | int]) -> str | None:
    """The valid key nearest to the unknown one at ``loc`` (a pydantic error's ``loc``: the path of keys,
    the unknown one last) among the keys of the model there, or None when none is near.

    >>> closest_key(PurgerConfig, ("stream", "trigger_intervl"))
    'trigger_interval'
    """
    if not loc:
        return None
    holder = _model_at(model, loc[:-1])
    if holder is None:
        return None
    keys = [field.alias or name for name, field in holder.model_fields.items()]
    found = difflib.get_close_matches(str(loc[-1]), keys, n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_key(model: type[BaseModel], loc: Sequence[str | int]) -> str:
    """The message for an unknown key: ``unknown key``, and the nearest valid one when there is one."""
    near = closest_key(model, loc)
    return f"unknown key; did you mean {near}?" if near else "unknown key"


def _explain(error: ValidationError) -> str:
    lines = []
    for problem in error.errors():
        key = ".".join(str(part) for part in problem["loc"]) or "(top level)"
        message = problem["msg"]
        if problem["type"] == "extra_forbidden":
            message = unknown_key(PurgerConfig, problem["loc"])
        elif problem["type"] == "literal_error":
            message = f"{message} (got {problem['input']!r})"
        lines.append(f"  {key}: {message}")
    return "invalid purger configuration:\n" + "\n".join(lines)


def parse_settings(raw: dict[str, Any] | None = None) -> PurgerConfig:
    """Validate the settings given as nested dictionaries (the shape of the TOML file), environment
    overrides applied; the policies' sections stay as written (``purger.config`` builds them).

    >>> parse_settings({"stream": {"trigger_interval": "5s"}}).stream.trigger_interval
    datetime.timedelta(seconds=5)
    """
    try:
        config = PurgerConfig.model_validate(_environment_overrides(dict(raw or {})))
    except ValidationError as error:
        raise ConfigError(_explain(error)) from None
    return config.as_dry_run() if config.stream.dry_run else config


def read_toml(path: str | Path) -> dict[str, Any]:
    """A configuration file's text as nested dictionaries; a missing or broken file is one line naming it."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path} does not exist") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"configuration file {path} is not valid TOML: {error}") from None

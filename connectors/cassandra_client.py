"""Sessions on the Cassandra nodes, built from the configuration, with errors that name the address; a read
at the serial consistency; a policy's handle on its tables (``CassandraTables``).

Example::

    from purger.config import load_config
    from purger.connectors import cassandra_session, read_serially
    config = load_config()
    session = cassandra_session(config.cassandra)
    read = read_serially(session, session.prepare("SELECT * FROM mailbox.messages WHERE message_id = ?"))
"""

from __future__ import annotations

import ssl
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeVar

from purger.connectors.errors import ServerUnavailable
from purger.core.settings import CassandraConfig, CassandraTls
from purger.core.handles import Consistency, Tables

if TYPE_CHECKING:
    from cassandra.cluster import Session
    from cassandra.query import Statement

    AnyStatement = TypeVar("AnyStatement", bound=Statement)


def cassandra_session(config: CassandraConfig, keyspace: str | None = None) -> "Session":
    """A session on ``config``'s nodes (login, TLS, local data centre and consistency levels as configured);
    ``ServerUnavailable``, one line naming the address and what to do, when it cannot connect."""
    from cassandra import ConsistencyLevel, InvalidRequest
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
    from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy, TokenAwarePolicy
    from cassandra.query import tuple_factory

    auth = None
    if config.username:
        auth = PlainTextAuthProvider(config.username, config.password.get_secret_value() if config.password else "")
    address = ", ".join(f"{h}:{config.port}" for h in config.hosts)
    default = ExecutionProfile(
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
    cluster = Cluster(
        config.hosts,
        port=config.port,
        auth_provider=auth,
        ssl_context=_tls_context(config.tls, address) if config.tls else None,
        # The default profile keeps the driver's rows, on which ``ResultSet.was_applied`` works (code given a
        # session writes with it); the purger's own statements (``CassandraTables``) take cheaper rows.
        execution_profiles={EXEC_PROFILE_DEFAULT: default, ROWS: _with_rows(default, named_rows),
                            APPLIED: _with_rows(default, tuple_factory)},
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


# The execution profiles of the purger's own statements, besides the driver's default: reads whose rows are the
# driver's named tuples with each statement's class made once (``named_rows``), and lightweight transactions
# answered as plain tuples, which ``was_applied`` reads as it reads the driver's.
ROWS, APPLIED = "purger-rows", "purger-applied"


def own_profile(session: "Session", name: str) -> str:
    """``name`` (``ROWS``, ``APPLIED``) where ``session`` has it; its default profile on a session made elsewhere
    (by hand, with the driver's defaults)."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT

    return name if name in session.cluster.profile_manager.profiles else EXEC_PROFILE_DEFAULT


def _with_rows(profile: Any, row_factory: Any) -> Any:
    """``profile`` with another row factory (its load balancing policy the same object)."""
    from copy import copy

    other = copy(profile)
    other.row_factory = row_factory
    return other


@lru_cache(maxsize=1024)
def _row_class(column_names: tuple[str, ...]) -> type:
    """The driver's own row class for these columns (its names cleaned as it cleans them), made once."""
    from cassandra.query import named_tuple_factory

    [row] = named_tuple_factory(list(column_names), [column_names])
    return type(row)


def named_rows(column_names: list[str], rows: list[tuple]) -> list[tuple]:
    """The driver's default rows (named tuples), but for the class: the driver's ``named_tuple_factory`` makes a
    new one for every response, on the one thread that reads them all (BENCHMARKS.md, "Bootstrap of 1,000,000
    at `72ceded`"); a statement's columns are the same in each of its responses."""
    row_class = _row_class(tuple(column_names))
    return [row_class(*row) for row in rows]


def read_serially(session: "Session", statement: "AnyStatement") -> "AnyStatement":
    """``statement``, a read, set to run at the session's serial consistency (cassandra.serial_consistency):
    it then sees the outcome of every lightweight transaction, including one not yet settled, in every
    data centre (SERIAL) or in the local one (LOCAL_SERIAL)."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT

    statement.consistency_level = session.get_execution_profile(EXEC_PROFILE_DEFAULT).serial_consistency_level
    return statement


class CassandraTables(Tables):
    """``Tables`` on a session: a policy's handle on its tables (``purger.core.handles.Tables``).

    Example::

        tables = CassandraTables(session, "mailbox", {"users": "users", "virtual_roots": "roots"})
        read = tables.prepare("SELECT state FROM {users} WHERE user_id = ?", "serial")
    """

    def __init__(self, session: "Session", keyspace: str, names: dict[str, str]) -> None:
        self.session = session
        self.qualified = {table: f"{keyspace}.{name}" for table, name in names.items()}
        self.rows, self.applied_rows = own_profile(session, ROWS), own_profile(session, APPLIED)

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
            return self.session.execute(statement, execution_profile=self.rows).one()
        return self.session.execute(statement, values, execution_profile=self.rows).one()

    def all(self, statement: Any, *values: Any) -> list[Any]:
        return list(self.session.execute(statement, values, execution_profile=self.rows))

    def applied(self, statement: Any, *values: Any) -> bool:
        return self.session.execute(statement, values, execution_profile=self.applied_rows).was_applied

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


def _reasons(error: Exception) -> str:
    """The driver's reason per host, without its ``Tried connecting to ...`` preamble."""
    per_host = getattr(error, "errors", None) or {}
    return "; ".join(f"{host}: {str(e).rsplit('Last error: ', 1)[-1]}" for host, e in per_host.items()) or str(error)

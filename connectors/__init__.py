"""Clients for the three servers, built from the configuration, with errors that name the address.

Example::

    from core.config import load_config
    from connectors import cassandra_session, s3_client
    config = load_config()
    session = cassandra_session(config.cassandra)
    s3 = s3_client(config.stores["dc1"])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.config import CassandraConfig, KafkaConfig, ObjectStoreConfig

if TYPE_CHECKING:
    from cassandra.cluster import Session
    from kafka import KafkaProducer


class ServerUnavailable(RuntimeError):
    """A server did not answer; the message names its address."""


def cassandra_session(config: CassandraConfig, keyspace: str | None = None) -> "Session":
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
    from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy

    auth = None
    if config.username:
        auth = PlainTextAuthProvider(config.username, config.password.get_secret_value() if config.password else "")
    cluster = Cluster(
        config.hosts,
        port=config.port,
        auth_provider=auth,
        execution_profiles={
            EXEC_PROFILE_DEFAULT: ExecutionProfile(load_balancing_policy=DCAwareRoundRobinPolicy(), request_timeout=30)
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
        address = ", ".join(f"{h}:{config.port}" for h in config.hosts)
        raise ServerUnavailable(f"Cassandra at {address} does not answer ({_reasons(error)})") from None


def s3_client(config: ObjectStoreConfig, attempts: int = 3, read_timeout_s: float = 30):  # -> botocore S3 client
    """``attempts`` and ``read_timeout_s`` bound how long a store that does not answer holds a call."""
    import boto3
    from botocore.config import Config

    keys = {}
    if config.credentials == "keys":
        keys = {"aws_access_key_id": config.access_key, "aws_secret_access_key": config.secret_key.get_secret_value()}
    return boto3.client(
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


def kafka_producer(config: KafkaConfig, **options) -> "KafkaProducer":
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    try:
        return KafkaProducer(bootstrap_servers=config.bootstrap_servers, **options)
    except KafkaTimeoutError:
        raise ServerUnavailable(f"Kafka at {config.bootstrap_servers} does not answer") from None


def _reasons(error: Exception) -> str:
    """The driver's reason per host, without its ``Tried connecting to ...`` preamble."""
    per_host = getattr(error, "errors", None) or {}
    return "; ".join(f"{host}: {str(e).rsplit('Last error: ', 1)[-1]}" for host, e in per_host.items()) or str(error)

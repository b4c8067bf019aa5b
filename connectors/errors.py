"""The error a client raises when its server does not answer or refuses it, its message one line that names
the address and what to do: a Cassandra session's (``cassandra_client``) and a Kafka client's
(``kafka_clients``, whose ``KafkaRefused`` is one), so that a caller reports either as it is.

Example::

    try:
        session = cassandra_session(config.cassandra)
    except ServerUnavailable as problem:
        print(problem)   # Cassandra at cassandra-1:9042 does not answer (...): check cassandra.hosts, ...
"""


class ServerUnavailable(RuntimeError):
    """A server did not answer; the message names its address."""

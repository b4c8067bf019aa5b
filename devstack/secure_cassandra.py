"""A Cassandra node that checks its clients: a login (PasswordAuthenticator) and TLS required.

It runs on 127.0.0.3 as a cluster of its own, beside the local stack, from
empty data each time. ``up`` makes a certificate authority and the node's
certificate with keytool, starts the node (the stack's ``Server`` and yaml,
see ``devstack.stack.CassandraNode``), and creates a login role for the
purger with a random password, allowed to read, write and create tables in
every keyspace. ``client()`` is the purger's ``[cassandra]`` section for it;
``client(superuser=True)`` logs in as the node's default superuser, for
creating keyspaces.

Example::

    from devstack.secure_cassandra import SecureCassandra
    node = SecureCassandra()
    node.up()
    node.host, node.port, node.ca_file, node.username   # and node.password: never print it
    session = cassandra_session(node.client())
    node.down()
"""

from __future__ import annotations

import secrets
from typing import Callable

from pydantic import SecretStr

from purger.core.settings import CassandraConfig, CassandraTls
from devstack import artifacts
from devstack.certificates import make_certificates
from devstack.stack import CASSANDRA_PORT, CassandraNode, LocalStack, cassandra_server

NAME = "cassandra-secure"
# Created by Cassandra at its first start with PasswordAuthenticator.
SUPERUSER, SUPERUSER_PASSWORD = "cassandra", "cassandra"


class SecureCassandra:
    """One node with PasswordAuthenticator and client encryption on ``host``. See the module docstring."""

    def __init__(self, host: str = "127.0.0.3", jmx_port: int = 7399, heap: str = "512m",
                 log: Callable[[str], None] = print) -> None:
        self.host, self.port = host, CASSANDRA_PORT
        self.username = "purger"
        self.password = secrets.token_urlsafe(16)
        self._keystore_password = secrets.token_urlsafe(16)
        home = artifacts.purger_home() / "stack" / NAME
        # Beside the node's home, which each start empties.
        self.tls_directory = home.with_name(f"{NAME}-tls")
        self.ca_file = self.tls_directory / "ca.pem"
        node = CassandraNode(host, "dc1", jmx_port=jmx_port, cluster_name="purger-secure", seed=host,
                             password_login=True, keystore=self.tls_directory / "node.p12",
                             keystore_password=self._keystore_password)
        self.server = cassandra_server(NAME, node, heap, self.client(superuser=True))
        self.stack = LocalStack([self.server], log)

    def client(self, superuser: bool = False, keyspace: str = "mailbox") -> CassandraConfig:
        """How the purger (or, with ``superuser``, an administrator) connects: login, TLS with the CA."""
        username, password = (SUPERUSER, SUPERUSER_PASSWORD) if superuser else (self.username, self.password)
        return CassandraConfig(hosts=[self.host], port=self.port, keyspace=keyspace, username=username,
                               password=SecretStr(password), tls=CassandraTls(ca_file=str(self.ca_file)))

    def up(self) -> None:
        """Make the certificates, start the node from empty data, create the purger's role."""
        from purger.connectors import cassandra_session

        make_certificates(self.tls_directory, self.host, self._keystore_password)
        self.stack.start_server(self.server)
        session = cassandra_session(self.client(superuser=True))
        try:
            session.execute(f"CREATE ROLE IF NOT EXISTS {self.username} WITH PASSWORD = %s AND LOGIN = true",
                            (self.password,))
            for permission in ("SELECT", "MODIFY", "CREATE"):
                session.execute(f"GRANT {permission} ON ALL KEYSPACES TO {self.username}")
        finally:
            session.cluster.shutdown()

    def down(self) -> None:
        """Stop the node by its recorded pid."""
        self.stack.down()

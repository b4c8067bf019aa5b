"""The purger on a Cassandra node that checks its clients (devstack.secure_cassandra): a login and TLS.

The purger's own session logs in over TLS and its conditional delete purges an expired message; a wrong
password and a plain connection to the TLS node are each one line from ``purger.setup.check`` that names
the address and what to do.
"""

from __future__ import annotations

import uuid

import pytest
from pydantic import SecretStr

from purger.connectors import cassandra_session
from purger.core.settings import PurgerConfig
from purger.core.vocabulary import PURGED
from devstack.certificates import make_certificates
from devstack.stack import create_schema
from purger.setup import check
from simulation.mailbox import Platform
from tests.support.configs import mailbox
from tests.support.mailbox import message_purge, purge_message
from tests.support.waits import ago

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secure_config(config, secure_cassandra_node) -> PurgerConfig:
    """The session's configuration on the secure node, as the purger's role; the keyspace made by the
    superuser, as a platform's administrator would."""
    create_schema(config.model_copy(update={"cassandra": secure_cassandra_node.client(superuser=True)}))
    return config.model_copy(update={"cassandra": secure_cassandra_node.client()})


def test_the_purgers_session_logs_in_over_tls_and_purges_an_expired_message(secure_config, secure_cassandra_node):
    cassandra = secure_config.cassandra
    session = cassandra_session(cassandra)
    platform = Platform(secure_config)
    administrator = cassandra_session(secure_cassandra_node.client(superuser=True))
    try:
        # The node says whom it is talking to, and how.
        clients = [row for row in administrator.execute("SELECT username, ssl_enabled FROM system_views.clients")
                   if row.username == secure_cassandra_node.username]
        assert clients and all(row.ssl_enabled for row in clients), clients
        settings = mailbox(secure_config)
        deleter, _ = message_purge(session, secure_config)
        m = f"secure-{uuid.uuid4().hex[:8]}"
        platform.enqueue(m, f"p-{m}", size=100, extract_count=1, at=ago(settings.expired_ttl))
        platform.dequeue(m, 0, at=ago(settings.expired_ttl))
        assert purge_message(deleter, m, "expired_by_counter", payload_id=f"p-{m}").status == PURGED
        assert platform.row(m) is None
    finally:
        platform.close()
        session.cluster.shutdown()
        administrator.cluster.shutdown()


def cassandra_problems(config: PurgerConfig) -> list[str]:
    return [line for line in check(config).problems if line.startswith("Cassandra")]


def test_a_wrong_password_is_one_line_naming_the_address_and_the_keys(secure_config, secure_cassandra_node):
    cassandra = secure_config.cassandra.model_copy(update={"password": SecretStr("not-the-password")})
    lines = cassandra_problems(secure_config.model_copy(update={"cassandra": cassandra}))
    assert lines == [f"Cassandra at {secure_cassandra_node.host}:{secure_cassandra_node.port} refused the login of 'purger': correct "
                     "cassandra.username and cassandra.password (or PURGER_CASSANDRA_USERNAME and "
                     "PURGER_CASSANDRA_PASSWORD)"]
    assert "not-the-password" not in lines[0] and secure_cassandra_node.password not in lines[0]


def test_a_plain_connection_to_the_tls_node_is_one_line_saying_to_set_tls(secure_config, secure_cassandra_node):
    cassandra = secure_config.cassandra.model_copy(update={"tls": None})
    lines = cassandra_problems(secure_config.model_copy(update={"cassandra": cassandra}))
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"Cassandra at {secure_cassandra_node.host}:{secure_cassandra_node.port} closed the connection")
    assert lines[0].endswith("if its nodes require TLS, set [cassandra.tls] with ca_file")


def test_a_certificate_from_another_authority_is_one_line_saying_which_ca_to_set(secure_config, secure_cassandra_node,
                                                                                  tmp_path):
    make_certificates(tmp_path, secure_cassandra_node.host, "another-authority")  # not the one that signed the node's
    tls = secure_config.cassandra.tls.model_copy(update={"ca_file": str(tmp_path / "ca.pem")})
    cassandra = secure_config.cassandra.model_copy(update={"tls": tls})
    lines = cassandra_problems(secure_config.model_copy(update={"cassandra": cassandra}))
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"Cassandra at {secure_cassandra_node.host}:{secure_cassandra_node.port} refused TLS")
    assert "set cassandra.tls.ca_file to the authority that signed the nodes' certificates" in lines[0]

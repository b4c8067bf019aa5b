"""Three Cassandra nodes in one data centre, two of which can be told to answer Paxos late: a lightweight
transaction that a minority accepted, for the writer contract's races (RELIABILITY.md).

The ring runs on 127.0.0.4-6 as a cluster of its own (``purger-paxos``), beside the local stack, from empty
data each time, Paxos v1 (Cassandra 5.0's default). Nodes 2 and 3 carry Byteman (a Java agent that rewrites
a method on load) with two rules, each in force while its flag file exists:

- ``late_accepts``: a proposal (``PaxosState.legacyPropose``) is answered after ``LATE_S`` seconds, and
  refused: the coordinator, which waits ``write_request_timeout`` (2 s), has only node 1's acceptance and
  fails the round with a timeout; the proposal stays accepted by node 1 alone, not committed;
- ``late_promises`` (node 3 only): a prepare (``PaxosState.legacyPrepare``) is answered after ``LATE_S``
  seconds: the next round's majority is nodes 1 and 2, so it meets node 1's accepted proposal and finishes
  it (``beginAndRepairPaxos``), as any round whose majority holds that node may.

Example::

    ring = PaxosRing()
    ring.up()
    session = cassandra_session(ring.client())
    ring.answer_late(accepts=True)
    session.execute(conditional_delete)          # a timeout: node 1 accepted it, nodes 2 and 3 did not
    ring.answer_late()
    ring.down()
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from purger.core.settings import CassandraConfig
from devstack import artifacts
from devstack.stack import CassandraNode, LocalStack, cassandra_server

BYTEMAN = artifacts.Bundle("byteman", ("org.jboss.byteman:byteman:4.0.25",))
ADDRESSES = ("127.0.0.4", "127.0.0.5", "127.0.0.6")
JMX_PORTS = (7499, 7599, 7699)
TOKENS = (-(2**62), 0, 2**62)
LATE_S = 4


def _rules(flags: Path, node: int) -> str:
    """The Byteman rules of node ``node`` (1-based), each in force while its flag file under ``flags`` exists."""
    accepts = f"""RULE a proposal answered late and refused, while {flags / 'late_accepts'} exists
CLASS org.apache.cassandra.service.paxos.PaxosState
METHOD legacyPropose
AT ENTRY
BIND flag:java.io.File = new java.io.File("{flags / 'late_accepts'}")
IF flag.exists()
DO delay({LATE_S * 1000}); return false
ENDRULE
"""
    promises = f"""RULE a promise answered late, while {flags / 'late_promises'} exists
CLASS org.apache.cassandra.service.paxos.PaxosState
METHOD legacyPrepare
AT ENTRY
BIND flag:java.io.File = new java.io.File("{flags / 'late_promises'}")
IF flag.exists()
DO delay({LATE_S * 1000})
ENDRULE
"""
    return {1: "", 2: accepts, 3: accepts + promises}[node]


class PaxosRing:
    """Three nodes, RF 3 for the keyspaces the tests make. See the module docstring."""

    def __init__(self, heap: str = "512m", log: Callable[[str], None] = print) -> None:
        self.home = artifacts.purger_home() / "stack" / "paxos-ring"
        self.flags = self.home / "flags"
        [agent] = artifacts.fetch(BYTEMAN)
        self.rules: dict[Path, str] = {}
        servers = []
        for number, (address, jmx_port, token) in enumerate(zip(ADDRESSES, JMX_PORTS, TOKENS), start=1):
            rules = self.home / f"node{number}.btm"
            options = (f"-javaagent:{agent}=script:{rules}",) if number > 1 else ()
            node = CassandraNode(address, "dc1", initial_token=token, jmx_port=jmx_port, cluster_name="purger-paxos",
                                 seed=ADDRESSES[0], jvm_options=options)
            servers.append(cassandra_server(f"cassandra-paxos-{number}", node, heap, self.client(address)))
            self.rules[rules] = _rules(self.flags, number)
        self.stack = LocalStack(servers, log)

    def client(self, address: str = ADDRESSES[0], keyspace: str = "mailbox") -> CassandraConfig:
        return CassandraConfig(hosts=[address], keyspace=keyspace, consistency="QUORUM")

    def up(self) -> None:
        """Write the rules, start the three nodes one after the other (each joins the ring before the next)."""
        self.flags.mkdir(parents=True, exist_ok=True)
        self.answer_late()  # no flag left by a run cut short
        for path, text in self.rules.items():
            path.write_text(text)
        for server in self.stack.processes.servers:
            self.stack.start_server(server)

    def down(self) -> None:
        """Stop the three nodes (and nothing of the local stack's)."""
        self.stack.processes.stop_all()

    def answer_late(self, accepts: bool = False, promises: bool = False) -> None:
        """Nodes 2 and 3 answer proposals late, and refuse them (``accepts``); node 3 answers prepares late
        (``promises``); each until told otherwise."""
        for name, on in (("late_accepts", accepts), ("late_promises", promises)):
            if on:
                (self.flags / name).touch()
            else:
                (self.flags / name).unlink(missing_ok=True)

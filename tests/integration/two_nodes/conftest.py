"""Cassandra's node 2 (data centre dc2 on 127.0.0.2), joined to the stack's node for this package's tests and
taken out after its last (``scope="package"``): its start and its decommission, about 35 s on 2 cores, once for
the modules that need two nodes, and the single-node tests never wait for it."""

import pytest

from devstack.stack import SECOND_NODE, LocalStack


@pytest.fixture(scope="package")
def second_node(servers, stack_stopped_at_end):
    """The local stack with node 2 joined. Decommissioned after the package if started here, so that the ranges it
    took go back to node 1; left to the stack's stop when the session stops the stack next (a new stack starts
    from empty data)."""
    if servers != "local":
        pytest.skip("a second Cassandra node needs the local stack")
    stack = LocalStack(log=lambda _: None)
    started_here = SECOND_NODE.pid() is None
    stack.add_second_node()
    yield stack
    if started_here and not stack_stopped_at_end:
        stack.remove_second_node()

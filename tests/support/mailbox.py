"""The mailbox platform's cases, shared by the sink, operations and fault tests."""

from __future__ import annotations

import json
import time
import uuid

from pyspark.sql import Row

from sinks.purge import purge_partition
from tests.support.configs import mailbox
from tests.support.waits import ago


def new_id(prefix="sink"):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def candidate(kind, object_id, rule, dcs=("dc1", "dc2"), payload_id=None):
    """A candidate row as the stateful stage emits it (``streams.processor.OUTPUT_SCHEMA``)."""
    hint = {"payload_id": payload_id, "inline": False, "dcs": list(dcs)}
    return Row(kind=kind, id=object_id, rule=rule, eligible_at_ms=int(time.time() * 1000), hint=json.dumps(hint),
               reason=None, key=None, value=None, topic=None, partition=None, offset=None)


def purge(config, *candidates):
    return [dict(zip(("policy", "kind", "id", "rule", "dc", "status", "reason"), o))
            for o in purge_partition(list(candidates), config, batch_id=0)]


def unreferenced_payload(platform, config, dcs=("dc1", "dc2")):
    """A payload whose only message is gone, linked long before the grace period."""
    m, p = new_id("msg"), new_id("pay")
    platform.enqueue(m, p, dcs=dcs, at=ago(mailbox(config).payload_grace))
    platform.session.execute(f"DELETE FROM {mailbox(config).payload_refs_table} WHERE payload_id = %s", (p,))
    return p

"""The mailbox platform's cases, shared by the sink, operations and fault tests."""

from __future__ import annotations

import json
import time
import uuid

from pyspark.sql import Row

from core.config import PurgerConfig
from simulation.mailbox import Platform
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


def deletable(platform: Platform, config: PurgerConfig, n: int, tag: str,
              sent: dict[str, bool] | None = None) -> list[str]:
    """``n`` messages deleted by the platform long enough ago, each with a payload in both data centres;
    noted in ``sent`` (message id -> row expected to stay) when given."""
    ids = [f"{tag}-{uuid.uuid4().hex[:6]}-{i}" for i in range(n)]
    for m in ids:
        platform.enqueue(m, f"p-{m}")
        platform.delete(m, at=ago(mailbox(config).deleted_ttl))
        if sent is not None:
            sent[m] = False
    platform.flush()
    return ids

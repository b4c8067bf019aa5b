"""kafka-python's writes with each record batch's checksum (CRC-32C) in C (the ``crc32c`` package) and in Python.

    python -m bench.kafka_write --messages 50000

The reconcile feed writes its records with kafka-python (``reconcile.run``), which checksums every record batch
it builds, in Python unless the ``crc32c`` package is installed; in a bootstrap's profile the Python checksum was
a quarter of the feed's worker. This sends the feed's records of ``--messages`` messages rows (each re-expressed
by the mailbox policy, JSON, keyed by message id) through the purger's producer as the feed makes it (acks=all,
linger 20 ms), to a topic of its own, once with each checksum, back to back, and prints the records a second of
each: the one in C beside the one in Python, its baseline.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any

import kafka.record.default_records as default_records
from kafka.record._crc32c import crc as crc32c_in_python
from kafka.record.util import calc_crc32c

from bench.common import BenchRun
from purger.connectors import TASK_RUNS_AGAIN, kafka_producer
from purger.policies.mailbox import message_events


def feed_records(messages: int) -> list[tuple[bytes, bytes]]:
    """The feed's records (key, value) for ``messages`` messages rows: enqueued 40 days ago, counter at zero."""
    created = datetime.now(timezone.utc) - timedelta(days=40)
    records = []
    for n in range(messages):
        row: dict[str, Any] = {
            "message_id": f"m-{n:09d}", "created_at": created, "mailbox": f"box-{n % 1000}",
            "payload_id": f"p-{n:09d}", "payload_size": 2048, "inline_payload": b"x", "complete": True,
            "extract_count": 0, "extract_until": None, "deleted": None, "updated_at": created + timedelta(hours=1),
        }
        for event in message_events(row):
            records.append((row["message_id"].encode(), json.dumps(event, separators=(",", ":")).encode()))
    return records


def write_rate(run: BenchRun, topic: str, records: list[tuple[bytes, bytes]]) -> float:
    """Records a second through a new producer as the feed's, from the first send to the flush's end."""
    producer = kafka_producer(run.config.kafka, acks="all", linger_ms=20)
    try:
        started = time.perf_counter()
        for key, value in records:
            producer.send(topic, key=key, value=value)
        producer.flush(TASK_RUNS_AGAIN)
        return len(records) / (time.perf_counter() - started)
    finally:
        producer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    args = parser.parse_args()
    run = BenchRun.start("kafka_write")
    if calc_crc32c.__defaults__[0] is crc32c_in_python:
        raise SystemExit("the crc32c package is not installed: pip install -e . installs it")
    records = feed_records(args.messages)
    topic = run.config.kafka.reconcile_topic
    write_rate(run, topic, records[:1000])  # connections and metadata, outside either measure
    in_c = write_rate(run, topic, records)
    default_records.calc_crc32c = partial(calc_crc32c, _crc32c=crc32c_in_python)
    try:
        in_python = write_rate(run, topic, records)
    finally:
        default_records.calc_crc32c = calc_crc32c
    run.record("kafka-python write, the checksum in Python", in_python, "records/s", records=len(records))
    run.record("kafka-python write, the checksum in C (crc32c)", in_c, "records/s", records=len(records),
               baseline=("kafka-python write, the checksum in Python", in_python))


if __name__ == "__main__":
    main()

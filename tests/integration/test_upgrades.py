"""Upgrades keep the checkpoint (docs/operations.md, "Upgrades"): what an upgrade may change, refused with one
line when the checkpoint cannot be continued (``streams.checkpoint``); a purger of the release before continued
by this one; a policy's state gaining a field continued through Spark's state schema evolution.

The oracle is the store and the ledger, not the purger's bookkeeping: the rows each release should have deleted
are gone, the live ones are there, and the ledger holds one ``purged`` record per deletion."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from purger.config import with_policies
from purger.core.policy_set import PolicySet
from purger.policies import load_policy
from purger.streams.checkpoint import (
    AVRO, ENCODING_CONF, UNSAFEROW, CheckpointRefused, Field, StoredState, check_continuable, current_fields, drift,
    refusals,
)
from tests.support import ROOT

# The release a running purger is upgraded from (CHANGELOG.md), by its tag.
RELEASE = "0.1.0"
# A policy of one's own (examples/push_clients) and its next release (tests/evolved), found as a user's would be
# on the driver; the executors get them with addPyFile too (as --py-files), in case the session started before.
HERE = ROOT / "examples" / "push_clients"
EVOLVED = ROOT / "tests" / "evolved"
for path in (HERE, EVOLVED):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
# And for the Python processes Spark's JVM starts on the driver (transformWithState's set-up runner imports the
# policies), before the session's JVM starts (pytest collects every module before the first fixture).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(HERE), str(EVOLVED), os.environ.get("PYTHONPATH"))))
SECTION = {"enabled": True, "module": "push_clients_policy", "inactive_after": "20s"}

CP = "/cp"
KEPT = {"last_connected_ms": "bigint", "timer_ms": "bigint", "recheck_rule": "string"}


def now_fields(**extra: Field) -> dict[str, Field]:
    return {name: Field(kind, True) for name, kind in KEPT.items()} | extra


# --- what a checkpoint can be continued with, as plain data -----------------------------------------------


def test_the_same_state_is_continued_in_either_encoding_and_a_new_kind_is_added():
    for encoding in (UNSAFEROW, AVRO):
        stored = StoredState(encoding, 2, {"push_client": KEPT})
        assert refusals(CP, stored, {"push_client": now_fields(), "message": now_fields()}) == []


def test_unsaferow_takes_no_change_of_a_states_fields():
    stored = StoredState(UNSAFEROW, 2, {"push_client": KEPT})
    [added] = refusals(CP, stored, {"push_client": now_fields(registered_ms=Field("bigint", True))})
    assert added == ("checkpoint /cp: kind 'push_client''s state changed (added registered_ms), and the checkpoint "
                     "keeps state in Spark's unsaferow encoding, which reads a state's fields by their position and "
                     "takes no change of them, their order included; run the release that started it, or replay "
                     "into a new checkpoint (purger replay --from earliest)")
    fewer = {name: f for name, f in now_fields().items() if name != "recheck_rule"}
    assert "(removed recheck_rule)" in refusals(CP, stored, {"push_client": fewer})[0]


def test_unsaferow_refuses_the_same_fields_in_another_order_naming_them_and_the_kept_order():
    stored = StoredState(UNSAFEROW, 2, {"push_client": KEPT})
    assert refusals(CP, stored, {"push_client": now_fields()}) == []  # the same fields, the same order
    reordered = {name: now_fields()[name] for name in ("timer_ms", "last_connected_ms", "recheck_rule")}
    [moved] = refusals(CP, stored, {"push_client": reordered})
    assert moved.startswith("checkpoint /cp: kind 'push_client''s state changed (moved timer_ms, last_connected_ms "
                            "(the checkpoint's order: last_connected_ms, timer_ms, recheck_rule)), and the checkpoint "
                            "keeps state in Spark's unsaferow encoding, which reads a state's fields by their position")
    assert moved.endswith("run the release that started it, or replay into a new checkpoint (purger replay --from "
                          "earliest)")


def test_avro_reads_fields_by_name_so_another_order_is_continued():
    stored = StoredState(AVRO, 2, {"push_client": KEPT})
    reordered = {name: now_fields()[name] for name in ("recheck_rule", "timer_ms", "last_connected_ms")}
    assert refusals(CP, stored, {"push_client": reordered}) == []


def test_avro_takes_added_fields_that_accept_none_removed_fields_and_widened_types():
    stored = StoredState(AVRO, 2, {"push_client": {**KEPT, "count": "int"}})
    evolved = {name: f for name, f in now_fields().items() if name != "recheck_rule"}
    evolved |= {"count": Field("bigint", True), "registered_ms": Field("bigint", True)}
    assert refusals(CP, stored, {"push_client": evolved}) == []


def test_avro_refuses_a_narrowed_or_retyped_field_and_an_added_field_that_cannot_be_none():
    stored = StoredState(AVRO, 2, {"push_client": KEPT})
    retyped = now_fields() | {"last_connected_ms": Field("string", True)}
    assert refusals(CP, stored, {"push_client": retyped})[0].startswith(
        "checkpoint /cp: kind 'push_client''s state changes the type of last_connected_ms bigint -> string")
    strict = refusals(CP, stored, {"push_client": now_fields(registered_ms=Field("bigint", False))})
    assert strict == ["checkpoint /cp: kind 'push_client''s state adds registered_ms, which the state kept before "
                      "reads as None; give each a type that accepts None (`| None`), or replay into a new "
                      "checkpoint (purger replay --from earliest)"]


def test_a_kind_kept_in_the_checkpoint_and_configured_nowhere_is_refused_and_a_partition_count_only_warned():
    stored = StoredState(AVRO, 2, {"push_client": KEPT, "message": KEPT})
    [refused] = refusals(CP, stored, {"message": now_fields()})
    assert refused.startswith("checkpoint /cp: it keeps the state of kind 'push_client', which no configured "
                              "policy has (its objects would never be purged)")
    assert drift(CP, stored, 2) == []
    assert drift(CP, stored, 8) == ["checkpoint /cp: its state has 2 partitions, which Spark keeps; "
                                    "stream.shuffle_partitions = 8 applies only to a new checkpoint"]


def test_the_stored_fields_say_which_accept_none():
    policy = load_policy("push_clients", {**SECTION, "module": "push_clients_v2"})
    fields = current_fields(PolicySet([policy], set()))["push_client"]
    assert fields["registered_ms"] == Field("bigint", True) and fields["timer_ms"] == Field("bigint", True)
    assert set(fields) == {"last_connected_ms", "registered_ms", "timer_ms", "recheck_rule", "recheck_at_ms",
                           "fired_rule", "fired_at_ms", "linger_until_ms"}


def test_the_release_upgraded_from_is_found_by_its_tag_or_by_the_commit_that_set_its_version():
    commit = release_commit(RELEASE)
    shown = subprocess.run(["git", "show", f"{commit}:purger/__init__.py"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout
    assert f'__version__ = "{RELEASE}"' in shown


# --- against the servers --------------------------------------------------------------------------------


def release_commit(version: str) -> str:
    """Release ``version``'s commit: its tag ``v<version>`` (README, "Releases"), or in a clone without tags the
    first commit that set ``__version__`` to it, as the release did."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    found = git("rev-parse", "--verify", "--quiet", f"v{version}^{{commit}}") or next(iter(
        git("log", "--reverse", "--format=%H", "-S", f'__version__ = "{version}"', "--", "purger/__init__.py")
        .splitlines()), "")
    assert found, f"neither a tag v{version} nor the commit that set it in {ROOT}: clone with history and tags"
    return found


def release_source(version: str, destination: Path) -> Path:
    """The files of release ``version`` (``release_commit``)."""
    destination.mkdir()
    archive = subprocess.run(["git", "archive", release_commit(version)], cwd=ROOT, check=True,
                             capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(destination)], input=archive.stdout, check=True)
    return destination


# Prints the settings (``section.key``) the configuration model on the path knows (-P: not the working tree's).
KNOWN_KEYS = """
import typing
from pydantic import BaseModel
try:  # a release whose settings' module was purger.core.config; tried first, since for a name the release lacks
    # the installation's own finder would hand it this checkout's module
    from purger.core.config import PurgerConfig
except ImportError:
    from purger.core.settings import PurgerConfig
def model(kind):
    return isinstance(kind, type) and issubclass(kind, BaseModel)
def keys(section, at=""):
    for name, field in section.model_fields.items():
        kind = field.annotation
        if model(kind):
            yield from keys(kind, f"{at}{name}.")
        elif typing.get_origin(kind) is dict and model(typing.get_args(kind)[1]):  # the stores: stores.*.<key>
            yield from keys(typing.get_args(kind)[1], f"{at}{name}.*.")
        else:
            yield at + name
print("\\n".join(keys(PurgerConfig)))
"""


def newer_keys(site: Path) -> frozenset[str]:
    """The settings this release has and the release installed at ``site`` does not (it refuses them as unknown
    keys): its configuration leaves them out, at their defaults."""
    def known(path: str | None) -> set[str]:
        environment = {**os.environ, "PYTHONPATH": path} if path else os.environ
        return set(subprocess.run([sys.executable, "-P", "-c", KNOWN_KEYS], env=environment, check=True,
                                  capture_output=True, text=True).stdout.split())

    return frozenset(known(None) - known(str(site)))


def committed_offsets(checkpoint: Path, topic: str) -> dict[str, int]:
    """The offsets of ``topic`` that the checkpoint's last committed batch read up to, by partition."""
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    for line in (checkpoint / "offsets" / str(last)).read_text().splitlines()[2:]:
        if topic in (source := json.loads(line)):
            return {partition: int(offset) for partition, offset in source[topic].items()}
    raise AssertionError(f"{topic} not in {checkpoint}'s offsets")


def end_offsets(config, topic: str) -> dict[str, int]:
    """The offsets of ``topic``'s next records, by partition."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=config.kafka.bootstrap_servers)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return {str(p.partition): offset for p, offset in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


def started_from(query, topic: str) -> dict[str, int]:
    """The offsets of ``topic`` that the query's first batch since its start read from, by partition."""
    for source in json.loads(query.recentProgress[0].json)["sources"]:
        start = source["startOffset"]
        start = json.loads(start) if isinstance(start, str) else start
        if start and topic in start:
            return {partition: int(offset) for partition, offset in start[topic].items()}
    raise AssertionError(f"{topic} not in the query's first progress")


@pytest.mark.integration
def test_a_purger_of_the_release_before_is_continued_from_its_checkpoint_to_an_undisturbed_runs_end_state(
        spark, config, tmp_path):
    """0.1.0 runs, purges what is due, holds the state of messages due later, and is stopped; this release
    continues from its checkpoint (Spark's unsaferow encoding, as 0.1.0 started it) without reading those
    events again, and purges them when due, and the messages written after the upgrade."""
    from purger.running import start_purger
    from simulation.mailbox import Platform
    from tests.support.configs import own_config, write_config
    from tests.support.mailbox import deletable, end_state
    from tests.support.waits import wait_for

    mailbox = {**config.policies.get("mailbox", {}), "deleted_ttl": "40s"}
    own = own_config(with_policies(config, {**config.policies, "mailbox": mailbox}), tmp_path, "upgrade")
    own = own.model_copy(update={"metrics": own.metrics.model_copy(update={"port": 0})})
    site = tmp_path / "release-site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                    str(release_source(RELEASE, tmp_path / "release"))],
                   check=True, capture_output=True, timeout=300)
    platform = Platform(own)
    live = [f"live-{uuid.uuid4().hex[:6]}-{i}" for i in range(2)]
    waiting = [f"waiting-{uuid.uuid4().hex[:6]}-{i}" for i in range(4)]
    for m in live:
        platform.enqueue(m, f"p-{m}", extract_count=1)
    before = deletable(platform, own, 4, "before")  # due at once
    platform.flush()

    log = tmp_path / "release.log"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH"))))}
    with open(log, "ab") as output:
        # From tmp_path: the working tree's purger/ must not shadow the release's (python -m puts the cwd first).
        release = subprocess.Popen([sys.executable, "-m", "purger.job", "--config",
                                    str(write_config(own, tmp_path / "purger.toml", leaving_out=newer_keys(site)))],
                                   cwd=tmp_path, env=environment, stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        wait_for(lambda: release.poll() is None and all(platform.row(m) is None and platform.payload_gone(f"p-{m}")
                                                        for m in before),
                 timeout_s=300, what=f"release {RELEASE} to purge what was due (log: {log})")
        # Deleted now, due 40 s later: read by the running release, whose state holds them when it stops (its
        # start took 50 s here: deleted before it, they were due before it stopped).
        for m in waiting:
            platform.enqueue(m, f"p-{m}")
            platform.delete(m)
        platform.flush()
        written = end_offsets(own, own.kafka.topics[0])
        wait_for(lambda: all(committed_offsets(Path(own.stream.checkpoint), own.kafka.topics[0]).get(partition, 0)
                             >= offset for partition, offset in written.items()),
                 timeout_s=30, what=f"release {RELEASE} to read the waiting messages' events (log: {log})")
        release.terminate()  # the driver alone: it stops the query between batches
        assert release.wait(timeout=180) == 0, log.read_text()[-3000:]
    finally:
        if release.poll() is None:
            os.killpg(release.pid, signal.SIGKILL)
    assert "stopped cleanly" in log.read_text(), log.read_text()[-3000:]
    assert all(platform.row(m) is not None for m in waiting), "due only after the upgrade"
    topic = own.kafka.topics[0]
    carried = committed_offsets(Path(own.stream.checkpoint), topic)

    after = deletable(platform, own, 3, "after")
    began = time.monotonic()
    assert check_continuable(spark, own) == []
    running = start_purger(spark, own)
    try:
        wait_for(lambda: all(platform.row(m) is None and platform.payload_gone(f"p-{m}") for m in waiting + after),
                 timeout_s=240, what="this release to purge the waiting messages and the new ones")
        print(f"continued and purged in {time.monotonic() - began:.1f} s")
        # The waiting messages' events were not read again: their deadlines came from the state 0.1.0 kept.
        assert started_from(running.query, topic) == carried
    finally:
        running.stop()

    wrongly_deleted, missing, doubled, unexpected = end_state(spark, platform, own, before + waiting + after, live)
    platform.close()
    # 0.1.0 recorded no payload_refs row (this release's ledger does): those of its deletions are not asked of it.
    missing = {m for m in missing if not (m[0] == "payload_refs" and json.loads(m[1])[1] in before)}
    assert (wrongly_deleted, missing, doubled, unexpected) == ([], set(), set(), set())


@pytest.mark.integration
def test_a_policys_state_gaining_a_field_is_continued_and_refused_from_an_unsaferow_checkpoint(
        spark, config, tmp_path):
    """``push_clients`` runs and keeps its clients' state (Avro, this release's default); its next release
    (``tests/evolved/push_clients_v2.py``) adds a field and continues from that checkpoint, purging the clients
    when due by the state kept before. A checkpoint started in Spark's unsaferow encoding is refused, in one line
    naming the kind and the field, before any query starts."""
    from push_clients_platform import PushClientsPlatform

    from purger.running import start_purger
    from purger.sinks.ledger import Ledger
    from tests.support.configs import own_config
    from tests.support.waits import wait_for

    spark.sparkContext.addPyFile(str(EVOLVED / "push_clients_v2.py"))
    spark.sparkContext.addPyFile(str(HERE / "push_clients_policy.py"))
    v1 = own_config(with_policies(config, {**config.policies, "push_clients": SECTION}), tmp_path, "evolve")
    v2 = with_policies(v1, {**v1.policies, "push_clients": {**SECTION, "module": "push_clients_v2"}})
    unsaferow = [v1.model_copy(update={"stream": v1.stream.model_copy(update={"checkpoint": str(tmp_path / "old")})})]
    unsaferow.append(with_policies(unsaferow[0], v2.policies))
    platform = PushClientsPlatform(v1.kafka, v1.cassandra, v1.kafka.topics[0])
    clients = [f"evolve-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    for client in clients:
        platform.connect(client, emit=True)
        platform.send_message(client, "m0", b"body")
    platform.flush()

    topic = v1.kafka.topics[0]

    def run_until_a_batch_with_input(cfg) -> dict[str, int]:
        running = start_purger(spark, cfg)
        try:
            wait_for(lambda: any(json.loads(p.json)["numInputRows"] for p in running.query.recentProgress),
                     timeout_s=120, what="a batch reading the clients' events")
        finally:
            running.stop()
        return committed_offsets(Path(cfg.stream.checkpoint), topic)

    carried = run_until_a_batch_with_input(v1)
    spark.conf.set(ENCODING_CONF, UNSAFEROW)
    try:
        run_until_a_batch_with_input(unsaferow[0])
    finally:
        spark.conf.set(ENCODING_CONF, AVRO)
    assert all(platform.router(c) is not None for c in clients), "due only after inactive_after"

    assert check_continuable(spark, unsaferow[0]) == []
    with pytest.raises(CheckpointRefused) as refused:
        check_continuable(spark, unsaferow[1])
    assert str(refused.value).splitlines() == [
        f"checkpoint {tmp_path / 'old'}: kind 'push_client''s state changed (added registered_ms), and the "
        "checkpoint keeps state in Spark's unsaferow encoding, which reads a state's fields by their position and "
        "takes no change of them, their order included; run the release that started it, or replay into a new "
        "checkpoint (purger replay --from earliest)"]

    assert check_continuable(spark, v2) == []
    running = start_purger(spark, v2)
    try:
        wait_for(lambda: all(platform.router(c) is None and platform.messages(c) == {} for c in clients),
                 timeout_s=180, what="the clients purged by the next release, from the state kept before")
        assert started_from(running.query, topic) == carried, "the events were not read again"
    finally:
        running.stop()
        platform.close()
    purged = sorted(r["id"] for r in Ledger(spark, v2.ledger).records().where("status = 'purged'").collect())
    assert purged == sorted([*clients, *(f"{c}/m0" for c in clients)])

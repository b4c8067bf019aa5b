"""What a checkpoint holds, and whether this release can continue from it (docs/operations.md, "Upgrades").

Spark keeps in a checkpoint what the query was first started with, and every later start must agree with it:
a disagreement shows as a Java stack trace at the first batch, once the query has started, or not at all (a
policy no longer configured: its objects' state stays in the checkpoint and is never purged). Before the
query starts, ``check_continuable`` reads what the checkpoint holds (its files with Hadoop's filesystem, and
the stateful operator's state through Spark's state data sources, which read without running the query) and
``refusals`` says, in one line each, what this release cannot continue from:

- a kind the checkpoint keeps state for that no configured policy has;
- a kind's state whose fields changed in a way the checkpoint's state encoding cannot take. Spark's
  ``unsaferow`` encoding (checkpoints started before 0.2.0) reads a state's fields by their position, so it
  takes no change at all, their order included; ``avro`` (the default since) resolves them by name, and takes
  fields added that accept None (the state kept before reads None there), fields removed, and a type widened
  as Avro resolves it (int to bigint, float to double); nothing else.

A new kind (a policy added) is a state variable Spark adds. ``stream.shuffle_partitions`` differing from the
checkpoint's is no refusal: Spark keeps the checkpoint's, and ``drift`` says so.

Example::

    check_continuable(spark, config)   # raises CheckpointRefused("checkpoint /cp: kind 'message' ...")
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from purger.core.policy_set import PolicySet

if TYPE_CHECKING:  # Spark loads when a checkpoint is read
    from pyspark.sql import SparkSession

    from purger.core.settings import PurgerConfig

ENCODING_CONF = "spark.sql.streaming.stateStore.encodingFormat"
# The encoding of a checkpoint whose offsets do not name one (Spark's default, and the purger's before 0.2.0).
UNSAFEROW, AVRO = "unsaferow", "avro"
PARTITIONS_CONF = "spark.sql.shuffle.partitions"
# Widenings Avro's schema resolution reads a value of the first type as the second.
WIDENED = {("int", "bigint"), ("float", "double")}


class CheckpointRefused(Exception):
    """A checkpoint this release cannot continue from: the lines that say why and what to do."""


@dataclass(frozen=True)
class Field:
    """A field of a kind's state as this release stores it: its Spark type, and whether it may read None."""

    type: str
    accepts_none: bool


@dataclass(frozen=True)
class StoredState:
    """What a checkpoint's stateful stage was last run with: the state encoding, the state partitions, and each
    kind's stored fields in their stored order (name -> Spark type, e.g. ``bigint``)."""

    encoding: str
    partitions: int
    kinds: dict[str, dict[str, str]]


def refusals(location: str, stored: StoredState, current: dict[str, dict[str, Field]]) -> list[str]:
    """Why this release cannot continue the checkpoint at ``location`` (empty: it can). ``current``: each
    configured kind's fields as this release stores them, in their order."""
    found = []
    redo = "or replay into a new checkpoint (purger replay --from earliest)"
    for kind in sorted(stored.kinds.keys() - current.keys()):
        found.append(f"checkpoint {location}: it keeps the state of kind {kind!r}, which no configured policy has "
                     f"(its objects would never be purged); enable the policy that has it again, {redo}")
    for kind in sorted(stored.kinds.keys() & current.keys()):
        before, now = stored.kinds[kind], current[kind]
        added = [name for name in now if name not in before]
        removed = [name for name in before if name not in now]
        retyped = [f"{name} {before[name]} -> {now[name].type}" for name in now
                   if name in before and before[name] != now[name].type]
        # unsaferow reads each field from its place: the fields both have, compared in their two orders.
        kept_before, kept_now = [name for name in before if name in now], [name for name in now if name in before]
        moved = [name for name, was in zip(kept_now, kept_before) if name != was]
        reordered = [f"{', '.join(moved)} (the checkpoint's order: {', '.join(before)})"] if moved else []
        changes = "; ".join(f"{what} {', '.join(names)}" for what, names in
                            (("added", added), ("removed", removed), ("retyped", retyped), ("moved", reordered))
                            if names)
        if not changes:
            continue
        if stored.encoding != AVRO:
            found.append(f"checkpoint {location}: kind {kind!r}'s state changed ({changes}), and the checkpoint "
                         f"keeps state in Spark's {stored.encoding} encoding, which reads a state's fields by their "
                         f"position and takes no change of them, their order included; run the release that "
                         f"started it, {redo}")
            continue
        narrowed = [f"{name} {before[name]} -> {now[name].type}" for name in now if name in before
                    and before[name] != now[name].type and (before[name], now[name].type) not in WIDENED]
        strict = [name for name in added if not now[name].accepts_none]
        if narrowed:
            found.append(f"checkpoint {location}: kind {kind!r}'s state changes the type of {', '.join(narrowed)}, "
                         f"which Avro cannot read the kept state as (only int -> bigint, float -> double); keep "
                         f"the type, {redo}")
        if strict:
            found.append(f"checkpoint {location}: kind {kind!r}'s state adds {', '.join(strict)}, which the state "
                         f"kept before reads as None; give each a type that accepts None (`| None`), {redo}")
    return found


def drift(location: str, stored: StoredState, shuffle_partitions: int) -> list[str]:
    """Settings the checkpoint overrides: warnings, not refusals."""
    if stored.partitions == shuffle_partitions:
        return []
    return [f"checkpoint {location}: its state has {stored.partitions} partitions, which Spark keeps; "
            f"stream.shuffle_partitions = {shuffle_partitions} applies only to a new checkpoint"]


def current_fields(policies: PolicySet) -> dict[str, dict[str, Field]]:
    """Each configured kind's state as the stateful stage stores it (``streams.processor.stored_kinds``)."""
    from purger.streams.processor import stored_kinds

    return {name: {f.name: Field(f.dataType.simpleString(), f.nullable and stored.accepts_none(f.name))
                   for f in stored.schema.fields}
            for name, stored in stored_kinds(policies).items()}


class CheckpointFiles:
    """A checkpoint's files, read with Hadoop's filesystem (a local path, s3a://, ...) and the session's Hadoop
    settings (where ``use_s3a`` puts the s3a endpoint)."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        self.spark, self.location = spark, location
        self.hadoop = spark._jvm.org.apache.hadoop.fs
        self.root = self.hadoop.Path(location)
        self.fs = self.root.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())

    def exists(self) -> bool:
        return self.fs.exists(self.root)

    def log(self, name: str) -> dict[int, Any]:
        """A log's files (``offsets``, ``commits``) by batch id (Spark also keeps .crc and temporary files there)."""
        directory = self.hadoop.Path(self.root, name)
        if not self.fs.exists(directory):
            return {}
        return {int(f.getPath().getName()): f for f in self.fs.listStatus(directory) if f.getPath().getName().isdigit()}

    def query_id(self) -> str:
        """The query's id, the same across its restarts (the checkpoint's ``metadata``)."""
        metadata = self.fs.getFileStatus(self.hadoop.Path(self.root, "metadata"))
        return json.loads(self.text(metadata))["id"]

    def text(self, file: Any) -> str:
        stream = self.fs.open(file.getPath())
        try:
            return self.spark._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()

    def read_text(self, name: str) -> str | None:
        """The text of the file ``name`` in the checkpoint's folder; None when there is none."""
        path = self.hadoop.Path(self.root, name)
        return self.text(self.fs.getFileStatus(path)) if self.fs.exists(path) else None

    def write_text(self, name: str, text: str) -> None:
        """Write (or replace) the file ``name`` in the checkpoint's folder."""
        stream = self.fs.create(self.hadoop.Path(self.root, name), True)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()


def stored_state(spark: SparkSession, location: str) -> StoredState | None:
    """What the checkpoint at ``location`` holds; None when there is nothing to continue (no checkpoint, or no
    batch committed in it yet: Spark runs the first batch again, into empty state)."""
    files = CheckpointFiles(spark, location)
    offsets = files.log("offsets") if files.exists() else {}
    if not offsets or not files.log("commits"):
        return None
    settings = json.loads(files.text(offsets[max(offsets)]).splitlines()[1]).get("conf", {})
    operators = [r for r in spark.read.format("state-metadata").load(location).collect()
                 if r.operatorName.startswith("transformWithState")]
    if not operators:
        return None
    [operator] = operators
    variables = [v["stateName"] for v in json.loads(operator.operatorProperties)["stateVariables"]
                 if v["stateVariableType"] == "ValueState"]
    kinds = {}
    for name in variables:
        value = spark.read.format("statestore").option("stateVarName", name).load(location).schema["value"]
        kinds[name] = {f.name: f.dataType.simpleString() for f in value.dataType.fields}
    return StoredState(settings.get(ENCODING_CONF, UNSAFEROW), int(settings.get(PARTITIONS_CONF, operator.numPartitions)),
                       kinds)


def reconcile_apart(spark: SparkSession, config: PurgerConfig) -> bool:
    """Whether the stream reads the reconcile topic as a Kafka source of its own (``streams.source.read_records``):
    yes, unless the checkpoint was started with it within the events' source (by 0.2.0 or earlier), which
    Spark keeps. A checkpoint's offsets have a line per source after their version and metadata: two then
    (the events' and the control topic's), three now."""
    files = CheckpointFiles(spark, config.stream.checkpoint_location)
    offsets = files.log("offsets") if files.exists() else {}
    return not offsets or len(files.text(offsets[max(offsets)]).splitlines()[2:]) != 2


def check_continuable(spark: SparkSession, config: PurgerConfig) -> list[str]:
    """Raise ``CheckpointRefused`` when this release cannot continue ``stream.checkpoint_location``; else the
    warnings of ``drift`` (nothing to say for a new checkpoint)."""
    location = config.stream.checkpoint_location
    stored = stored_state(spark, location)
    if stored is None:
        return []
    refused = refusals(location, stored, current_fields(config.policy_set))
    if refused:
        raise CheckpointRefused("\n".join(refused))
    return drift(location, stored, config.stream.shuffle_partitions)

"""State size and memory with millions of live objects, and the time to restart from their checkpoint.

    python -m bench.state_scale --objects 1000000
    python -m bench.state_scale --objects 10000000

The platform emits ``--objects`` live messages (one enqueue each, no rows or
blobs: the stateful stage never reads them; 70% of them with a stored payload,
which is an object of its own in the state). The stateful stage reads them into
its RocksDB state store from a fresh checkpoint, into Spark's noop sink, with
the process tree's resident memory sampled every second. Then:

- state rows and bytes per live object, from the query's state operator
  progress and from the checkpoint's state files on disk;
- peak resident memory of the driver JVM (executors included, local mode) and
  of the Python processes;
- a restart: a new process (``--resume``) creates its session and starts the
  same query on the checkpoint; the time from its launch to its first batch
  with new events done. Baseline: the same process's session start alone.
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

from bench.common import BenchRun, PeakMemory, read_to, ticking, topic_end_offsets
from purger.core.settings import PurgerConfig
from simulation.mailbox import Platform
from simulation.workload import LIVE_ONLY, Workload, play
from purger.streams.candidates import candidates_stream

QUERY = "state-scale"


def emit_live(run: BenchRun, objects: int, prefix: str) -> float:
    """Enqueue events of ``objects`` live messages; returns seconds taken."""
    platform = Platform(run.config, events_only=True)
    started = time.perf_counter()
    for plan in tqdm(Workload(mix=LIVE_ONLY).plans(prefix, objects), total=objects, desc="events", unit="msg",
                     mininterval=10):
        play(platform, plan)
    platform.close()
    return time.perf_counter() - started


def start_query(spark, config: PurgerConfig, checkpoint: Path):
    return (candidates_stream(spark, config).writeStream.queryName(QUERY).format("noop").outputMode("append")
            .option("checkpointLocation", str(checkpoint)).start())


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def resume(work: Path) -> None:
    """The restart, in a process of its own: session, query on the checkpoint, first batch with new events."""
    launched = float(sys.argv[sys.argv.index("--launched") + 1])
    config: PurgerConfig = pickle.loads((work / "config.pickle").read_bytes())
    run = BenchRun("state_scale", work.name, config, work)
    spark = run.spark()
    session_s = time.time() - launched
    ends = json.loads((work / "ends.json").read_text())
    query = start_query(spark, config, work / "checkpoint")
    try:
        with ticking(config):
            read_to(query, {(t, int(p)): o for t, p, o in ends})
    finally:
        query.stop()
    print(json.dumps({"session_s": session_s, "restart_s": time.time() - launched}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--resume", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.resume:
        resume(args.resume)
        return
    run = BenchRun.start("state_scale", kafka={"max_offsets_per_trigger": 500_000})
    config = run.config
    seconds = emit_live(run, args.objects, run.run)
    run.record("workload generator (events only)", args.objects / seconds, "events/s", objects=args.objects)

    spark = run.spark()
    query = start_query(spark, config, run.work / "checkpoint")
    try:
        with PeakMemory() as memory, ticking(config):
            load_s = read_to(query, topic_end_offsets(config))
        state = json.loads(query.lastProgress.json)["stateOperators"][0]
    finally:
        query.stop()
    rows = state["numRowsTotal"]
    on_disk = directory_bytes(run.work / "checkpoint" / "state")
    run.record("stateful stage, loading live objects", args.objects / load_s, "events/s", objects=args.objects)
    run.record("state rows", rows, "rows", objects=args.objects)
    run.record("state on disk per live object", on_disk / args.objects, "bytes", objects=args.objects,
               state_bytes_on_disk=on_disk, memory_used_bytes=state.get("memoryUsedBytes"),
               custom_metrics=state.get("customMetrics"))
    run.record("peak resident memory, driver JVM", memory.peak.get("java", 0), "MiB", objects=args.objects,
               driver_heap=config.stream.driver_memory)
    run.record("peak resident memory, Python processes", memory.peak.get("python", 0), "MiB",
               objects=args.objects)

    emit_live(run, 1_000, f"{run.run}-after")
    (run.work / "config.pickle").write_bytes(pickle.dumps(config))
    ends = topic_end_offsets(config)
    (run.work / "ends.json").write_text(json.dumps([[t, p, o] for (t, p), o in ends.items()]))
    launched = time.time()
    child = subprocess.run([sys.executable, "-m", "bench.state_scale", "--resume", str(run.work),
                            "--launched", str(launched)], capture_output=True, text=True, check=True)
    timings = json.loads(child.stdout.strip().splitlines()[-1])
    run.record("restart from the checkpoint (process launch to first batch done)", timings["restart_s"], "s",
               baseline=("session start alone", timings["session_s"]), target="< 60 s", objects=args.objects,
               state_rows=rows)


if __name__ == "__main__":
    main()

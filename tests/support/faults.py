"""Fault injection in front of a real server: a TCP proxy that can be cut and restored, or hold the server's
answers.

The server behind it is the real one; the proxy only decides whether bytes get
through, so a client sees exactly what it would see when a data centre's
endpoint goes away (connections refused mid-way or reset), or when a request
reaches the server and its answer is late (a timeout whose request applied).

Example::

    proxy = TcpProxy("127.0.0.1", 9000).start()   # proxy.port forwards to 9000
    proxy.cut()        # new and open connections fail
    proxy.restore()
    proxy.hold()       # requests still reach the server; its answers wait
    proxy.release()    # the answers held go, in order
"""

from __future__ import annotations

import json
import os
import random
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.broken = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._holding = False
        self._held: list[tuple[socket.socket, bytes]] = []  # the server's answers, in order, while holding

    def start(self) -> "TcpProxy":
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()
        return self

    def cut(self) -> None:
        with self._lock:
            self.broken.set()
            for sock in self._open:
                sock.close()
            self._open.clear()

    def restore(self) -> None:
        self.broken.clear()

    def hold(self) -> None:
        with self._lock:
            self._holding = True

    def release(self) -> None:
        with self._lock:
            self._holding = False
            held, self._held = self._held, []
            for sink, data in held:
                try:
                    sink.sendall(data)
                except OSError:
                    pass

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            if self.broken.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                # A cut that came while this connection was being made must close it too.
                if self.broken.is_set():
                    client.close()
                    server.close()
                    continue
                self._open.update((client, server))
            for source, sink, answers in ((client, server, False), (server, client, True)):
                threading.Thread(target=self._pipe, args=(source, sink, answers), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        try:
            while data := source.recv(65536):
                if answers:
                    with self._lock:
                        if self._holding:
                            self._held.append((sink, data))
                            continue
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.close()
                except OSError:
                    pass
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)


# --- a corpus of bad input --------------------------------------------------------------------

def bad_records(message_ids: list[str], n: int, seed: int = 11) -> list[tuple[str, bytes | None, bytes | None]]:
    """At least ``n`` malformed records, as (kind of fault, key, value), each about one of ``message_ids``
    where it names a message: truncated JSON, wrong types, huge values, unknown types, missing fields,
    impossible timestamps, bytes that are not UTF-8, empty values, tombstones and more."""
    rng = random.Random(seed)

    def event(m: str, **fields) -> dict:
        base = {"event_id": f"bad-{rng.randrange(10**9)}", "type": "delete",
                "event_time": "2020-01-01T00:00:00.000Z", "message_id": m}
        base.update(fields)
        return {k: v for k, v in base.items() if v is not _DROP}

    def js(value) -> bytes:
        return json.dumps(value).encode()

    enqueue = dict(type="enqueue", mailbox="inbox", payload_id="p", payload_size=10, inline=False,
                   complete=True, dcs=["dc1"], extract_count=0)
    makers = {
        "tombstone": lambda m: None,
        "empty value": lambda m: b"",
        "truncated JSON": lambda m: (lambda b: b[: rng.randrange(1, len(b) - 1)])(js(event(m, **enqueue))),
        "not UTF-8": lambda m: bytes(rng.randrange(128, 256) for _ in range(rng.randrange(1, 64))),
        "UTF-8 then garbage": lambda m: js(event(m))[:-1] + b"\xff}",
        "not an object": lambda m: js(rng.choice([[1, 2], "delete", 42, None, True])),
        "missing field": lambda m: js(event(m, **{rng.choice(["event_id", "type", "event_time", "message_id"]):
                                                 _DROP})),
        "unknown type": lambda m: js(event(m, type=rng.choice(["purge", "DELETE", "", "drop_table", "🙂"]))),
        "control type on the events topic": lambda m: js(event(m, type=rng.choice(["recheck", "clock",
                                                                                    "payload_released"]),
                                                             kind="message", rule="deleted", payload_id="p",
                                                             observed_at="2020-01-01T00:00:00.000Z")),
        "wrong type": lambda m: js(event(m, **rng.choice([
            dict(type="dequeue", extract_count="0"), dict(type="dequeue", extract_count=[0]),
            dict(type="extract_counter", extract_count={"n": 0}), dict(**{**enqueue, "dcs": "dc1"}),
            dict(**{**enqueue, "inline": "no"}), dict(**{**enqueue, "payload_size": "big"}),
            dict(message_id=12345), dict(event_time=1767225600000)]))),
        "huge value": lambda m: js(event(m, **rng.choice([
            dict(message_id=m + "x" * 100_000), dict(type="dequeue", extract_count=10**30),
            dict(**{**enqueue, "payload_size": 10**40}), dict(**{**enqueue, "mailbox": "m" * 200_000})]))),
        "negative count": lambda m: js(event(m, type="dequeue", extract_count=-rng.randrange(1, 10**6))),
        "impossible timestamp": lambda m: js(event(m, event_time=rng.choice([
            "2026-13-45T99:99:99.000Z", "yesterday", "", "2026-02-30T00:00:00.000Z", "0000-00-00T00:00:00Z",
            "2026-01-01 00:00:00", "1767225600"]))),
        "impossible extract_until": lambda m: js(event(m, type="extract_until", extract_until="soon")),
        "missing field of its type": lambda m: js(event(m, type="enqueue", mailbox="inbox")),
        "bad recheck kind": lambda m: js(event(m, type="recheck", kind="table", rule="deleted")),
    }
    records = []
    while len(records) < n:
        for kind, make in makers.items():
            m = rng.choice(message_ids)
            key = rng.choice([m.encode(), None, b"", b"\xff\xfe"])
            value = make(m)
            if key is None and value is None:
                key = b""  # a producer sends no record with neither
            records.append((kind, key, value))
    return records


_DROP = object()


@dataclass(frozen=True)
class FaultMatrix:
    """How much of each fault the suite injects. Bounded by default, which is what CI runs: every fault still
    injected on the real servers, fewer times, and of a matrix's cases (the kill test's failpoints) a share each
    run, in turn by the seed. ``PURGER_FAULTS=full`` (``make faults-full``) injects each in full, every case;
    ``PURGER_FAULT_ATTEMPTS``, ``PURGER_FAULT_RANDOM_KILLS``, ``PURGER_FAULT_OUTAGE_S`` and ``PURGER_FAULT_SEED``
    set one figure."""

    attempts: int  # per race in one data centre
    cross_dc_attempts: int  # per race across data centres, where the delete through the other rarely lands first
    random_kills: int  # the kill test's kills at a random moment, besides its failpoints
    executor_kills: int  # executors killed in the middle of a task on the cluster
    executor_kill_objects: int  # the messages those executors delete, paced so that each kill finds a task
    full: bool  # every case of each matrix: every failpoint of the kill test and of a reconcile
    outage_s: float  # how long a server stays down
    measured_races: bool  # the races whose outcome is measured, not asserted (a consistency level's risk)
    seed: int  # which cases a bounded run takes: by default the day's number, so that each day's runs take the next

    def cases(self, every: Sequence[T], bounded: Sequence[T], per_run: int) -> tuple[T, ...]:
        """A matrix's cases for this run: ``every`` one in full; bounded, ``per_run`` of ``bounded`` taken in turn
        by the seed, so that runs on successive days (or seeds) cover all of ``bounded``."""
        if self.full:
            return tuple(every)
        first = self.seed * per_run % len(bounded)
        return tuple((tuple(bounded) * 2)[first:first + per_run])


def fault_matrix(environ: dict[str, str] | os._Environ = os.environ) -> FaultMatrix:
    full = environ.get("PURGER_FAULTS", "") == "full"
    return FaultMatrix(
        attempts=(attempts := int(environ.get("PURGER_FAULT_ATTEMPTS", 20_000 if full else 400))),
        cross_dc_attempts=5 * attempts,
        random_kills=int(environ.get("PURGER_FAULT_RANDOM_KILLS", 10 if full else 1)),
        executor_kills=3 if full else 1,
        executor_kill_objects=150 if full else 50,
        full=full,
        outage_s=float(environ.get("PURGER_FAULT_OUTAGE_S", 30 if full else 10)),
        measured_races=full,
        seed=int(environ.get("PURGER_FAULT_SEED", date.today().toordinal())),
    )


FAULTS = fault_matrix()


FAILPOINT_SITE = Path(__file__).parent / "failpoint_site"


def killed_at(point: str, marker: Path) -> dict[str, str]:
    """The environment of a purger process that is killed the first time it, or a Python worker Spark starts for
    it, reaches the failpoint ``point``; ``marker`` is created then. ``failpoint_site/sitecustomize.py`` installs
    the hook (``purger.testing.install_from_environment``) at each of those processes' start."""
    path = os.pathsep.join(filter(None, (str(FAILPOINT_SITE), os.environ.get("PYTHONPATH"))))
    return {"PURGER_FAILPOINT": point, "PURGER_FAILPOINT_MARKER": str(marker), "PYTHONPATH": path}


def reliability(fault: str, **counts) -> None:
    """A fault test's counts as one ``RELIABILITY`` line (``pytest -s``), the figures RELIABILITY.md quotes."""
    print("RELIABILITY", fault, " ".join(f"{k}={v}" for k, v in counts.items()))


class Stopped(Exception):
    """The purger stopped at a failpoint (``stop_at``): on the driver, the job or sweep ends there."""


def stop_at(name: str):
    """A failpoint hook (``purger.core.failpoints.injected``) that raises ``Stopped`` at the failpoint ``name``."""

    def stop(reached: str) -> None:
        if reached == name:
            raise Stopped(reached)

    return stop

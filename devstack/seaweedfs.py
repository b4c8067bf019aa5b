"""An S3 server with versioning, for the tests of versioned buckets (docs/operations.md, "Versioned buckets"):
SeaweedFS (Apache-2.0) in its all-in-one mode, ``weed mini``, on 127.0.0.1:8333, its data under the stack's
home. The local stack's S3Proxy keeps no versions (its filesystem backend), so these tests need a store of
their own.

SeaweedFS is a Go program, built once from its module at a pinned version with the Go toolchain (``go build``,
about 5 minutes on 2 cores the first time; the binary is kept in ``~/.cache/purger/bin``). Its credentials come
from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``), never its command line.

Example::

    store = VersionedStore()
    store.up()                     # builds weed if needed, starts it, waits for S3 to answer
    store.endpoint()               # S3Endpoint(endpoint='http://127.0.0.1:8333', ...)
    store.down()
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from devstack import artifacts
from devstack.stack import Processes, Server, StackError, _port_open
from purger.core.settings import S3Endpoint

MODULE = "github.com/seaweedfs/seaweedfs"
VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
S3_PORT = 8333
# Every port `weed mini` would take, so that one taken by another program is named before it starts: its master,
# volume and filer (and each one's gRPC port, 10,000 above), S3 and its gRPC port.
PORTS = (9333, 19333, 9340, 19340, 8888, 18888, S3_PORT, S3_PORT + 10000)
ACCESS_KEY, SECRET_KEY = "purger", "purger-secret"


def go() -> str:
    """The Go toolchain's ``go``: on PATH, or where its installer puts it."""
    found = shutil.which("go") or next((str(p) for p in (Path("/usr/local/go/bin/go"),) if p.exists()), None)
    if found is None:
        raise StackError("SeaweedFS (the S3 server with versioning the tests of versioned buckets use) is built with "
                         "Go 1.26 or later, and go is not on PATH: install Go, then run the tests again")
    return found


def weed() -> Path:
    """The ``weed`` binary at ``VERSION``, built on first use. Its module replaces one of its dependencies, which
    ``go install module@version`` refuses, so it is built as the main module, in a copy of its source."""
    binary = artifacts.purger_home() / "bin" / f"weed-{VERSION}"
    if binary.exists():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    source = json.loads(_go("mod", "download", "-json", f"{MODULE}@{VERSION}"))["Dir"]
    with tempfile.TemporaryDirectory(dir=binary.parent) as work:
        copy = Path(work, "source")
        shutil.copytree(source, copy)
        for path in (copy, *copy.rglob("*")):
            path.chmod(path.stat().st_mode | stat.S_IWUSR)  # the module cache's copy is read-only
        _go("build", "-o", str(Path(work, "weed")), "./weed", cwd=copy)
        os.replace(Path(work, "weed"), binary)
    return binary


def _go(*arguments: str, cwd: Path | None = None) -> str:
    done = subprocess.run([go(), *arguments], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "CGO_ENABLED": "0"})
    if done.returncode != 0:
        raise StackError(f"go {' '.join(arguments)} (building SeaweedFS {VERSION}) failed:\n{done.stderr[-3000:]}")
    return done.stdout


class VersionedStore:
    """SeaweedFS started by pid and stopped by it, as the local stack's servers are (``devstack.stack``)."""

    def __init__(self, log: Callable[[str], None] = print) -> None:
        self.server = Server("seaweedfs", f"127.0.0.1:{S3_PORT}", None, "mini", "", lambda home: [], self._ready, 180)
        self.processes = Processes([self.server], log)
        self.log = log

    def endpoint(self) -> S3Endpoint:
        return S3Endpoint(endpoint=f"http://127.0.0.1:{S3_PORT}", access_key=ACCESS_KEY, secret_key=SECRET_KEY)

    def up(self) -> None:
        """Build ``weed`` if needed and start it from empty data; nothing when it runs already."""
        if pid := self.server.pid():
            self.log(f"seaweedfs: already running (pid {pid}) on {self.server.address}")
            return
        taken = [port for port in PORTS if _port_open(port)]
        if taken:
            raise StackError(f"seaweedfs: port {', '.join(map(str, taken))} of 127.0.0.1 is taken by a process this "
                             "stack did not start; stop it, then run the tests again")
        binary = weed()
        shutil.rmtree(self.server.home, ignore_errors=True)
        (self.server.home / "data").mkdir(parents=True)
        self.processes.launch(self.server, [
            str(binary), "mini", f"-dir={self.server.home / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
        ], env={**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY})

    def down(self) -> None:
        self.processes.stop(self.server)

    def _ready(self) -> None:
        from purger.connectors import s3_client

        s3_client(self.endpoint(), attempts=1, read_timeout_s=5).list_buckets()

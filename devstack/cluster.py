"""Beyond one machine: a local Spark standalone cluster, and the purge job submitted to it.

``SparkCluster`` starts a master and two workers with ``spark-class`` from the pyspark
install, bound to 127.0.0.1, small (1 core and 1g per worker, 256m daemon heaps), with
logs and work directories under the local stack's runtime directory. Like the stack
(``devstack.stack``, whose process handling it reuses) it records process ids, so ``down``
stops exactly what ``up`` started, the executors included.

``submit`` runs the job against that master with the line ``purger submit-line`` prints for it
(``purger.submit``): the connector jars with ``--jars``, the product's packages zipped and shipped
with ``--py-files``, so executors import the code the driver sent, and ``purger/job.py`` as the main
file, the same code path as ``purger run``.

Example::

    from devstack.cluster import SparkCluster, submit
    cluster = SparkCluster()
    cluster.up()                                   # idempotent, like the stack's
    submission = submit("purger.toml", log_file="submit.log")
    ...
    submission.stop()                              # as Ctrl-C stops `purger run`
    cluster.down()

    # or in the foreground, until Ctrl-C:
    exit_code = run_submission("purger.toml")
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from devstack import artifacts
from devstack.stack import Processes, Server, StackError, _port_open
from purger.output import human_duration
from purger.submit import main_file, spark_home

HOST = "127.0.0.1"
# Clear of the stack (Kafka 9092/9093, Cassandra 9042/7000/7199, S3Proxy 9000) and of the
# Spark UIs of local sessions (4040 and up); not Spark's own defaults (7077, 8080, 8081), so a
# standalone cluster started by hand elsewhere on the machine does not clash either.
MASTER_PORT = 7177
MASTER_WEBUI_PORT = 8180
WORKER_PORTS = (7178, 7179)
WORKER_WEBUI_PORTS = (8181, 8182)
MASTER_URL = f"spark://{HOST}:{MASTER_PORT}"
MASTER_WEBUI = f"http://{HOST}:{MASTER_WEBUI_PORT}"

WORKER_CORES = 1
WORKER_MEMORY = "1g"
DAEMON_MEMORY = "256m"  # SPARK_DAEMON_MEMORY: the master's and workers' own heaps
EXECUTOR_MEMORY = "512m"  # one executor per worker, within WORKER_MEMORY



class ClusterError(StackError):
    pass


def runtime_dir() -> Path:
    """The local stack's runtime directory; the daemons' homes are its spark-* subdirectories."""
    return artifacts.purger_home() / "stack"


def submit_dir() -> Path:
    return runtime_dir() / "spark-submit"


# The master's and workers' own logs: warnings, and the deploy messages that say where things run. The
# job's driver and executors log as `purger run` does (purger.logs).
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.deploy.name = org.apache.spark.deploy
logger.deploy.level = info
"""


def conf_dir() -> Path:
    """SPARK_CONF_DIR for the daemons and spark-submit: the daemons' log settings only (the job's driver
    and executors are given the purger's, ``submit_command``).

    Its own directory, so a spark-env.sh or spark-defaults.conf elsewhere cannot change them.
    """
    directory = runtime_dir() / "spark-conf"
    directory.mkdir(parents=True, exist_ok=True)
    properties = directory / "log4j2.properties"
    if not properties.exists() or properties.read_text() != _LOG4J2:
        properties.write_text(_LOG4J2)
    return directory


def _spark_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           # A gateway of the calling process's own Spark session must not leak into spark-submit.
           if k not in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "_PYSPARK_DRIVER_CONN_INFO_PATH")}
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_CONF_DIR=str(conf_dir()),
        SPARK_LOCAL_IP=HOST,
        # The Python of the driver and of the executors' workers: this interpreter, which has the
        # purger's dependencies (spark-submit also gets it as spark.pyspark.python).
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    env.update(extra)
    return env


def _get_json(url: str, timeout: float = 5) -> dict | list:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def master_state() -> dict:
    """The master's JSON: workers, active and completed applications."""
    return _get_json(f"{MASTER_WEBUI}/json")


def worker_state(index: int) -> dict:
    """A worker's JSON (0 or 1): its executors, with their application ids."""
    return _get_json(f"http://{HOST}:{WORKER_WEBUI_PORTS[index]}/json")


def executor_pids(app_id: str) -> list[int]:
    """The process ids of an application's executor JVMs on this machine."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):
            continue
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in args and app_id.encode() in args:
            found.append(int(cmdline.parent.name))
    return found


def alive_workers(state: dict | None = None) -> list[dict]:
    state = state if state is not None else master_state()
    return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]


# --- the daemons ---------------------------------------------------------------------------


def _master_args(home: Path) -> list[str]:
    return ["--host", HOST, "--port", str(MASTER_PORT), "--webui-port", str(MASTER_WEBUI_PORT)]


def _master_ready() -> None:
    state = master_state()
    if state.get("status") != "ALIVE":
        raise ClusterError(f"master status is {state.get('status')}")


def _worker(index: int) -> Server:
    port, webui = WORKER_PORTS[index], WORKER_WEBUI_PORTS[index]

    def args(home: Path) -> list[str]:
        return ["--host", HOST, "--port", str(port), "--webui-port", str(webui), "--cores", str(WORKER_CORES),
                "--memory", WORKER_MEMORY, "--work-dir", str(home / "work"), MASTER_URL]

    def ready() -> None:
        # Registered with the master, not only listening.
        if not any(w.get("port") == port for w in alive_workers()):
            raise ClusterError(f"worker {HOST}:{port} is not registered with the master at {MASTER_URL}")

    return Server(f"spark-worker-{index + 1}", f"{HOST}:{port}", None,  # type: ignore[arg-type]  # no jars to fetch
                  "org.apache.spark.deploy.worker.Worker", DAEMON_MEMORY, args, ready, 120)


# Server.configure here returns spark-class's program arguments; the daemons need no bundle:
# their classes are pyspark's own jars.
SERVERS = [
    Server("spark-master", f"{HOST}:{MASTER_PORT}", None,  # type: ignore[arg-type]
           "org.apache.spark.deploy.master.Master", DAEMON_MEMORY, _master_args, _master_ready, 120),
    _worker(0),
    _worker(1),
]
_PORTS = {
    "spark-master": (MASTER_PORT, MASTER_WEBUI_PORT),
    "spark-worker-1": (WORKER_PORTS[0], WORKER_WEBUI_PORTS[0]),
    "spark-worker-2": (WORKER_PORTS[1], WORKER_WEBUI_PORTS[1]),
}


class SparkCluster:
    """The master and two workers, as processes of their own (``devstack.stack.Processes``)."""

    def __init__(self, log: Callable[[str], None] = print) -> None:
        self.processes = Processes(SERVERS, log)
        self.log = log

    def up(self, timeout_s: float = 120) -> None:
        """Start the daemons that are not running; wait until the master has both workers ALIVE."""
        for server in self.processes.servers:
            self._start(server)
        deadline = time.monotonic() + timeout_s
        alive: list[dict] = []
        error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                alive = alive_workers()
                if len(alive) >= len(WORKER_PORTS):
                    self.log(f"spark cluster: master {MASTER_URL} (UI {MASTER_WEBUI}) with {len(alive)} workers")
                    return
            except OSError as e:  # the master's UI not answering yet
                error = e
            time.sleep(1)
        raise ClusterError(
            f"the Spark master at {MASTER_URL} lists {len(alive)} ALIVE workers of {len(WORKER_PORTS)} "
            f"after {human_duration(timeout_s)} (see {MASTER_WEBUI}/json{f'; last error: {error}' if error else ''}); "
            "logs: " + ", ".join(str(s.log_file) for s in self.processes.servers)
        )

    def _start(self, server: Server) -> None:
        # The stack's start, with spark-class as the command.
        if pid := server.pid():
            self.log(f"{server.name}: already running (pid {pid}) on {server.address}")
            return
        for port in _PORTS[server.name]:
            if _port_open(port):
                raise ClusterError(
                    f"{server.name}: {HOST}:{port} is taken by a process this cluster did not start; stop it "
                    "(`purger cluster down` stops only what `up` started)"
                )
        shutil.rmtree(server.home, ignore_errors=True)
        server.home.mkdir(parents=True)
        local = server.home / "local"  # a worker's executors' scratch space (shuffle, RocksDB copies)
        local.mkdir()
        command = [str(spark_home() / "bin" / "spark-class"), server.main_class, *server.configure(server.home)]
        # spark-class execs the JVM, so the pid is the daemon's; its executors share its process group.
        self.processes.launch(server, command, _spark_env(SPARK_DAEMON_MEMORY=server.heap, SPARK_LOCAL_DIRS=str(local)))

    def down(self) -> None:
        self.processes.stop_all()

    def running(self) -> bool:
        return self.processes.running()

    def status(self) -> dict[str, str]:
        result = self.processes.status()
        if self.processes.servers[0].pid():
            try:
                result["workers"] = f"{len(alive_workers())} ALIVE at {MASTER_URL}, UI {MASTER_WEBUI}"
            except OSError as error:
                result["workers"] = f"the master's UI at {MASTER_WEBUI} does not answer: {error}"
        return result


# --- submitting the job --------------------------------------------------------------------


def submit_command(config_path: str | Path | None = None, *, job_args: Sequence[str] = (),
                   ui_port: int | None = None) -> list[str]:
    """The product's spark-submit line (``purger submit-line``, ``purger.submit``) for this cluster: its master,
    one executor of a worker's size per worker, the driver on 127.0.0.1."""
    from purger.config import load_config
    from purger.submit import submit_command as product_line

    conf = {"spark.executor.cores": str(WORKER_CORES)}
    if ui_port is not None:
        conf["spark.ui.port"] = str(ui_port)
    return product_line(MASTER_URL, load_config(config_path), config_path, workdir=submit_dir(), job_args=job_args,
                        executor_memory=EXECUTOR_MEMORY, total_cores=len(WORKER_PORTS) * WORKER_CORES,
                        driver_host=HOST, conf=conf)


@dataclass
class Submission:
    """A running spark-submit of the purge job (client mode: the driver is a child of this process)."""

    process: subprocess.Popen
    command: list[str]
    log_file: Path | None

    def driver_pid(self) -> int | None:
        """The Python driver: the child that spark-submit's JVM started for the entry script."""
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) != self.process.pid:
                    continue
                cmdline = (stat.parent / "cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
            if str(main_file()).encode() in cmdline:
                return int(stat.parent.name)
        return None

    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        return self.process.wait(timeout)

    def log_tail(self, lines: int = 40) -> str:
        if self.log_file is None:
            return "(output went to the terminal)"
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def stop(self, timeout_s: float = 180) -> int:
        """Stop the job as docs/operations.md tells a user to: SIGTERM to spark-submit, whose JVM hands it to the
        Python driver (``purger.cli._set_on_jvm_signal``), which stops the query between micro-batches, as
        Ctrl-C stops `purger run`, and exits; spark-submit then ends the application. Escalates to SIGTERM,
        then SIGKILL, on the whole process group if that takes longer than ``timeout_s``. Returns
        spark-submit's exit code (0 after a clean stop)."""
        if self.process.poll() is not None:
            return self.process.returncode
        self.process.terminate()
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                return self.process.wait(grace)
            except subprocess.TimeoutExpired:
                continue
        return self.process.wait()


def submit(
    config_path: str | Path | None = None,
    *,
    log_file: str | Path | None = None,
    cwd: str | Path | None = None,
    command: Sequence[str] | None = None,
    **options,
) -> Submission:
    """Start spark-submit for the purge job in the background: ``command`` as it is (a line
    ``purger submit-line`` printed), else ``submit_command``'s, to which ``options`` go.

    Output goes to ``log_file`` (appended), or to this process's stdout and stderr. The driver runs
    in ``cwd`` (default: this process's), so relative paths in the configuration (the checkpoint,
    the ledger) mean what they mean to `purger run` started there. spark-submit gets a session of
    its own: a Ctrl-C at the terminal reaches only the caller, which decides (``Submission.stop``).
    """
    command = list(command) if command is not None else submit_command(config_path, **options)
    output = open(log_file, "ab") if log_file is not None else None
    try:
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT if output else None, stdin=subprocess.DEVNULL,
            cwd=cwd, env=_spark_env(), start_new_session=True,
        )
    finally:
        if output is not None:
            output.close()
    return Submission(process, command, Path(log_file) if log_file is not None else None)


def run_submission(config_path: str | Path | None = None, **options) -> int:
    """``purger submit``: submit to the local cluster and wait; Ctrl-C stops the job cleanly (a second
    Ctrl-C kills it). Returns spark-submit's exit code; ``options`` go to ``submit``."""
    if options.get("master", MASTER_URL) == MASTER_URL and not SparkCluster(log=lambda _: None).running():
        raise ClusterError(f"the Spark cluster is not running (no master at {MASTER_URL}); "
                           "start it with `purger cluster up`")
    submission = submit(config_path, **options)
    try:
        return submission.wait()
    except KeyboardInterrupt:
        print("stopping the job (Ctrl-C again kills it)", file=sys.stderr)
        try:
            return submission.stop()
        except KeyboardInterrupt:
            os.killpg(submission.process.pid, signal.SIGKILL)
            return submission.wait()

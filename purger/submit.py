"""The purge job on a Spark cluster, the Spark way: the spark-submit line for a master, and what it ships.

``purger submit-line --master spark://host:7077 --config purger.toml`` prints the line that the tests submit
to a standalone cluster (docs/operations.md, "On a cluster"):

- the connector jars with ``--jars``, fetched with Maven into the local cache (``purger.artifacts``);
- the product's packages (``product_packages``) as a zip with ``--py-files`` (``package_zip``), for the
  executors;
- this module's ``purger/job.py`` as the main file (``purger run`` with the same options), from this
  installation, as the driver needs the purger installed anyway to read the configuration;
- the settings a submitted job needs: the Python of the driver and of the executors (this interpreter, with
  the purger's dependencies), the driver's memory (``stream.driver_memory``), the purger's log settings
  (``purger.logs.log4j2_options``), no console progress bar.

A SIGTERM to spark-submit stops the job cleanly (``purger.cli._set_on_jvm_signal``).

Example::

    command = submit_command("spark://10.0.0.5:7077", load_config("purger.toml"), "purger.toml",
                             workdir=Path("purger-submit"))
    subprocess.run(command)
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
import zipfile
from importlib.machinery import PathFinder
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from purger.logs import log4j2_options

if TYPE_CHECKING:
    from purger.core.settings import PurgerConfig

PACKAGES_ZIP = "purger-packages.zip"


def product_packages() -> tuple[str, ...]:
    """Every package of the product as this installation imports it: ``purger`` and the packages under it, in
    the order found. pyproject.toml's list is the one written: a wheel puts them all in ``purger/``; a clone's
    editable installation maps the repository's folders beside ``purger/`` under it (``purger.core`` is
    ``core/``), where the import system finds them but a listing of ``purger/`` does not, so each folder
    beside it is asked for too, and counts where ``purger.<folder>`` imports as a package. Imported from the
    ``--py-files`` zip, the zip holds them all in ``purger/``, as a wheel does. Nothing is imported but
    ``purger``: a package's own imports (pydantic, pyspark) are not needed to find it."""
    top = importlib.util.find_spec("purger")
    folder = Path(top.origin).parent.parent
    beside = sorted(path.name for path in folder.iterdir()
                    if (path / "__init__.py").is_file()) if folder.is_dir() else []
    found = [("purger", top.submodule_search_locations)]
    known = {"purger"}
    for package, locations in found:  # grows as it goes: each package found is searched in turn
        specs = [PathFinder.find_spec(info.name, locations)
                 for info in pkgutil.iter_modules(locations, f"{package}.") if info.ispkg]
        if package == "purger":
            specs += [importlib.util.find_spec(f"purger.{name}") for name in beside]
        for spec in sorted((spec for spec in specs if spec is not None), key=lambda spec: spec.name):
            if spec.submodule_search_locations is not None and spec.name not in known:  # a package, not a module
                found.append((spec.name, spec.submodule_search_locations))
                known.add(spec.name)
    return tuple(name for name, _ in found)


def package_zip(target: Path) -> Path:
    """The product's packages (``product_packages``) zipped for ``--py-files``, from where they are imported,
    each under its installed name (``purger.core`` is ``core/`` in a clone), with their data files
    (``fairscheduler.xml``, ...)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in product_packages():
            package = Path(importlib.import_module(name).__file__).parent
            for path in sorted(package.glob("*")):
                if path.is_file() and path.suffix not in (".pyc", ".pyo"):
                    archive.write(path, Path(*name.split(".")) / path.name)
    partial.replace(target)  # a submission running meanwhile keeps the file it opened
    return target


def spark_home() -> Path:
    """The installed pyspark's directory, a Spark distribution: bin/spark-submit, bin/spark-class and jars/."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def main_file() -> Path:
    """spark-submit's main file: ``purger/job.py`` of this installation (found, not imported: the job runs the
    command line, which imports this module)."""
    return (Path(__file__).parent / "job.py").resolve()


def submit_command(master: str, config: PurgerConfig, config_path: str | Path | None, *, workdir: Path,
                   job_args: Sequence[str] = (), executor_memory: str = "1g", total_cores: int | None = None,
                   driver_host: str | None = None, conf: dict[str, str] | None = None) -> list[str]:
    """The spark-submit command line of the purge job on ``master``; writes the zip it ships into ``workdir``.
    ``config`` is what ``config_path`` holds (read by the caller, so that a mistake in it is reported before
    anything is fetched or started). ``job_args`` go to ``purger run`` after ``--config`` (e.g.
    ``["--dry-run"]``); without a configuration file, the job runs with the defaults, as `purger run` does."""
    from purger.artifacts import spark_connector_jars

    settings = {
        # This interpreter for the driver and the executors' Python workers: it has the purger's dependencies
        # (cassandra-driver, boto3, kafka-python, pyarrow...); the executors import the code from the zip.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        # A progress bar per micro-batch would fill the log; the Spark UI shows the query's progress.
        "spark.ui.showConsoleProgress": "false",
        # The purger's log settings for the driver and the executors (no line per key or per batch).
        **log4j2_options(),
    }
    if driver_host is not None:  # the address the executors reach the driver at
        settings |= {"spark.driver.host": driver_host, "spark.driver.bindAddress": driver_host}
    if total_cores is not None:
        settings["spark.cores.max"] = str(total_cores)
    settings |= conf or {}
    command = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master", master,
        "--deploy-mode", "client",
        "--name", "purger",
        "--driver-memory", config.stream.driver_memory,
        "--executor-memory", executor_memory,
        "--jars", ",".join(str(jar) for jar in spark_connector_jars()),
        "--py-files", str(package_zip(workdir / PACKAGES_ZIP)),
    ]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    command.append(str(main_file()))
    if config_path is not None:
        command += ["--config", str(Path(config_path).resolve())]
    return [*command, *job_args]

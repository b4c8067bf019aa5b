"""What a submitted purge job ships and what it refuses (``purger.submit``, ``purger.spark``): the ``--py-files``
zip holds every module and data file of the product, pyproject.toml's packages, and each module imports from it
(as an executor's Python worker does); a Spark application with speculative execution on is refused, by the
decision on its settings and by `purger run` itself.

The submitted job itself, on a standalone cluster, is tests/integration/test_cluster.py's.
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from pyspark import SparkConf

from purger.spark import SPECULATION, speculation_refusal
from purger.submit import package_zip
from tests.support.configs import write_config
from tests.support import ROOT

SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def package_folder(package: str) -> Path:
    """The clone's folder of one of pyproject.toml's packages, as setuptools maps it: its own ``package-dir``
    entry, else its name's last part under its parent's folder."""
    mapped = SETUPTOOLS["package-dir"]
    if package in mapped:
        return ROOT / mapped[package]
    parent, _, last = package.rpartition(".")
    return package_folder(parent) / last


def installed_files() -> set[str]:
    """The files pyproject.toml installs, under their installed names: each package's modules and the data
    files its ``package-data`` patterns match."""
    names = set()
    for package in SETUPTOOLS["packages"]:
        patterns = ["*.py", *SETUPTOOLS["package-data"].get(package, [])]
        names |= {f"{package.replace('.', '/')}/{path.name}" for path in package_folder(package).iterdir()
                  if path.is_file() and any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns)}
    return names


def test_the_zip_holds_every_module_and_data_file_the_product_installs(tmp_path):
    archive = package_zip(tmp_path / "submit" / "purger-packages.zip")
    names = set(zipfile.ZipFile(archive).namelist())
    expected = installed_files()
    assert {"purger/reconcile/__init__.py", "purger/reconcile/orphans.py", "purger/reconcile/run.py",
            "purger/policies/mailbox/deletes.py", "purger/fairscheduler.xml", "purger/log4j2.properties"} <= expected
    assert expected - names == set(), f"not in the --py-files zip: {sorted(expected - names)}"
    packages_in_zip = {name.removesuffix("/__init__.py").replace("/", ".") for name in names
                       if name.endswith("/__init__.py")}
    assert packages_in_zip == set(SETUPTOOLS["packages"])
    assert [path.name for path in archive.parent.iterdir()] == [archive.name]  # no partial file left


# Run by an interpreter that has the zip alone on its path (no site-packages: no editable installation, no
# dependency): the product's packages as found from the zip, and the modules imported, from where.
_FROM_THE_ZIP = '''
import json, sys
sys.path.insert(0, {zip!r})
from purger.submit import product_packages
found = product_packages()
imported = {{name: module.__file__ for name, module in sys.modules.items() if name.startswith("purger")}}
print(json.dumps({{"packages": found, "imported": imported}}))
'''


def test_an_interpreter_with_the_zip_alone_finds_every_package_of_the_product(tmp_path):
    archive = package_zip(tmp_path / "purger-packages.zip")
    run = subprocess.run([sys.executable, "-I", "-S", "-c", _FROM_THE_ZIP.format(zip=str(archive))], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert sorted(found["packages"]) == sorted(SETUPTOOLS["packages"])
    assert found["imported"] == {name: f"{archive}/{name.replace('.', '/')}{suffix}" for name, suffix in
                                 [("purger", "/__init__.py"), ("purger.submit", ".py"), ("purger.logs", ".py")]}


# Run by an interpreter with the dependencies but the zip first on its path, as an executor's Python worker:
# every module of the product in the zip imported, and those imported from elsewhere.
_EVERY_MODULE_FROM_THE_ZIP = '''
import importlib, json, sys, zipfile
sys.path.insert(0, {zip!r})
modules = [name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
           for name in zipfile.ZipFile({zip!r}).namelist() if name.endswith(".py")]
for module in modules:
    if not module.endswith(".__main__"):  # a command, run rather than imported
        importlib.import_module(module)
elsewhere = {{name: module.__file__ for name, module in sys.modules.items()
             if name.partition(".")[0] == "purger" and not module.__file__.startswith({zip!r} + "/")}}
print(json.dumps({{"modules": modules, "elsewhere": elsewhere}}))
'''


def test_every_module_of_the_product_imports_from_the_zip(tmp_path):
    archive = package_zip(tmp_path / "purger-packages.zip")
    run = subprocess.run([sys.executable, "-I", "-c", _EVERY_MODULE_FROM_THE_ZIP.format(zip=str(archive))],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert {"purger.reconcile.run", "purger.reconcile.orphans", "purger.sinks.purge"} <= set(found["modules"])
    assert found["elsewhere"] == {}


def test_speculative_execution_is_refused_naming_the_key_and_what_to_do():
    refusal = speculation_refusal(SparkConf(loadDefaults=False).set(SPECULATION, "true"))
    assert refusal is not None and "\n" not in refusal
    assert refusal.startswith("spark.speculation is true") and "set spark.speculation=false" in refusal
    assert speculation_refusal(SparkConf(loadDefaults=False).set(SPECULATION, " TRUE ")) == refusal


def test_speculative_execution_off_or_unset_is_accepted():
    assert speculation_refusal(SparkConf(loadDefaults=False)) is None
    assert speculation_refusal(SparkConf(loadDefaults=False).set(SPECULATION, "false")) is None


def test_the_test_sessions_application_is_accepted_and_the_same_conf_with_speculation_refused(spark):
    conf = spark.sparkContext.getConf()  # a copy: setting it changes nothing of the running application
    assert speculation_refusal(conf) is None
    assert speculation_refusal(conf.set(SPECULATION, "true")) is not None
    assert spark.sparkContext.getConf().get(SPECULATION, "false") == "false"


def test_a_purger_run_in_an_application_with_speculation_on_exits_2_in_one_line(config, tmp_path):
    """`python -m purger.job` (spark-submit's main file, `purger run`), its JVM given ``spark.speculation=true`` as
    a cluster's defaults would: refused once the session is there, before any query starts."""
    config_file = write_config(config, tmp_path / "purger.toml")
    environment = {**os.environ, "PYSPARK_SUBMIT_ARGS": f"--conf {SPECULATION}=true pyspark-shell"}
    run = subprocess.run([sys.executable, "-m", "purger.job", "--config", str(config_file)], cwd=ROOT,
                         env=environment, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stdout + run.stderr
    refusal = speculation_refusal(SparkConf(loadDefaults=False).set(SPECULATION, "true"))
    assert refusal in run.stderr.splitlines(), run.stderr[-3000:]
    assert "purger running" not in run.stdout

"""Releases (README "Releases"): the version written once, `purger --version`, the changelog, and a wheel and
an sdist that `python -m build` makes and a clean virtual environment installs and runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import purger
from purger.cli import app
from tests.support import ROOT

COMMANDS = ("setup", "schema", "run", "replay", "report", "pending", "reconcile")


def test_version_prints_the_packages_version_and_exits():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"purger {purger.__version__}\n"


def test_the_version_is_written_once_in_the_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "purger.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", purger.__version__)


def test_the_changelog_has_unreleased_first_then_a_section_for_this_version():
    headings = re.findall(r"^## \[(.+?)\]", (ROOT / "CHANGELOG.md").read_text(), flags=re.MULTILINE)
    assert headings[0] == "Unreleased"
    assert purger.__version__ in headings[1:], "the current version has no section in CHANGELOG.md"


def _copy_of_the_next_commit(destination: Path) -> Path:
    """The files a clone of the working tree's next commit would hold (tracked or new, not ignored): the build
    sees no leftovers (checkpoints, ledgers, egg-info) and writes none into the working tree."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():  # a tracked file deleted in the working tree is not in the next commit
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    return destination


def _run(command: list[str], cwd: Path, timeout_s: int) -> subprocess.CompletedProcess[str]:
    # Without PYTHONPATH, the virtual environment's purger is the wheel's, never the working tree's.
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(command, cwd=cwd, env=environment | {"COLUMNS": "100"}, capture_output=True,
                            text=True, timeout=timeout_s)
    assert result.returncode == 0, f"{' '.join(command)}: exit {result.returncode}\n{result.stdout}{result.stderr}"
    return result


# Needs the package index (setuptools for the isolated build, the dependencies for the virtual environment);
# about a minute with pyspark's wheel in pip's cache.
@pytest.mark.integration
def test_the_wheel_and_sdist_build_and_the_wheel_installs_and_runs_in_a_clean_virtual_environment(tmp_path):
    version = purger.__version__
    source = _copy_of_the_next_commit(tmp_path / "source")
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)], cwd=tmp_path, timeout_s=180)
    wheel, sdist = dist / f"purger-{version}-py3-none-any.whl", dist / f"purger-{version}.tar.gz"
    assert {path.name for path in dist.iterdir()} == {wheel.name, sdist.name}

    # The wheel installs the purger namespace alone: no top-level core, sinks, tests, devstack, bench, ...
    wheel_names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in wheel_names} == {"purger", f"purger-{version}.dist-info"}
    packages = tomllib.loads((source / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    for package in packages:
        assert f"{package.replace('.', '/')}/__init__.py" in wheel_names
    assert {"purger/log4j2.properties", "purger/fairscheduler.xml"} <= set(wheel_names)

    # The sdist holds the package folders as the repository lays them out, and the documentation.
    with tarfile.open(sdist) as archive:
        sdist_names = {name.removeprefix(f"purger-{version}/") for name in archive.getnames()}
    package_folders = tomllib.loads((source / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    expected = {"README.md", "CHANGELOG.md", "RELIABILITY.md", "pyproject.toml",
                *(str(path.relative_to(source)) for path in (source / "docs").rglob("*") if path.is_file()),
                *(str(path.relative_to(source)) for folder in set(package_folders.values())
                  for path in (source / folder).rglob("*.py"))}
    assert expected <= sdist_names, f"not in the sdist (see MANIFEST.in): {sorted(expected - sdist_names)}"

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path, timeout_s=60)
    # --no-compile: byte-compiling pyspark's thousands of modules was a third of the install (47 s against 30).
    _run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-compile", "--disable-pip-version-check", str(wheel)],
         cwd=tmp_path, timeout_s=300)
    installed_at = _run([str(venv / "bin" / "python"), "-c", "import purger; print(purger.__file__)"],
                        cwd=tmp_path, timeout_s=30).stdout.strip()
    assert Path(installed_at).is_relative_to(venv), installed_at
    # What a submission from this installation zips for --py-files: the same packages, found in site-packages.
    shipped = _run([str(venv / "bin" / "python"), "-c",
                    "from purger.submit import product_packages; print(*product_packages())"],
                   cwd=tmp_path, timeout_s=30).stdout.split()
    assert sorted(shipped) == sorted(packages)

    printed_version = _run([str(venv / "bin" / "purger"), "--version"], cwd=tmp_path, timeout_s=30).stdout
    assert printed_version == f"purger {version}\n"
    help_text = _run([str(venv / "bin" / "purger"), "--help"], cwd=tmp_path, timeout_s=30).stdout
    assert "Usage: purger" in help_text and "--version" in help_text
    for command in COMMANDS:
        assert re.search(rf"^\W*{command}\s", help_text, flags=re.MULTILINE), f"no {command} in:\n{help_text}"

"""The product's imports: every module imports alone; the pure core pulls in neither Spark nor a driver; the
subpackages import one another without a cycle, in the direction of the layers; the policy interface's parts
lie below ``purger.core.policy``, the one module a policy of one's own imports.

The product is the packages ``pyproject.toml`` installs (``[tool.setuptools] packages``: ``purger`` and the
repository's folders mapped under it), as the installation imports them (``purger.submit.product_packages``,
what a submitted job ships); the developer tools ``devstack`` and ``simulation`` run from the clone and must
import alone too. Each check runs in fresh interpreters (a module's import alone: in a child forked from one
that imported third-party libraries only), so what another test or module imported hides nothing.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import pkgutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

from purger.submit import product_packages
from tests.support import ROOT

TOOLS = ("devstack", "simulation")
NOT_PRODUCT = ("devstack", "simulation", "bench")
# Spark and the servers' drivers: none of them is for the pure core.
DRIVERS = ("pyspark", "py4j", "cassandra", "kafka", "boto3", "botocore")
# The product's subpackages as nodes of the package graph; the modules directly in purger/ are "purger.app", and
# so are the reconcile's: it is run by the application and starts a Spark session of its own as the application
# does (purger.spark, for the state's copy).
IN_THE_APP = ("purger.reconcile",)
SUBPACKAGES = tuple(package for package in product_packages() if package.count(".") == 1 and package not in IN_THE_APP)
APP = "purger.app"
# The policy interface's parts, one concept each, which ``purger.core.policy`` gathers for a policy of one's own.
INTERFACE = "purger.core.policy"
INTERFACE_PARTS = ("purger.core.events", "purger.core.handles", "purger.core.purge_protocol",
                   "purger.core.reconcile_descriptors")
OWN_POLICY = ROOT / "examples" / "push_clients" / "push_clients_policy.py"


@cache
def product_modules() -> dict[str, Path]:
    """Every module of the installed product, by name: its packages and the modules in each."""
    modules = {}
    for package in product_packages():
        spec = importlib.util.find_spec(package)
        modules[package] = Path(spec.origin)
        for info in pkgutil.iter_modules(spec.submodule_search_locations, f"{package}."):
            if not info.ispkg:  # a subpackage is listed in pyproject.toml itself
                modules[info.name] = Path(importlib.util.find_spec(info.name).origin)
    return modules


def test_the_packages_the_installation_imports_are_the_ones_pyproject_toml_installs():
    """A folder with an ``__init__.py`` under a package's folder is a package the installation imports (and a
    submitted job ships), which ``pyproject.toml`` must list, or a wheel would leave it out; and each package it
    lists is found."""
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = product_packages()
    assert len(found) == len(set(found))
    assert sorted(found) == sorted(listed)
    assert "purger.reconcile" in found and "purger.policies.mailbox" in found


def tool_modules() -> list[str]:
    """The developer tools' modules, but their ``__main__`` (a command, run rather than imported)."""
    names = list(TOOLS)
    for tool in TOOLS:
        names += [info.name for info in pkgutil.walk_packages([str(ROOT / tool)], f"{tool}.")
                  if not info.name.endswith(".__main__")]
    return names


def pure_modules() -> list[str]:
    """The pure core: ``purger.core``, the built-in policies, the configuration's loading, and a reconcile's
    verdict on a row."""
    return sorted(name for name in product_modules()
                  if name.startswith(("purger.core", "purger.policies")) or name in ("purger.config",
                                                                                       "purger.reconcile.verdict"))


def fresh_python(code: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """``code`` run by a new interpreter in the repository (the tools import from it), without this
    session's environment of Spark or endpoints."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK", "PURGER_"))}
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


# --- (a) every module imports alone --------------------------------------------------------------------


def alone(names: list[str]) -> list[str]:
    """The imports that test ``names`` each alone: a package with a module among them is imported alone, first,
    by that module's import, so it needs no interpreter of its own."""
    return [name for name in names if not any(other.startswith(f"{name}.") for other in names)]


# Imports each module in a child forked from an interpreter that has imported the libraries they share and none of
# the product (a new interpreter a module took 96 of them about 50 s of a loaded CI's lane); a child's import of a
# module is that module's alone. Prints the ones that failed, with their error's last line.
_FORKS = '''
import importlib, json, os
for library in {libraries!r}:
    importlib.import_module(library)
failed = {{}}
for name in {names!r}:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            error = ""
        except BaseException as raised:
            error = f"{{type(raised).__name__}}: {{raised}}"
        os.write(write, error.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        error = answer.read()
    _, status = os.waitpid(pid, 0)
    if status and not error:  # a child that died in the import (a signal, a crash) wrote nothing
        error = f"the import ended the process (wait status {{status}})"
    if error:
        failed[name] = error
print(json.dumps(failed))
'''
# Third-party libraries only: no module of the product or the tools is imported before a child's.
SHARED_LIBRARIES = ("pyspark.sql", "pandas", "pyarrow", "cassandra.cluster", "kafka", "boto3", "pydantic", "typer",
                    "prometheus_client", "tenacity")


def test_every_module_of_the_product_and_the_tools_imports_alone():
    every = sorted(product_modules()) + tool_modules()
    assert len(every) > 40 and "purger.streams.processor" in every and "devstack.stack" in every
    names = alone(every)
    assert {name.rpartition(".")[0] for name in names} | set(names) >= set(every)
    run = fresh_python(_FORKS.format(libraries=SHARED_LIBRARIES, names=names))
    assert run.returncode == 0, run.stderr[-2000:]
    failed = json.loads(run.stdout.strip().splitlines()[-1])
    assert failed == {}, "modules that do not import alone:\n" + "\n".join(f"  {n}: {e}" for n, e in failed.items())


# --- (b) the pure core imports neither Spark nor the drivers -------------------------------------------

# Imports the pure modules in one interpreter; for each driver that got imported, the chain of the product's
# modules that were importing when it was first imported (outermost first).
_WATCH = '''
import importlib, json, sys
DRIVERS = set({drivers!r})
via = {{}}

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name in DRIVERS and name not in via:
            chain, frame = [], sys._getframe(1)
            while frame is not None:
                module = frame.f_globals.get("__name__", "")
                if module.startswith("purger") and module not in chain:
                    chain.append(module)
                frame = frame.f_back
            via[name] = chain[::-1]
        return None

sys.meta_path.insert(0, Watch())
for name in {modules!r}:
    importlib.import_module(name)
loaded = sorted({{m.partition(".")[0] for m in sys.modules}} & DRIVERS)
print(json.dumps({{"loaded": loaded, "via": {{d: via.get(d, []) for d in loaded}}}}))
'''


def test_the_pure_core_imports_neither_spark_nor_a_driver():
    modules = pure_modules()
    assert {"purger.core.settings", "purger.core.policy", "purger.core.schedule", "purger.core.times",
            "purger.core.vocabulary", "purger.config", "purger.policies.users", *INTERFACE_PARTS} <= set(modules)
    run = fresh_python(_WATCH.format(drivers=DRIVERS, modules=modules))
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["loaded"] == [], "the pure core imports " + "; ".join(
        f"{driver} (via {' -> '.join(found['via'][driver]) or 'an import outside the product'})"
        for driver in found["loaded"])


# --- (c) the package graph: acyclic, and in the direction of the layers --------------------------------


def node(module: str) -> str:
    """The package graph's node of one of the product's modules."""
    package = ".".join(module.split(".")[:2])
    return package if package in SUBPACKAGES else APP


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``, imports that never run."""
    skipped = set()
    for statement in ast.walk(tree):
        if isinstance(statement, ast.If) and ast.unparse(statement.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            skipped |= {id(n) for b in statement.body for n in ast.walk(b)}
    return skipped


def imports_of(module: str, path: Path) -> set[str]:
    """The modules ``module`` imports, at its top or in a function (not under ``if TYPE_CHECKING``), as
    absolute names: ``from a import b`` counts ``a``, and ``a.b`` when that is a module of the product."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_only(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for n in ast.walk(tree):
        if id(n) in skipped:
            continue
        if isinstance(n, ast.Import):
            found |= {alias.name for alias in n.names}
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - n.level + 1] + ([n.module] if n.module else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in n.names if f"{base}.{alias.name}" in product_modules()}
    return found


@cache
def module_graph() -> dict[str, set[str]]:
    """module -> the modules it imports (every import, the product's and others')."""
    return {module: imports_of(module, path) for module, path in product_modules().items()}


def package_edges() -> dict[tuple[str, str], list[str]]:
    """(from node, to node) -> the module imports that make the edge, ``a -> b``."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, imported in module_graph().items():
        for target in sorted(imported):
            if target.partition(".")[0] == "purger" and node(module) != node(target):
                edges.setdefault((node(module), node(target)), []).append(f"{module} -> {target}")
    return edges


def cycles(edges: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """The package graph's cycles, each once, as the list of its nodes (the first repeated at the end)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    found, seen = [], set()

    def walk(path: list[str]) -> None:
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt == path[0]:
                key = frozenset(path)
                if key not in seen:
                    seen.add(key)
                    found.append(path + [nxt])
            elif nxt not in path and nxt > path[0]:  # each cycle from its smallest node
                walk(path + [nxt])

    for start in sorted(graph):
        walk([start])
    return found


def test_the_graph_covers_the_product():
    graph = module_graph()
    assert set(map(node, graph)) == {*SUBPACKAGES, APP}
    assert "purger.core.policy" in graph["purger.policies.users"]
    assert "purger.core.schedule" in graph["purger.streams.processor"]


def test_the_subpackages_import_one_another_without_a_cycle():
    edges = package_edges()
    found = cycles(edges)
    assert found == [], "import cycles between the product's subpackages:\n" + "\n".join(
        " -> ".join(cycle) + ":\n" + "\n".join(f"    {imp}" for a, b in zip(cycle, cycle[1:]) for imp in edges[(a, b)])
        for cycle in found)


def test_the_core_imports_nothing_else_of_the_product():
    outward = [imp for (a, b), imps in package_edges().items() if a == "purger.core" for imp in imps]
    assert outward == []


def names_from(path: Path, module: str) -> set[str]:
    """The names ``path`` imports from ``module`` (``from module import name``)."""
    return {alias.name for n in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(n, ast.ImportFrom) and n.module == module and not n.level for alias in n.names}


def test_the_interfaces_parts_lie_below_the_module_that_gathers_them():
    """The parts import one another, never ``purger.core.policy``; the product imports each name of the interface
    from the part that defines it, and from ``purger.core.policy`` only what that module defines."""
    graph = module_graph()
    assert [part for part in INTERFACE_PARTS if INTERFACE in graph[part]] == []
    tree = ast.parse(product_modules()[INTERFACE].read_text())
    own = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert own == {"Policy", "Settings"}
    through = {module: sorted(names_from(path, INTERFACE) - own) for module, path in product_modules().items()}
    assert {module: names for module, names in through.items() if names} == {}


def test_a_policy_of_ones_own_imports_the_purger_from_one_module():
    """The example imports of the purger ``purger.core.policy`` alone, and only names of its ``__all__``."""
    tree = ast.parse(OWN_POLICY.read_text())
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names}
    assert {name for name in imported if name.partition(".")[0] == "purger"} == {INTERFACE}
    assert names_from(OWN_POLICY, INTERFACE) <= set(importlib.import_module(INTERFACE).__all__)


def test_the_streams_import_nothing_of_the_sinks():
    assert package_edges().get(("purger.streams", "purger.sinks"), []) == []


def test_the_product_imports_no_developer_tool():
    tools = sorted(f"{module} -> {target}" for module, imported in module_graph().items() for target in imported
                   if target.partition(".")[0] in NOT_PRODUCT)
    assert tools == []


def test_the_connectors_modules_import_neither_their_package_nor_one_another():
    """``purger.connectors`` re-exports its modules' names, so a module of it that imported the package would
    import itself half made; the clients, a module each, share only ``errors``."""
    graph = module_graph()
    modules = sorted(m for m in graph if m.startswith("purger.connectors."))
    assert {"purger.connectors.cassandra_client", "purger.connectors.kafka_clients",
            "purger.connectors.object_store"} <= set(modules)
    inward = {m: sorted(t for t in graph[m] if node(t) == "purger.connectors" and t != "purger.connectors.errors")
              for m in modules}
    assert inward == {m: [] for m in modules}


def test_the_cycle_finder_finds_a_cycle():
    edges = {("a", "b"): ["a.x -> b.y"], ("b", "c"): ["b.y -> c.z"], ("c", "a"): ["c.z -> a.x"], ("a", "c"): []}
    assert cycles(edges) == [["a", "b", "c", "a"], ["a", "c", "a"]]

"""Failpoints: the named moments of the purge protocol, the sink and a reconcile where a test may act
(RELIABILITY.md): kill the purger there, or make another writer land. The product names its moments and calls
the hooks installed in its process; it installs none, reads no environment and kills nothing. The hooks are test
scaffolding (``purger.testing``), installed by a test in its own process or, for the processes of a purger a
test starts, at their start when the test asks (``PURGER_FAILPOINT``).

Not part of the policy interface: the engine names its moments itself (``before_<kind>_claim``,
``after_<kind>_dependent_delete``, ``after_<kind>_delete``, ``after_<kind>_delete_failed`` (before the serial
read that settles it), ``before_ledger_write``, ...).

Example::

    failpoint("before_ledger_write")   # each installed hook called with the name; with none, nothing
"""

from __future__ import annotations

from typing import Callable

_hooks: list[Callable[[str], None]] = []


def failpoint(name: str) -> None:
    """The moment ``name``: each hook installed in this process is called with it."""
    for hook in list(_hooks):
        hook(name)


def install(hook: Callable[[str], None]) -> None:
    """Call ``hook(name)`` at every failpoint this process reaches, until ``uninstall``."""
    _hooks.append(hook)


def uninstall(hook: Callable[[str], None]) -> None:
    _hooks.remove(hook)

"""Run by every Python process started with this folder on its ``PYTHONPATH`` (``site`` imports
``sitecustomize``): a purger's driver and the Python workers Spark starts for it. The fault tests put it there
(``tests.support.faults.killed_at``) so that the process reaching ``PURGER_FAILPOINT`` kills the purger."""

from purger.testing import install_from_environment

install_from_environment()

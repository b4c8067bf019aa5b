"""``python -m purger``: the `purger` command, for an environment where its script is not on the PATH."""

from purger.cli import app

app(prog_name="purger")

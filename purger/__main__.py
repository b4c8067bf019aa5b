"""``python -m purger``: the `purger` command, for an environment where its script is not on the PATH."""

from purger.cli import app

if __name__ == "__main__":
    app(prog_name="purger")

"""The purge job as spark-submit runs it: exactly ``purger run``, with the same options.

This file is spark-submit's main file (``purger submit-line`` prints the whole line,
``purger.submit``). Without spark-submit the same thing runs as ``python -m purger.job
--config purger.toml``, which is ``purger run --config purger.toml``.

The session it builds (``purger.spark.spark_session``) keeps the master and jars that
spark-submit was given; the deletions run on the executors (``sinks.purge``).

SIGTERM stops the job as Ctrl-C stops ``purger run`` (``purger.cli``): the query stops
between micro-batches and the process exits 0, after which spark-submit ends the application.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    """Run ``purger run`` with ``argv`` (default: this process's arguments)."""
    from purger.cli import app

    app(args=["run", *(sys.argv[1:] if argv is None else argv)], prog_name="purger job")


if __name__ == "__main__":
    # Run as a file, its folder comes first on sys.path, where this package's modules would be top-level ones.
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]
    main()

"""A micro-batch's tasks take a free core before the daily report's and a reconcile's (purger/fairscheduler.xml)."""

import threading
import time

import pytest

from purger.running import RECONCILE_JOB_GROUP, REPORT_JOB_GROUP

pytestmark = pytest.mark.integration  # Spark (a JVM), though no server

TASK_S = 0.05


def _task_starts(spark, pool: str, tasks: int, into: dict[str, list[float]]) -> None:
    """Runs a job of ``tasks`` short tasks in ``pool`` from this thread; records when each task started."""
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", pool)
    into[pool] = (spark.sparkContext.parallelize(range(tasks), tasks)
                  .map(lambda _: (time.time(), time.sleep(TASK_S))[0]).collect())


@pytest.mark.parametrize("beside", [REPORT_JOB_GROUP, RECONCILE_JOB_GROUP])
def test_a_batchs_tasks_go_before_the_tasks_of_the_jobs_beside_it(spark, beside):
    starts: dict[str, list[float]] = {}
    long_job = threading.Thread(target=_task_starts, args=(spark, beside, 120, starts))
    long_job.start()
    while not spark.sparkContext.statusTracker().getActiveStageIds():
        time.sleep(0.05)
    time.sleep(1)  # its tasks hold every core
    batch = threading.Thread(target=_task_starts, args=(spark, "default", 12, starts))
    batch.start()
    batch.join()
    long_job.join()

    first, last = min(starts["default"]), max(starts["default"])
    overtaking = [t for t in starts[beside] if first < t < last]
    # Each core may still start a task the scheduler gave it just before the batch came, and its Python records
    # the time a little later, after a batch's task that waited for a worker's fork (3 once in a CI run): twice
    # the cores. Equal pools would have shared the cores for the whole span, the batch's 12 tasks beside 12.
    assert len(overtaking) <= 2 * spark.sparkContext.defaultParallelism, overtaking
    assert max(starts[beside]) > last  # the long job was still waiting when the batch was done

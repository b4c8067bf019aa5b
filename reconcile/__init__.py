"""Reconciliation (docs/reconciliation.md): the store as a second source of candidates, all in this package.

- ``run``: the run (`purger reconcile`, and the running purger's schedule): per enabled policy, first its
  dependent rows whose parent is gone, then per table it scans (``Policy.scanned``) one Spark job, then its
  orphan blobs; then the run's report, a row per policy, table and data centre, appended to the Delta table at
  ``ledger.reconcile_path``;
- ``token_ranges``: a table read whole by token range, in Spark tasks, paced at ``reconcile.max_rows_per_second``
  over all of them;
- ``verdict`` (pure): what a scanned row says, re-expressed as its policy's events and folded
  (``row_verdict``), or a page's rows judged on whole columns where the policy can (``page_verdicts``);
  the report's rows (``ReportRow``);
- ``known_objects``: the stream's state as of the checkpoint's last committed batch, copied out of the
  checkpoint by a process of its own, to compare with;
- ``orphans``: orphan rows and orphan blobs, found by anti-joins and deleted through the engine's purge
  protocol, each decision a ledger record.

This module imports nothing, so that the pure ``verdict`` imports alone.

Example::

    from purger.reconcile.run import reconcile
    report = reconcile(spark, config)                 # every enabled policy
    report = reconcile(spark, config, ["mailbox"], dry_run=True)
"""

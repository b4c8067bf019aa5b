"""What a report's purge-lag percentile may be: a lag whose rank among the day's lags is within the sketch's stated
error of the percentile (``purger.core.lags.LAG_RANK_ERROR``)."""

from __future__ import annotations


def ranked_within(lags: list[float], p: float, value: float | None, error: float) -> bool:
    """``value`` is a ``p`` quantile of ``lags`` to within a normalized rank ``error``: the share of lags below
    it is at most ``p + error`` and the share at or below it at least ``p - error``. None exactly when there
    are no lags."""
    if not lags or value is None:
        return not lags and value is None
    below = sum(lag < value for lag in lags) / len(lags)
    at_or_below = sum(lag <= value for lag in lags) / len(lags)
    return below <= p + error and at_or_below >= p - error

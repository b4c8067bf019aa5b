"""The platform stand-ins' clock: the wall clock, strictly increasing by at least a millisecond.

The spec's timestamps resolve to the millisecond, and a platform's successive
changes to one object (a message, a rule event, a user) must carry increasing
event times, as the object's row writes are ordered. One clock serves every
stand-in and thread in the process, which is enough for each object alone.

Example::

    from simulation.clock import now
    first, second = now(), now()   # second >= first + 1 ms
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

_last_moment = datetime.min.replace(tzinfo=timezone.utc)
_lock = threading.Lock()


def now() -> datetime:
    """The wall clock, or a millisecond past the last moment it gave if the wall clock has not moved on."""
    global _last_moment
    with _lock:
        _last_moment = max(datetime.now(timezone.utc), _last_moment + timedelta(milliseconds=1))
        return _last_moment

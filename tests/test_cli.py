"""The command's signal handling: a signal only sets an event, which the run loop checks between calls."""

from __future__ import annotations

import os
import signal

from purger.cli import _set_on_signals


def test_the_first_signal_sets_the_stop_event_and_raises_nothing():
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        stop_requested = _set_on_signals(signal.SIGUSR1)
        assert not stop_requested.is_set()
        os.kill(os.getpid(), signal.SIGUSR1)  # delivered to this (main) thread before kill returns
        assert stop_requested.is_set()
    finally:
        signal.signal(signal.SIGUSR1, previous)

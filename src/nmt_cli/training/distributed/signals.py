"""Stop signals: SIGINT/SIGTERM end training at the next update boundary."""

from __future__ import annotations

import signal
import threading


class StopSignals:
    """SIGINT/SIGTERM set a flag checked between updates (a checkpoint is then written); a second one aborts."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

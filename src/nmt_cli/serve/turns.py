"""Fair turns between the searches the engine runs at once: which one decodes the next step.

Requests with different search settings (beam, length penalty, sampling, a seed) cannot share one search, so the
engine (engine.py) runs a search per setting, each in a thread of its own; only one decodes at a time (the model
and the cores are shared). Each search asks for a turn at every host check (every step on CPU) and the turn goes to
the search that has had the least decoding time per request it serves: start-time fair queuing over requests,
measured in seconds. A search whose step serves 8 requests is charged an eighth of the step's time, so a client
that alternates settings gets its share of the engine and no more, while the requests that share the default
search keep theirs; a search that was idle starts level with the others (no credit saved up while idle).

A turn lasts at least QUANTUM_S (one step or several): each hand-over wakes another thread, which on a busy
machine may wait for a core, so handing over at every millisecond-long step would cost more than the steps. With
one search the turn never changes hands: `take` only adds up the time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

QUANTUM_S = 0.01  # a turn's least length (the module docstring)


class Turns:
    """The turn to decode a step, shared fairly between searches (any hashable object names one)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock  # seconds (tests give a clock of their own)
        self.cond = threading.Condition()
        self.served: dict[object, float] = {}  # active search -> its decoding seconds per request served so far
        self.asking: set[object] = set()  # active searches waiting for the turn
        self.holder: object | None = None  # the search decoding now
        self.since = 0.0  # when the holder's time was last charged
        self.began = 0.0  # when the holder got the turn
        self.weight = 1  # the holder's requests, as it said when it took the turn

    def take(self, who: object, requests: int) -> None:
        """End `who`'s turn if it holds one (charging its time to it), then wait for its next turn; `requests`: the
        requests its next step serves (1 or more)."""
        now = self.clock()
        with self.cond:
            if self.holder is who:
                self._charge(now)
                if not self.asking or now - self.began < QUANTUM_S:  # nobody else wants a step, or a short turn
                    self.since, self.weight = now, max(1, requests)
                    return
                self.holder = None
                self.cond.notify_all()
            if who not in self.served:  # (re)joining: level with the least served of the others
                self.served[who] = min(self.served.values(), default=0.0)
            self.asking.add(who)
            while self.holder is not None or who is not min(self.asking, key=self.served.__getitem__):
                self.cond.wait()
            self.asking.discard(who)
            self.holder, self.weight = who, max(1, requests)
            self.since = self.began = self.clock()

    def leave(self, who: object) -> None:
        """`who` stops decoding (no work, or its search ended): its turn, if it holds one, goes to the next."""
        now = self.clock()
        with self.cond:
            if self.holder is who:
                self._charge(now)
                self.holder = None
            self.asking.discard(who)
            self.served.pop(who, None)
            self.cond.notify_all()

    def _charge(self, now: float) -> None:
        self.served[self.holder] += (now - self.since) / self.weight

"""Requests a minute per client (`nmt serve --req-limit N`), as LibreTranslate's `--req-limit`: a moving window of
the last 60 seconds per client (its API key when the server has keys and the request gives one, else its address),
each request costing what LibreTranslate counts (one per text of `q`). Kept in the HTTP process's memory: a restart
forgets it, and several servers behind one proxy each count their own.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 60.0


class RateLimiter:
    """At most `limit` units of cost per key in any `window` seconds."""

    def __init__(self, limit: int, window: float = WINDOW_S, clock: Callable[[], float] = time.monotonic):
        self.limit, self.window, self.clock = limit, window, clock
        self._spent: dict[str, deque[tuple[float, int]]] = {}  # key -> (time, cost), oldest first
        self._takes = 0

    def take(self, key: str, cost: int = 1) -> float | None:
        """Spend `cost` for `key` now -> None, or where that would pass the limit, nothing spent and the seconds
        until it would not (the whole window for a cost over the limit alone)."""
        now = self.clock()
        self._takes += 1
        if self._takes % 1024 == 0:  # forget the clients gone quiet
            for k in [k for k, spent in self._spent.items() if spent[-1][0] <= now - self.window]:
                del self._spent[k]
        spent = self._spent.setdefault(key, deque())
        while spent and spent[0][0] <= now - self.window:
            spent.popleft()
        used = sum(c for _, c in spent)
        if used + cost <= self.limit:
            spent.append((now, cost))
            return None
        if cost > self.limit:
            return self.window
        for t, c in spent:  # the oldest spending that frees enough
            used -= c
            if used + cost <= self.limit:
                return max(0.0, t + self.window - now)
        return self.window  # (not reached: the loop frees everything)

"""The batcher between HTTP requests and the decoding engine: one worker thread per model feeds the scheduler live.

Requests (`Engine.submit`) put their sentences in a queue bounded in sentences; the worker runs `decode_batches`
with a `Feed` (decoding/scheduler.py) that hands out the waiting sentences as batches, which join the running
search at a host check (continuous batching across requests), and an `on_done` callback that gives each sentence
its hypotheses as it finishes: a request completes the moment its last sentence does, whatever else runs. The
feed encodes the waiting sentences on a thread of its own while the search decodes (PyTorch's operations release
the GIL), so a batch joins already encoded and the search's thread spends its time on decoding steps; with nothing
running, the search's thread encodes its next batch itself (no hand-over), and waits LINGER_S for one before it ends,
so that one client's requests, one after another, are decoded by one running search (no thread started for each).

Search configs: sentences whose requests ask for the same search (beam, length penalty, lengths, sampling) share
one running search; a request with other options is a group of its own, searched at the same time by another of
the engine's SEARCHES worker threads. One step decodes at a time (the model and the cores are shared): the searches
take turns step by step, each turn to the search with the least decoding time per request served so far (turns.py),
so a client that alternates settings holds nobody back. Only when more groups wait than there are workers does a
running search stop taking new sentences, drain, and leave its worker to the group waiting longest. A search ends
when its group has nothing left. A request with a sampling seed is a group of its own (its own generator), so the
same request with the same seed gives the same output whatever else the server does.

This module needs no web package: the HTTP side (app.py) calls `submit` and awaits the job's future.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count

import torch

from nmt_cli.decoding import Hypothesis, SearchConfig, decode_batches, encode_batch
from nmt_cli.decoding.batch import Sources, source_batch
from nmt_cli.inference.translate import Translator
from nmt_cli.serve.turns import Turns

JOIN_FRACTION = 0.25  # waiting sentences are encoded as one batch once they are this fraction of the running ones,
JOIN_WAIT_S = 0.03  # or once the oldest has waited this long (fewer, larger batches: each encoding has a fixed cost)
LINGER_S = 0.05  # a search with nothing left waits this long for more before it ends (the same thread decodes the next)
SEARCHES = 4  # searches (groups of different settings) decoded at once, in turns; more groups wait for a worker
FIELDS = dataclasses.fields(SearchConfig)  # a search's key: its settings' values, in order


class Throughput:
    """Sentences answered, and per second, smoothed over windows of at least a second (/info; Retry-After)."""

    def __init__(self):
        self.done = 0
        self.rate = 0.0
        self._mark = (time.monotonic(), 0)

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        then, before = self._mark
        if now - then >= 1.0:
            rate = (self.done - before) / (now - then)
            self.rate = rate if not self.rate else 0.5 * self.rate + 0.5 * rate
            self._mark = (now, self.done)


def retry_after(queued: int, rate: float) -> int:
    """Seconds until `queued` sentences are done at `rate` a second (1 to 60), for Retry-After."""
    return max(1, min(60, math.ceil(queued / (rate or 1.0))))


class QueueFull(Exception):
    """The queue has no room for the request's sentences; `retry_after` seconds is an estimate of when it will."""

    def __init__(self, retry_after: int):
        super().__init__(f"the server is busy (queue full); retry after {retry_after} s")
        self.retry_after = retry_after


class Stopping(Exception):
    """The server is stopping and takes no new work."""


@dataclass(eq=False)
class Job:
    """One request's sentences (token ids with EOS; [] for an empty line) and, when done, their hypotheses."""

    sources: list[list[int]]
    cfg: SearchConfig
    key: tuple
    on_finish: Callable[[Job], None]
    results: list[list[Hypothesis] | None] = field(default_factory=list)
    remaining: int = 0
    cancelled: bool = False
    error: str | None = None
    seq: int = 0

    def cancel(self) -> None:
        """Nobody waits for this job any more: its sentences still waiting are dropped, and those being decoded
        leave the search at its next host check (Engine.cancel counts it, so the search looks)."""
        self.cancelled = True


class _Group:
    """Waiting sentences of one search config, oldest first, as (arrival number, job, index)."""

    def __init__(self, cfg: SearchConfig, generator: torch.Generator | None):
        self.cfg, self.generator = cfg, generator
        self.waiting: deque[tuple[int, Job, int, float]] = deque()  # (arrival number, job, index, arrival time)
        self.running = 0  # sentences its search decodes (as its feed last saw them)
        self.feed: _Feed | None = None  # its search's feed, while a worker runs it

    def worth_encoding(self) -> bool:
        """Whether the waiting sentences are enough to encode as a batch now (JOIN_FRACTION; the time limit aside):
        the encoding thread is woken only then, not at every request or step (each wake-up takes the GIL from the
        search)."""
        return len(self.waiting) >= JOIN_FRACTION * self.running


class Engine:
    """A Translator served to concurrent requests (see the module docstring). `max_queue`: sentences accepted and
    not yet finished, at most. `max_tokens`/`max_sentences` bound one batch taken from the queue."""

    def __init__(self, translator: Translator, max_queue: int = 1024, name: str = "nmt-engine"):
        self.translator = translator
        self.default = translator.config.search
        self.max_queue = max_queue
        self.max_tokens = translator.config.max_tokens
        self.max_sentences = translator.config.max_sentences
        self.lock = threading.RLock()  # over everything below; conditions on it:
        self.cond = threading.Condition(self.lock)  # (for callers that hold it; each feed waits on its own)
        self.wake = threading.Condition(self.lock)  # idle workers wait on this one (woken one at a time)
        self.feeds: set[_Feed] = set()  # the running searches' feeds
        self.groups: dict[tuple, _Group] = {}
        self.queued = 0  # sentences accepted and not finished (waiting or being decoded)
        self.closing = False
        self.cancellations = 0  # jobs given up (the feed looks for their sentences when this changes)
        self.arrivals = count()
        self.jobs = count()
        self.answered = Throughput()
        self.dropped = 0  # sentences given up (their request timed out or failed)
        self.batches = 0  # batches handed to the search (fewer than sentences: requests shared them)
        self.turns = Turns()
        self.idle = 0  # workers waiting for a group to search
        self.threads = [threading.Thread(target=self._run, name=f"{name}-{i}" if i else name, daemon=True)
                        for i in range(SEARCHES)]
        for thread in self.threads:
            thread.start()

    @property
    def parameters(self) -> int:
        return sum(self.translator.model_parameters)  # (the model's own count: packed and int8 weights are buffers)

    # ------------------------------------------------------------------ requests (any thread)

    def config(self, **options) -> SearchConfig:
        """The server's default search with a request's options (SearchConfig field names) over it; validated
        (ConfigError on a bad combination)."""
        return dataclasses.replace(self.default, **options).validate() if options else self.default

    def submit(self, lines: list[str], cfg: SearchConfig, on_finish: Callable[[Job], None]) -> Job:
        """Queue a request's lines; `on_finish(job)` runs in the worker thread once every line is translated (at
        once, in this thread, when no line needs decoding). QueueFull when there is no room, Stopping when
        the server is stopping."""
        return self.submit_ids(self.translator.encode(lines, 1), cfg, on_finish)

    def submit_ids(self, sources: list[list[int]], cfg: SearchConfig, on_finish: Callable[[Job], None]) -> Job:
        """`submit` for lines already encoded (token ids with EOS; [] for an empty line)."""
        seq = next(self.jobs)
        key = tuple(getattr(cfg, f.name) for f in FIELDS)  # (dataclasses.astuple deep-copies: slower)
        generator = None
        if cfg.sampling:  # (a generator on the model's device: torch.multinomial refuses a CPU one on a GPU)
            if cfg.seed is not None and cfg != self.default:
                key = (*key, "seeded", seq)  # its own search and generator: reproducible whatever else runs
                generator = torch.Generator(device=self.translator.device).manual_seed(cfg.seed)
            elif cfg == self.default:
                generator = self.translator.generator  # the server's stream, as `nmt translate` over one input
            else:
                generator = torch.Generator(device=self.translator.device)
                generator.seed()
        job = Job(sources, cfg, key, on_finish, [None] * len(sources), seq=seq)
        todo = [i for i, s in enumerate(sources) if s]
        for i, s in enumerate(sources):
            if not s:
                job.results[i] = [Hypothesis([], 0.0, 0.0)]
        with self.cond:
            if self.closing:
                raise Stopping("the server is stopping")
            if todo and self.queued + len(todo) > self.max_queue:
                raise QueueFull(retry_after(self.queued, self.answered.rate))
            job.remaining = len(todo)
            if todo:
                group = self.groups.get(key)
                if group is None:
                    group = self.groups[key] = _Group(cfg, generator)
                now = time.monotonic()
                first = not group.waiting  # the encoding thread's time limit starts with it
                group.waiting.extend((next(self.arrivals), job, i, now) for i in todo)
                self.queued += len(todo)
                if group.feed is not None:
                    if first or group.worth_encoding():
                        group.feed.cond.notify_all()
                elif first:
                    self.wake.notify()
                    if not self.idle:  # the running searches drain
                        self._notify_feeds()
        if not todo:
            on_finish(job)
        return job

    def cancel(self, job: Job) -> None:
        """Give up `job` (a request that timed out or failed): no more decoding time goes to it."""
        with self.cond:
            job.cancel()
            self.cancellations += 1

    def close(self, wait: bool = True, timeout: float | None = None) -> None:
        """Take no new work; the worker finishes what was accepted, then ends."""
        with self.cond:
            self.closing = True
            self.wake.notify_all()
            self._notify_feeds()
        if wait:
            deadline = None if timeout is None else time.monotonic() + timeout
            for thread in self.threads:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def stats(self) -> dict:
        with self.cond:
            return {"queued": self.queued, "translated": self.answered.done, "dropped": self.dropped,
                    "batches": self.batches, "search_groups": len(self.groups),
                    "sentences_per_second": round(self.answered.rate, 2)}

    # ------------------------------------------------------------------ the worker

    def _run(self) -> None:
        """A worker: search the group waiting longest that no other worker searches, until it has nothing left."""
        while True:
            with self.cond:
                self.idle += 1
                while not (keys := self._unsearched()) and not self.closing:
                    self.wake.wait()
                self.idle -= 1
                if not keys:
                    return  # closing and nothing left
                key = min(keys, key=lambda k: self.groups[k].waiting[0][0])  # the one waiting longest
                group = self.groups[key]
                group.feed = feed = _Feed(self, key)
                self.feeds.add(feed)
            feed.start()
            try:
                decode_batches(self.translator.model, (), group.cfg, generator=group.generator, feed=feed,
                               on_done=feed.done, shortlist=self.translator.shortlist)
            except Exception as exc:  # a failure fails the requests being decoded, never the server
                traceback.print_exc(file=sys.stderr)
                feed.fail(f"{type(exc).__name__}: {exc}".splitlines()[0])
            finally:
                self.turns.leave(feed)
                feed.close()
            with self.cond:
                group.feed = None
                self.feeds.discard(feed)
                if group.waiting:
                    self.wake.notify()  # (came after the search decided to end: another worker, or this one)
                elif self.groups.get(key) is group:
                    del self.groups[key]
                self._notify_feeds()  # (a worker is free again: searches that drained may take sentences again)

    def _unsearched(self) -> list[tuple]:
        """(holding the lock) Groups with sentences waiting and no search."""
        return [k for k, g in self.groups.items() if g.waiting and g.feed is None]

    def _starved(self) -> bool:
        """(holding the lock) A group waits for a worker and none is free: the running searches drain."""
        return not self.idle and any(g.waiting and g.feed is None for g in self.groups.values())

    def _notify_feeds(self) -> None:
        """(holding the lock) Wake every running search's threads to look again (the workers' state changed)."""
        for feed in self.feeds:
            feed.cond.notify_all()

    def _finished(self, n: int, dropped: bool = False) -> None:
        """Count n finished (or dropped) sentences (called holding the lock)."""
        self.queued -= n
        if dropped:
            self.dropped += n
            return
        self.answered.add(n)


class _Feed:
    """The scheduler's Feed for one group: batches of waiting sentences, encoded on the feed's own thread while the
    search decodes (see the module docstring); ids of the sentences handed out."""

    def __init__(self, engine: Engine, key: tuple):
        self.engine, self.key = engine, key
        self.group = engine.groups[key]
        self.owners: dict[int, tuple[Job, int]] = {}  # sentence id -> (job, index)
        self.requests: Counter[Job] = Counter()  # the jobs handed out, with their sentences not yet finished
        self.next_id = 0
        self.cancellations = engine.cancellations  # cancellations seen
        self.ready: deque[Sources] = deque()  # encoded batches (with their cache), in the order of their ids
        self.encoding = 0  # sentences being encoded now
        self.running = self.group.running = 0  # sentences the search decoded at its last look
        self.stopped = False
        self.idle = False  # the search waits with nothing running: it encodes the next batch itself
        self.error: Exception | None = None  # the encoding failed (raised in the search's thread)
        self.cond = threading.Condition(engine.lock)  # its encoding thread and its search wait on this
        self.thread = threading.Thread(target=self._encode, name=f"{threading.current_thread().name}-encode",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _encode(self) -> None:
        """The encoding thread: while the search has room, the waiting sentences as one batch, encoded. A failure
        is raised in the search's thread at its next look (Engine._run then fails the requests)."""
        engine = self.engine
        try:
            with torch.inference_mode():
                while self._encode_next():
                    pass
        except Exception as exc:
            with engine.cond:
                self.error, self.encoding = exc, 0
                self.cond.notify_all()

    def _encode_next(self) -> bool:
        """Wait for sentences to encode and encode them as one batch; False once the feed is closed."""
        engine = self.engine
        with engine.cond:
            while True:
                if self.stopped:
                    return False
                room = self._room()
                live = self._live() if room > 0 and not self.idle and not self._draining() else 0
                wait = JOIN_WAIT_S - (time.monotonic() - self.group.waiting[0][3]) if live else None
                if live and (self.group.worth_encoding() or wait <= 0):
                    batch = self._take(room)
                    self.encoding = batch.src.size(0)
                    break
                self.cond.wait(wait)
        cache = encode_batch(engine.translator.model, batch.src, batch.src_pad_mask)
        with engine.cond:
            self.ready.append(batch._replace(cache=cache))
            self.encoding = 0
            self.cond.notify_all()
        return True

    def _draining(self) -> bool:
        """(holding the lock) Whether to take no more sentences: a group waits for a worker and none is free. A
        search takes its first batch whatever waits (else searches that end at once could pass the workers round
        for ever)."""
        return self.next_id > 0 and self.engine._starved()

    def _check(self, running: int) -> None:
        """(holding the lock) Raise the encoding's failure; note the running sentences (room for the encoder)."""
        if self.error is not None:
            raise self.error
        if running < self.running and self.group.waiting:
            full = self._room() <= 0
            self.group.running = running
            if full or self.group.worth_encoding():  # room again, or enough waiting now
                self.cond.notify_all()
        self.running = self.group.running = running

    def _room(self) -> int:
        """(holding the lock) Sentences the search could still take: its limit, less those running and ready."""
        return self.engine.max_sentences - self.running - sum(b[0].size(0) for b in self.ready)

    def poll(self, running: int):
        self.engine.turns.take(self, len(self.requests))  # (a step's end: the next one when it is this search's turn)
        with self.engine.cond:
            self._check(running)
            return self.ready.popleft() if self.ready else None

    def close(self) -> None:
        """The search ended: stop the encoding thread."""
        with self.engine.cond:
            self.stopped = True
            self.cond.notify_all()
        self.thread.join()

    def abandoned(self, sentences: list[int]) -> list[int]:
        engine = self.engine
        if engine.cancellations == self.cancellations:
            return []
        with engine.cond:
            self.cancellations = engine.cancellations
            gone = [k for k, s in enumerate(sentences) if self.owners[s][0].cancelled]
            for k in gone:
                self._release(self.owners.pop(sentences[k])[0])
            engine._finished(len(gone), dropped=True)
            return gone

    def wait(self):
        """Nothing runs: the next batch, or None to end the search (nothing left, or a group waits for a worker).
        The search's own thread encodes it (no hand-over to the encoding thread, whose turn is for joins while the
        search decodes)."""
        engine = self.engine
        engine.turns.leave(self)  # (no step until there is a batch)
        mine, deadline = None, None
        with engine.cond:
            self.idle = True
            try:
                while True:
                    self._check(0)
                    if self.ready:
                        batch = self.ready.popleft()
                        break
                    if not self.encoding and (self._draining() or not self._live()):
                        now = time.monotonic()
                        deadline = deadline or now + LINGER_S
                        if self._draining() or engine.closing or now >= deadline:
                            self.stopped = True  # (at once: the encoding thread takes nothing for a search that ends)
                            return None
                        self.cond.wait(deadline - now)  # (a request of the same settings soon: this thread takes it)
                        continue
                    if not self.encoding:  # sentences wait and the search has room (nothing runs)
                        mine = self._take(self._room())
                        self.encoding = mine.src.size(0)
                        break
                    self.cond.wait()
            finally:
                self.idle = False
                if self.group.waiting:
                    self.cond.notify_all()  # (the encoding thread passed them over while this one waited)
        if mine is not None:
            try:
                batch = mine._replace(cache=encode_batch(engine.translator.model, mine.src, mine.src_pad_mask))
            finally:
                with engine.cond:
                    self.encoding = 0
                    self.cond.notify_all()
        engine.turns.take(self, len(self.requests))
        return batch

    def _live(self) -> int:
        """Waiting sentences whose requests still want them (cancelled ones are dropped here)."""
        waiting = self.group.waiting
        dropped = 0
        for _ in range(len(waiting)):
            item = waiting.popleft()
            if item[1].cancelled:
                dropped += 1
            else:
                waiting.append(item)
        if dropped:
            self.engine._finished(dropped, dropped=True)
        return len(waiting)

    def _take(self, room: int) -> Sources:
        """The oldest waiting sentences as one batch: at most `room` sentences and the engine's max_tokens padded
        tokens (always at least one sentence)."""
        waiting, tr = self.group.waiting, self.engine.translator
        taken: list[tuple[Job, int]] = []
        width = 0
        while waiting and len(taken) < max(1, room):
            _, job, i, _ = waiting[0]
            w = max(width, len(job.sources[i]))
            if taken and w * (len(taken) + 1) > self.engine.max_tokens:
                break
            waiting.popleft()
            taken.append((job, i))
            width = w
        for row, (job, i) in enumerate(taken):
            self.owners[self.next_id + row] = (job, i)
            self.requests[job] += 1
        self.next_id += len(taken)
        self.engine.batches += 1
        return source_batch([job.sources[i] for job, i in taken], tr.device)

    def done(self, sentence: int, hyps: list[Hypothesis]) -> None:
        job, i = self.owners.pop(sentence)
        tr = self.engine.translator
        tr.src_tokens += len(job.sources[i])
        tr.tgt_tokens += len(hyps[0].tokens) + 1 if hyps else 0
        job.results[i] = hyps
        with self.engine.cond:
            self._release(job)
            self.engine._finished(1)
            job.remaining -= 1
            last = job.remaining == 0
        if last:
            job.on_finish(job)

    def _release(self, job: Job) -> None:
        """(holding the lock) One of `job`'s sentences left the search."""
        self.requests[job] -= 1
        if not self.requests[job]:
            del self.requests[job]

    def fail(self, message: str) -> None:
        """The search failed: every request with a sentence in it fails (once)."""
        jobs = {job for job, _ in self.owners.values()}
        with self.engine.cond:
            self.engine._finished(len(self.owners), dropped=True)
            self.owners.clear()
            self.requests.clear()
            for job in jobs:  # its sentences still waiting are dropped too
                job.cancel()
            self.engine.cancellations += 1
        for job in jobs:
            job.error = message
            job.on_finish(job)

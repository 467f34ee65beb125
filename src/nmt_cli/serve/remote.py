"""The decoding engine in a process of its own (`nmt serve --engine-process`), so that the HTTP side's Python work
never holds the decoding's GIL.

In one process, the event loop (HTTP, JSON, tokenizing, answers) and the decoding thread take Python's GIL in turn:
the decoding thread waits for it, and the server falls short of the same engine fed without HTTP
(docs/results-history.md#the-engine-in-a-process-of-its-own). Here the HTTP process keeps everything but the decoding: it
parses, checks, tokenizes, counts the queue and answers, and sends each request's token ids through a pipe to an
engine process (spawned, so no thread or lock state is inherited) that runs the usual `Engine` (engine.py) and sends
each request's hypotheses back when its last sentence is done. vLLM's V1 engine splits its API server and engine
core the same way, for the same reason.

`RemoteEngine` has the `Engine` interface the service uses (`submit`, `cancel`, `config`, `stats`, `close`,
`default`, `max_tokens`, `translator`): the queue bound and Retry-After are decided in the HTTP process, from its own
count. The engine process ignores SIGINT and SIGTERM (a terminal's Ctrl-C reaches the whole process group): the HTTP
process stops it by a message, after the requests in flight, and it exits by itself when the HTTP process is gone.
If it dies, the requests it held fail (500) and later ones are refused (503).
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import queue
import signal
import threading
import time
from collections.abc import Callable

from nmt_cli.decoding import SearchConfig
from nmt_cli.errors import NmtError
from nmt_cli.inference import allocator
from nmt_cli.inference.translate import Translator
from nmt_cli.serve.engine import Engine, Job, QueueFull, Stopping, Throughput, retry_after

READY_TIMEOUT_S = 600  # loading a large model from a slow disk
STATS_TIMEOUT_S = 1.0  # /info waits this long for the engine process's counters, then shows the last ones it sent


class EngineProcessError(NmtError):
    """The engine process could not start (its message says why; `--no-engine-process` serves without one)."""


def _serve(conn, spec: dict, queue_size: int, name: str) -> None:
    """The engine process: load the model as `nmt serve` does, then run an Engine on the pipe's requests."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from nmt_cli.inference import translate as core

    try:
        core.set_threads(spec["threads"])
        ckpts = core.load_checkpoints([spec["model"]])
        translator = core.Translator(ckpts, spec["device"], spec["precision"], spec["config"],
                                     core.Warner(lambda message: None))
        engine = Engine(translator, queue_size, name)
    except Exception as exc:  # reported to the HTTP process, which fails to start with it
        conn.send(("error", f"{type(exc).__name__}: {exc}".splitlines()[0]))
        return
    conn.send(("ready", {"max_tokens": engine.max_tokens, "parameters": engine.parameters}))
    send_lock, jobs_lock = threading.Lock(), threading.Lock()
    jobs: dict[int, Job] = {}  # the running requests, for cancel
    early: set[int] = set()  # requests finished before `submit_ids` returned (no line to decode, or fast)

    def send(message) -> None:
        with send_lock:
            conn.send(message)

    def finished(number: int) -> Callable[[Job], None]:
        def on_finish(job: Job) -> None:  # in the engine's worker thread (or in submit_ids)
            with jobs_lock:
                if jobs.pop(number, None) is None:
                    early.add(number)
            send(("done", number, job.results, job.error))
        return on_finish

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the HTTP process is gone
            engine.close(wait=False)
            return
        kind = message[0]
        if kind == "submit":
            _, number, sources, cfg = message
            try:
                job = engine.submit_ids(sources, cfg, finished(number))
            except (QueueFull, Stopping) as exc:  # (the HTTP process's count keeps this from happening)
                send(("done", number, None, str(exc)))
                continue
            with jobs_lock:
                if number in early:
                    early.discard(number)
                else:
                    jobs[number] = job
        elif kind == "cancel":
            with jobs_lock:
                job = jobs.pop(message[1], None)
            if job is not None:
                engine.cancel(job)
        elif kind == "stats":
            with jobs_lock:
                running = len(jobs)
            send(("stats", message[1], {**engine.stats(), "engine_process_requests": running}))
        elif kind == "close":
            engine.close(wait=True)
            send(("closed",))
            return


class RemoteEngine:
    """An Engine run by a process of its own (see the module docstring). `translator`: the HTTP process's, for its
    tokenizer and settings (its model is dropped once the engine process has loaded its own); `spec`: how that
    process loads the model (`model`, `device`, `precision`, `config` (a TranslateConfig), `threads`)."""

    def __init__(self, translator: Translator, spec: dict, max_queue: int = 1024, name: str = "nmt-engine"):
        self.translator = translator
        self.default = translator.config.search
        self.max_queue = max_queue
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, spec, max_queue, name), name=name, daemon=True)
        self.process.start()
        child.close()
        if not self.conn.poll(READY_TIMEOUT_S):
            self.process.kill()
            raise EngineProcessError(f"the engine process for {spec['model']} did not start within "
                                     f"{READY_TIMEOUT_S} s")
        try:
            kind, info = self.conn.recv()
        except EOFError:
            raise EngineProcessError(f"the engine process for {spec['model']} died while loading the model "
                                     f"(exit code {self.process.exitcode})") from None
        if kind == "error":
            raise EngineProcessError(f"the engine process could not load {spec['model']}: {info} (try "
                                     "--no-engine-process)")
        self.max_tokens = info["max_tokens"]
        self.parameters = info["parameters"]
        translator.model = None  # the engine process has its own; this one only tokenizes
        gc.collect()
        allocator.give_back()
        if translator.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.jobs: dict[int, tuple[Job, int]] = {}  # number -> (job, its sentences counted in the queue)
        self.numbers = itertools.count()
        self.queued = 0
        self.answered = Throughput()
        self.closing = False
        self.dead: str | None = None  # why the engine process is gone
        self.replies: queue.Queue = queue.Queue()  # stats answers: (number, counters)
        self.asked = itertools.count()  # stats questions, numbered so that a late answer is never taken for another
        self.stats_lock = threading.Lock()
        self.last_stats: dict = {}  # the engine process's counters as it last sent them
        self.closed = threading.Event()
        self.reader = threading.Thread(target=self._read, name=f"{name}-reader", daemon=True)
        self.reader.start()

    # ------------------------------------------------------------------ the Engine interface

    config = Engine.config  # the default search with a request's options over it
    submit = Engine.submit  # tokenized here, then `submit_ids`

    def submit_ids(self, sources: list[list[int]], cfg: SearchConfig, on_finish: Callable[[Job], None]) -> Job:
        todo = sum(1 for s in sources if s)
        job = Job(sources, cfg, (), on_finish, [None] * len(sources))
        with self.lock:
            if self.closing or self.dead:
                raise Stopping("the server is stopping" if self.closing else self.dead)
            if todo and self.queued + todo > self.max_queue:
                raise QueueFull(retry_after(self.queued, self.answered.rate))
            number = next(self.numbers)
            self.jobs[number] = (job, todo)
            self.queued += todo
            job.seq = number
        self._send(("submit", number, sources, cfg))
        return job

    def cancel(self, job: Job) -> None:
        """Give up `job` (its request timed out): its sentences leave the engine process's search and the queue."""
        job.cancel()
        with self.lock:
            entry = self.jobs.pop(job.seq, None)
            if entry is not None:
                self.queued -= entry[1]
        self._send(("cancel", job.seq))

    def stats(self) -> dict:
        with self.lock:
            front = {"queued": self.queued, "translated": self.answered.done,
                     "sentences_per_second": round(self.answered.rate, 2)}
        if self.dead:
            return {**self.last_stats, **front}
        with self.stats_lock:  # one question at a time
            number = next(self.asked)
            self._send(("stats", number))
            deadline = time.monotonic() + STATS_TIMEOUT_S
            while (left := deadline - time.monotonic()) > 0:  # a stopped or starved engine process: the last ones
                try:
                    answered, counters = self.replies.get(timeout=left)
                except queue.Empty:
                    break
                self.last_stats = counters
                if answered == number:
                    break
            return {**self.last_stats, **front}

    def close(self, wait: bool = True, timeout: float | None = None) -> None:
        """Take no new work; the engine process finishes what it accepted, answers it, and ends."""
        with self.lock:
            first, self.closing = not self.closing, True
        if first and not self.dead:
            self._send(("close",))
        if wait:
            self.closed.wait(timeout)
            self.process.join(timeout)

    # ------------------------------------------------------------------ the pipe

    def _send(self, message) -> None:
        try:
            with self.send_lock:
                self.conn.send(message)
        except (OSError, ValueError):  # the engine process is gone: the reader fails the requests
            pass

    def _read(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                self._died()
                return
            kind = message[0]
            if kind == "done":
                _, number, results, error = message
                with self.lock:
                    entry = self.jobs.pop(number, None)
                    if entry is None:  # cancelled
                        continue
                    job, todo = entry
                    self.queued -= todo
                    self.answered.add(todo)
                if results is not None:
                    job.results = results
                job.error = error
                job.on_finish(job)
            elif kind == "stats":
                self.replies.put(message[1:])
            elif kind == "closed":
                self.closed.set()
                return

    def _died(self) -> None:
        self.process.join(1)
        with self.lock:
            self.dead = (f"the decoding engine process died (exit code {self.process.exitcode}); restart nmt serve "
                         "(out of memory? lower --queue-size or --max-tokens)")
            failed = list(self.jobs.values())
            self.jobs.clear()
            self.queued = 0
        for job, _ in failed:
            job.error = self.dead
            job.on_finish(job)
        self.closed.set()


class EnginePool:
    """Several engine processes for one model, as offline translation's decoding streams (CPU, 2 threads or more):
    each request goes whole to the one with the fewest sentences queued; the queue bound holds over all of them.
    The `Engine` interface again (cancel goes to the request's engine; counters are summed)."""

    def __init__(self, engines: list[RemoteEngine], max_queue: int):
        self.engines = engines
        first = engines[0]
        self.translator, self.default, self.max_tokens = first.translator, first.default, first.max_tokens
        self.parameters = first.parameters
        self.max_queue = max_queue
        self.lock = threading.Lock()
        self.owners: dict[int, RemoteEngine] = {}  # id(job) -> its engine, while it may be cancelled

    config = Engine.config
    submit = Engine.submit  # tokenized here, then `submit_ids`

    def submit_ids(self, sources: list[list[int]], cfg: SearchConfig, on_finish: Callable[[Job], None]) -> Job:
        todo = sum(1 for s in sources if s)
        with self.lock:
            live = [e for e in self.engines if not e.dead]
            if not live:
                raise Stopping(self.engines[0].dead)
            queued = sum(e.queued for e in self.engines)
            if todo and queued + todo > self.max_queue:
                raise QueueFull(retry_after(queued, sum(e.answered.rate for e in self.engines)))
            engine = min(live, key=lambda e: e.queued)

            def finished(job: Job) -> None:
                with self.lock:
                    self.owners.pop(id(job), None)
                on_finish(job)

            job = engine.submit_ids(sources, cfg, finished)
            self.owners[id(job)] = engine
        return job

    def cancel(self, job: Job) -> None:
        with self.lock:
            engine = self.owners.pop(id(job), None)
        if engine is not None:
            engine.cancel(job)

    def stats(self) -> dict:
        total: dict = {"engine_processes": len(self.engines)}
        for engine in self.engines:
            for name, value in engine.stats().items():
                total[name] = total.get(name, 0) + value
        total["sentences_per_second"] = round(total.get("sentences_per_second", 0.0), 2)
        return total

    def close(self, wait: bool = True, timeout: float | None = None) -> None:
        for engine in self.engines:
            engine.close(wait=False)
        if wait:
            for engine in self.engines:
                engine.close(wait=True, timeout=timeout)

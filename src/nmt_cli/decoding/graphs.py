"""CUDA graphs of the whole decoding step (the scheduler's `decode_step`), recorded once and replayed as one launch:
a step of a 6-layer model is some 300 small kernels, and launched one by one the host sets the pace
(docs/results-history.md#cuda-graphs-of-the-decoding-step).

A step is replayable when it reads no host value that changes from step to step (`t` is a [1] device tensor, the
cache's position too; the steps where the host decides something run eagerly: `graphable`) and reads and writes
the same memory (`in_place`; the static cache reorders its slot tables in place). A graph is keyed by the
addresses, shapes and strides of the state's and the cache's tensors and by the search's settings (`step_key`); a
new key records a new graph. Graphs share one memory pool; the least recently used go past GRAPH_LIMIT. On a CPU the
same object runs the step eagerly with `t` as a tensor (`replay=False`): how tests check a graph's arithmetic.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import OrderedDict
from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch import Tensor

from nmt_cli.decoding.config import SearchConfig

GRAPH_LIMIT = 32  # graphs kept (least recently used dropped)
GPU_CHECK_EVERY = 4  # host checks on a GPU: each one waits for the device to finish its queued steps


class StepGraphs:
    """Records and replays the decoding step (module docstring). One per model and device; `run` is all the
    scheduler calls. Counts (`recorded`, `replayed`, `eager`) say what happened, for tests and benchmarks."""

    def __init__(self, device, replay: bool | None = None, limit: int = GRAPH_LIMIT):
        self.device = torch.device(device)
        self.replay = self.device.type == "cuda" if replay is None else replay
        self.limit = limit
        self.t = torch.zeros(1, dtype=torch.long, device=self.device)  # the step number a graph reads
        self.graphs: OrderedDict[tuple, object] = OrderedDict()
        self.warm = not self.replay  # a first step runs eagerly on the recording stream (lazy library set-up)
        self.broken: str | None = None  # why recording failed (then every step runs eagerly)
        self.check_syncs = False  # tests: any host sync within a step raises (torch.cuda.set_sync_debug_mode)
        self.recorded = self.replayed = self.eager = 0
        if self.replay:
            self.pool = torch.cuda.graph_pool_handle()
            self.stream = torch.cuda.Stream(self.device)

    def run(self, key: tuple, body: Callable[[int | Tensor], None], t: int) -> None:
        """Run one step: `body(t)` with the host's int, or the graph recorded for `key` with `self.t` = t."""
        graph = self.graphs.get(key)
        if graph is not None:
            self.graphs.move_to_end(key)
            self.t.fill_(t)
            with self._no_syncs():
                graph.replay() if self.replay else body(self.t)
            self.replayed += 1
            return
        if self.broken is None and not self.warm:
            with self._on_stream(), self._no_syncs():
                body(t)
            self.warm = True
            self.eager += 1
            return
        if self.broken is not None:
            with self._no_syncs():
                body(t)
            self.eager += 1
            return
        self.t.fill_(t)
        graph = self._record(body) if self.replay else body
        if graph is None:  # recording failed: this step eagerly, and every later one
            with self._no_syncs():
                body(t)
            self.eager += 1
            return
        self.graphs[key] = graph
        if len(self.graphs) > self.limit:
            self.graphs.popitem(last=False)
        self.recorded += 1
        with self._no_syncs():
            graph.replay() if self.replay else body(self.t)
        self.replayed += 1

    def _record(self, body) -> torch.cuda.CUDAGraph | None:
        graph = torch.cuda.CUDAGraph()
        try:
            with self._on_stream():
                graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
                try:
                    body(self.t)
                finally:
                    graph.capture_end()
        except RuntimeError as exc:  # an operation a graph cannot hold: decode eagerly from now on
            self.broken = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            warnings.warn(f"CUDA graphs turned off for this run: recording a decoding step failed ({self.broken}); "
                          "decoding goes on without them (slower). Please report this.", RuntimeWarning, stacklevel=3)
            return None
        return graph

    @contextmanager
    def _on_stream(self):
        """Work on the recording stream (graphs are recorded off the default stream), ordered after and before the
        caller's stream."""
        if not self.replay:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            yield
        torch.cuda.current_stream(self.device).wait_stream(self.stream)

    @contextmanager
    def _no_syncs(self):
        if not (self.check_syncs and self.device.type == "cuda"):
            yield
            return
        before = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(before)


def graphable(model, cache, state, cfg: SearchConfig, t: int) -> bool:
    """Whether step t can run as a graph: a single model's static step over static caches, no sampling (its
    generator), no n-gram bans (their history grows), no forced prefix token and no row at its maximum length at
    this step (the host decides those)."""
    if not hasattr(model, "static_step") or not hasattr(cache, "segments"):
        return False
    if cfg.sampling or cfg.no_repeat_ngram or not all(s.static for s in cache.segments):
        return False
    if state.prefix is not None and t - max(state.begin) < state.prefix.size(1):
        return False
    return min(state.max_len_host) > t + 1  # (else `force_eos(t)` masks rows)


def step_key(state, cache, cfg: SearchConfig, search) -> tuple:
    """What a recorded step depends on: the search and its settings, and the addresses, shapes and strides of the
    state's and the cache's tensors (`SearchState.key`, `Cache.key`: ints each keeps)."""
    return type(search).__name__, dataclasses.astuple(cfg), state.key(), cache.key()


def in_place(body: Callable[[int | Tensor], None], state) -> Callable[[int | Tensor], None]:
    """`body` (the scheduler's step), with the state's tensors that it replaced (`state.tokens = ...`) copied back
    into the ones it began with: a replay must read and write the same memory every time. The tensors are the
    state's `tensors()`, the same list its graph key is made of."""

    def step(t: int | Tensor) -> None:
        before = {name: v for name, v in state.tensors().items() if v is not None}
        body(t)
        for name, old in before.items():
            new = getattr(state, name)
            if new is not old and new.shape == old.shape:  # (a cache made for another size stays new)
                old.copy_(new)
                setattr(state, name, old)

    return step


def layout_key(*tensors: Tensor | None) -> tuple:
    """Each tensor's address, shape and strides as ints (0 for an absent one): what a recorded CUDA graph depends on."""
    out: list[int] = []
    for x in tensors:
        out += (0,) if x is None else (x.data_ptr(), *x.shape, *x.stride())
    return tuple(out)

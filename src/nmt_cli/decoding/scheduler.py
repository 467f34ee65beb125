"""The one decoding loop: batches in, hypotheses out, for every search (beam, greedy, sampling), ensemble and device.

A step (`decode_step`): the model's step over the cache -> log-softmax -> the constraints -> the search's `select`
and `advance` (tensor operations only). Every `check_every` steps the host reads which sentences are done: they
leave (hypotheses read once, rows dropped from the state and the cache), and the next batch may join.

`DecodeLoop` is that loop, in three parts: `admit` (a batch starts, or joins the running one), `step`, `check` (the
host check). Its batches come from a `Feed`: `BatchList` for batches given up front (continuous batching: once the
running batch is down to `join_below` x the next batch's sentences, the next batch joins it, a cache segment of its
own, steps counted from the step it joined at, so the last few-row steps of a batch are shared with the next one's
first), or a server's live feed (new work joins at any host check, and `on_done` reports each sentence as it
finishes). `decode_batches` builds the loop and runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from itertools import accumulate
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.decoding.batch import Kept, Sources
from nmt_cli.decoding.beam import BeamSearch
from nmt_cli.decoding.candidates import Candidates, Shortlisting
from nmt_cli.decoding.config import Hypothesis, SearchConfig, max_output_lengths
from nmt_cli.decoding.constraints import constrain, prefix_tensor
from nmt_cli.decoding.graphs import GPU_CHECK_EVERY, StepGraphs, graphable, in_place, step_key
from nmt_cli.decoding.sampling import Sampling
from nmt_cli.decoding.state import SearchState

JOIN_BELOW = 0.5  # the next batch joins once the running one is down to half its size (measured: docs/results-history.md#continuous-batching-machine-d-ninth-session)
CHECK_EVERY = 1  # host checks on CPU, where reading a flag costs nothing and finished sentences leaving at once pays
CHECK_SYNCS = False  # tests, on a GPU: a step between two host checks that waits for the device raises

# A batch: Sources (config.py: ids, padding mask, host lengths, maybe its decoder cache), or a plain (src, src_pad_mask)
# whose lengths are read from the mask once (free on CPU; one wait on a GPU).
Batch = Sources | tuple[Tensor, Tensor | None]


class Stopped(Exception):
    """`decode_batches` was asked to stop (its `stop` argument)."""


class Feed(Protocol):
    """A live source of batches (for a server). Sentences count from 0 over all the batches handed out, in order:
    `on_done` names them by that number."""

    def poll(self, running: int) -> Batch | None:
        """At a host check while `running` sentences are being decoded: a batch to join them now, or None. Must
        not block."""

    def wait(self) -> Batch | None:
        """Nothing is running: block until there is a batch; None ends the decoding."""

    def abandoned(self, sentences: list[int]) -> list[int]:
        """At a host check: the positions in `sentences` (the running sentences' numbers) of those nobody waits
        for any more (a request that timed out); they leave the search unreported. Must be cheap."""


def algorithm(cfg: SearchConfig, generator: torch.Generator | None = None, device="cpu") -> BeamSearch | Sampling:
    """Sampling when asked (seeded with `cfg.seed` when no generator is given), greedy search for beam 1, else beam
    search."""
    if cfg.sampling:
        if generator is None:
            generator = torch.Generator(device=device)
            if cfg.seed is not None:
                generator.manual_seed(cfg.seed)
        return Sampling(cfg, generator)
    return Sampling(cfg) if cfg.beam == 1 else BeamSearch(cfg)


class BatchList:
    """Batches given up front, as a Feed: the next one joins the running search once it is down to `join_below` x
    the next batch's sentences (0: the batches one after the other). Each batch's prefixes (one list per sentence, or
    None) come with it."""

    def __init__(self, batches: Iterable[Batch], prefixes: Iterable[list[list[int]] | None] | None, join_below: float):
        self._batches = iter(batches)
        self._prefixes = iter(prefixes) if prefixes is not None else None
        self.join_below = join_below
        self._next = self._take()

    def _take(self) -> Sources | None:
        batch = next(self._batches, None)
        if batch is None:
            return None
        prefix = next(self._prefixes) if self._prefixes is not None else None
        return _sources(batch)._replace(prefix=prefix)

    def poll(self, running: int) -> Sources | None:
        upcoming = self._next
        if upcoming is None or not self.join_below or running > self.join_below * upcoming.src.size(0):
            return None
        return self.wait()

    def wait(self) -> Sources | None:
        upcoming, self._next = self._next, self._take()
        return upcoming

    def abandoned(self, sentences: list[int]) -> list[int]:
        return []


class DecodeLoop:
    """One search over a feed of batches (module docstring): `admit` starts a batch or joins it to the running one,
    `step` decodes one position of every row (eagerly, or as a recorded graph), `check` lets the finished sentences
    leave at a host check; `run` drives them. The step count `t` advances in `step` alone."""

    def __init__(self, model, cfg: SearchConfig, search: BeamSearch | Sampling, feed: Feed, device, *,
                 check_every: int | None = None, static: bool = False, graphs: StepGraphs | None = None,
                 on_done: Callable[[int, list[Hypothesis]], None] | None = None, stop: Callable[[], bool] | None = None,
                 candidates: Candidates | None = None):
        self.model, self.cfg, self.search, self.feed = model, cfg, search, feed
        self.candidates = candidates  # a shortlist's columns (candidates.py), or None: the whole vocabulary
        self.check_every = check_every or (CHECK_EVERY if device.type == "cpu" else GPU_CHECK_EVERY)
        self.static, self.graphs, self.on_done, self.stop = static, graphs, on_done, stop
        self.guard = CHECK_SYNCS and device.type == "cuda"  # (tests; the caller resets the mode)
        self.state: SearchState | None = None
        self.cache = None
        self.t = 0  # steps since the state began (less those trimmed when the first starters left)
        self.started = 0  # sentences begun
        self.results: list[list[Hypothesis]] = []  # per sentence, in batch order (not kept with on_done)
        self.sizes: list[int] = []

    def run(self, first: Batch) -> list[list[list[Hypothesis]]]:
        batch, checked = first, True  # checked: the host knows which sentences are done (right after a check)
        while True:
            if self.guard:
                torch.cuda.set_sync_debug_mode(0 if checked else "error")
            if self.state is None and batch is None:
                batch = self.feed.wait()
                if batch is None:
                    break
            elif self.state is not None and checked:
                batch = self.feed.poll(self.state.n)
            if batch is not None:
                self.admit(_sources(batch))
                batch = None
            self.step()
            checked = self.t % self.check_every == 0 or self.t >= max(self.state.max_len_host)  # (all must be done)
            if checked:
                self.check()
        if self.guard:
            torch.cuda.set_sync_debug_mode(0)
        results = [_ranked(hyps, self.cfg) for hyps in self.results] if self.search.beam else self.results
        ends = list(accumulate(self.sizes))
        return [results[end - size : end] for end, size in zip(ends, self.sizes, strict=True)]

    def admit(self, batch: Sources) -> None:
        """A batch starts (nothing running) or joins the running one at step t (its sentences count their steps and
        positions from there)."""
        src, n = batch.src, batch.src.size(0)
        prefix = prefix_tensor(batch.prefix, n, src.device)
        max_len = _max_len(self.model, batch.lengths, self.cfg, batch.prefix if prefix is not None else None)
        new = batch.cache if batch.cache is not None else encode_batch(self.model, src, batch.src_pad_mask,
                                                                        self.static)
        new.repeat_beams(self.search.per)  # `per` rows a sentence from its first step (beam copies: start -inf)
        new.expect(max(max_len))
        if self.state is None:
            self.cache, self.t = new, 0
            self.state = SearchState(self.search.per, n, max_len, prefix, self.started, src.device, self.search.beam)
        else:
            self.cache = self.cache.join(new)
            self.state.join(n, max_len, prefix, self.t, self.started)
        if self.candidates is not None:
            self.candidates.admit(src, prefix)
        self.started += n
        if self.on_done is None:
            self.results += [[] for _ in range(n)]
            self.sizes.append(n)

    def step(self) -> None:
        """One position of every row: a recorded graph where the step allows one, else eagerly."""
        model, cache, state, t = self.model, self.cache, self.state, self.t
        if self.graphs is not None and graphable(model, cache, state, self.cfg, t):
            cache.make_room(model.config.max_positions)  # (a new bucket: new buffers, and a new graph)
            state.first_rows()  # made before the key, not inside a recording
            body = in_place(partial(decode_step, model, cache, state, self.cfg, self.search), state)
            self.graphs.run(step_key(state, cache, self.cfg, self.search), body, t)
            cache.advance(device=False)  # the host's count (a replay runs no Python)
        else:
            decode_step(model, cache, state, self.cfg, self.search, t, self.candidates)
        self.t += 1

    def check(self) -> None:
        """A host check: the sentences done (or abandoned) leave, their hypotheses read once; with static caches
        only once at most half the batch is left (few shapes)."""
        if self.guard:
            torch.cuda.set_sync_debug_mode(0)  # the host check itself waits for the device
        if self.stop is not None and self.stop():
            raise Stopped("decoding stopped")
        state = self.state
        done = state.done.tolist()
        for i in self.feed.abandoned(state.ids):
            done[i] = None  # leaves, unreported
        leaving = [i for i, d in enumerate(done) if d is not False]
        if not leaving or (self.static and 2 * (len(done) - len(leaving)) > len(done)):
            return
        finished = [i for i in leaving if done[i]]
        found = state.hypotheses(finished, self.cfg.alpha, self.cfg.lp) if finished else []
        for i, hyps in zip(finished, found, strict=True):
            if self.on_done is None:
                self.results[state.ids[i]] = hyps
            else:
                self.on_done(state.ids[i], _ranked(hyps, self.cfg) if self.search.beam else hyps)
        if len(leaving) == len(done):
            self.state = self.cache = None
            if self.candidates is not None:
                self.candidates.keep([])
            return
        keep = [i for i, d in enumerate(done) if d is False]
        keep = Kept(keep if self.search.keeps_order else self.cache.order(keep))
        if self.candidates is not None:
            self.candidates.keep(keep)
        self.cache.reorder(state.keep(keep), keep)  # they leave after the step, the same on every path
        self.t -= state.trim()  # steps before the oldest unfinished sentence began


@torch.inference_mode()
def decode_batches(model, batches: Iterable[Batch], cfg: SearchConfig, prefixes: Iterable[list[list[int]] | None]
                   | None = None, generator: torch.Generator | None = None, join_below: float = JOIN_BELOW,
                   check_every: int | None = None, static: bool = False, search: BeamSearch | Sampling | None = None,
                   feed: Feed | None = None, on_done: Callable[[int, list[Hypothesis]], None] | None = None,
                   stop: Callable[[], bool] | None = None, graphs: StepGraphs | None = None,
                   shortlist: Shortlisting | None = None) -> list[list[list[Hypothesis]]]:
    """Search every batch -> per batch, per sentence, its hypotheses (best first; samples in the order drawn).

    `prefixes`: per batch, the target token ids each output must start with (one list per sentence), or None.
    `join_below` 0 runs the batches one after the other. `check_every`: steps between host checks (default 1 on
    CPU, GPU_CHECK_EVERY on a GPU, where a check waits for the device). `static`: static caches (compiled steps,
    graphs); done sentences then leave only once at most half the batch is left (few shapes). `search`: the
    algorithm (default `algorithm(cfg, generator)`). `feed`: a live Feed instead of `batches`; its batches join
    whenever `poll` gives one, and decoding ends when `wait` gives None. `on_done(sentence, hypotheses)`: called as
    each sentence finishes (the result is then []). `stop()`: asked at each host check; True raises Stopped.
    `graphs`: the steps that allow it as CUDA graphs (graphs.py; needs `static`, no `feed`). `shortlist`: score
    only the candidates of a vocabulary shortlist (candidates.py; CPU decoding without graphs)."""
    cfg = cfg.validate()
    if graphs is not None and (feed is not None or not static):
        raise ValueError("graphs need static caches and batches given up front (no feed)")
    feed = feed if feed is not None else BatchList(batches, prefixes, join_below)
    first = feed.wait()
    if first is None:
        return []
    device = first[0].device
    search = search or algorithm(cfg, generator, device)
    candidates = shortlist.candidates(search.per) if shortlist is not None and graphs is None else None
    loop = DecodeLoop(model, cfg, search, feed, device, check_every=check_every, static=static, graphs=graphs,
                      on_done=on_done, stop=stop, candidates=candidates)
    return loop.run(first)


def decode_step(model, cache, state: SearchState, cfg: SearchConfig, search: BeamSearch | Sampling,
                t: int | Tensor, candidates: Candidates | None = None) -> None:
    """One step of every row, the same on every path: the model's step (one position more in the cache),
    log-softmax, the constraints, the search's `select` and `advance`, and the beams' moves in the cache. `t` is an
    int, or inside a CUDA graph a [1] device tensor: then the model's static step runs (the caller moves the
    cache's host count) and the host's constraints are absent (`graphable` says where none applies). With
    `candidates` (a shortlist) the log-probabilities are over its columns, mapped back to pieces by the search."""
    tokens = state.column(t)
    if candidates is not None:
        lprobs = _log_probs(model.step(tokens, cache, candidates))
        history = state.tokens[:, 1 : t + 1] if cfg.no_repeat_ngram else None
        constrain(lprobs, cfg, state.own_t(t) if cfg.min_len else t, state.force_eos(t), history, state.forced(t),
                  candidates.to_columns)
    elif isinstance(t, int):
        lprobs = _log_probs(model.step(tokens, cache))
        history = state.tokens[:, 1 : t + 1] if cfg.no_repeat_ngram else None
        constrain(lprobs, cfg, state.own_t(t) if cfg.min_len else t, state.force_eos(t), history, state.forced(t))
    else:
        lprobs = _log_probs(model.static_step(tokens, cache))
        cache.advance(host=False)
        constrain(lprobs, cfg, state.own_t(t) if cfg.min_len else t, None)
    rows = search.advance(state, t, search.select(state, t, lprobs, candidates))
    if rows is not None:  # beam search: the rows each continues (the cache moves its slot tables)
        cache.reorder(rows)


def _ranked(hyps: list[Hypothesis], cfg: SearchConfig) -> list[Hypothesis]:
    """Beam search's finished hypotheses, best first, the `cfg.nbest` best."""
    return sorted(hyps, key=lambda h: -h.score)[: cfg.nbest]


def encode_batch(model, src: Tensor, src_pad_mask: Tensor | None, static: bool = False):
    """A batch's decoder cache: its encoder output, projected into every layer's encoder-decoder keys and values."""
    return model.init_cache(model.encode(src, src_pad_mask), src_pad_mask, static)


def _sources(batch: Batch) -> Sources:
    """A batch as Sources: a plain (src, src_pad_mask[, decoder cache]) gets its lengths from the mask (one read)."""
    if isinstance(batch, Sources):
        return batch
    src, mask, *encoded = batch
    lengths = [src.size(1)] * src.size(0) if mask is None else (~mask).sum(1).tolist()
    return Sources(src, mask, lengths, encoded[0] if encoded else None)


def _max_len(model, lengths: list[int], cfg: SearchConfig, prefix: list[list[int]] | None) -> list[int]:
    """Maximum output lengths, on the host. A prefix of P tokens raises a sentence's maximum to at least P + 1 (the
    prefix and EOS)."""
    limit = getattr(getattr(model, "config", None), "max_positions", None)
    max_len = max_output_lengths(lengths, cfg, limit)
    if prefix is not None:
        max_len = [max(m, len(p) + 1) for m, p in zip(max_len, prefix, strict=True)]
    return max_len


def _log_probs(logits: Tensor) -> Tensor:
    """A step's logits [R, V] -> next-token log-probabilities [R, V] in float32."""
    if logits.device.type == "cpu" and logits.is_contiguous():
        # in place over the step's own logits: one [R, V] tensor less to allocate and fill
        logits = logits.float()
        return torch._log_softmax(logits, -1, False, out=logits)
    return F.log_softmax(logits, dim=-1, dtype=torch.float32)  # (a GPU: half logits read once, no float copy)


def search(model, src: Tensor, src_pad_mask: Tensor | None, cfg: SearchConfig,
           prefix: list[list[int]] | None = None, generator: torch.Generator | None = None,
           ) -> list[list[Hypothesis]]:
    """One batch: sampling when asked, else greedy search for beam 1 and beam search otherwise -> per sentence its
    hypotheses. `prefix`: target token ids each output must start with (one list per sentence)."""
    return decode_batches(model, [(src, src_pad_mask)], cfg, [prefix], generator)[0]


def beam_search(model, src: Tensor, src_pad_mask: Tensor | None, cfg: SearchConfig | None = None,
                prefix: list[list[int]] | None = None) -> list[list[Hypothesis]]:
    """Batched beam search (also with beam 1) -> per sentence, the `cfg.nbest` best hypotheses, best first."""
    cfg = (cfg or SearchConfig()).validate()
    return decode_batches(model, [(src, src_pad_mask)], cfg, [prefix], search=BeamSearch(cfg))[0]

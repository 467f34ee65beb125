"""The one decoding loop: batches in, hypotheses out, for every search (beam, greedy, sampling), ensemble and device.

A step (`decode_step`): the model's step over the cache -> log-softmax -> the constraints -> the search's `select`
and `advance` (tensor operations only). Every `check_every` steps the host reads which sentences are done: they
leave (hypotheses read once, rows dropped from the state and the cache), and the next batch may join.

Continuous batching: once the running batch is down to `join_below` x the next batch's sentences, the next batch
joins it (a cache segment of its own, steps counted from the step it joined at), so the last few-row steps of a
batch are shared with the next one's first. A server feeds the loop live (`Feed`): new work joins at a host check,
and `on_done` reports each sentence as it finishes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from itertools import accumulate
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.decoding.beam import BeamSearch
from nmt_cli.decoding.config import Hypothesis, Kept, SearchConfig, Sources, max_output_lengths
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


@torch.inference_mode()
def decode_batches(model, batches: Iterable[Batch], cfg: SearchConfig, prefixes: Iterable[list[list[int]] | None]
                   | None = None, generator: torch.Generator | None = None, join_below: float = JOIN_BELOW,
                   check_every: int | None = None, static: bool = False, search: BeamSearch | Sampling | None = None,
                   feed: Feed | None = None, on_done: Callable[[int, list[Hypothesis]], None] | None = None,
                   stop: Callable[[], bool] | None = None, graphs: StepGraphs | None = None,
                   ) -> list[list[list[Hypothesis]]]:
    """Search every batch -> per batch, per sentence, its hypotheses (best first; samples in the order drawn).

    `prefixes`: per batch, the target token ids each output must start with (one list per sentence), or None.
    `join_below` 0 runs the batches one after the other. `check_every`: steps between host checks (default 1 on
    CPU, GPU_CHECK_EVERY on a GPU, where a check waits for the device). `static`: static caches (compiled steps,
    graphs); done sentences then leave only once at most half the batch is left (few shapes). `search`: the
    algorithm (default `algorithm(cfg, generator)`). `feed`: a live Feed instead of `batches`; its batches join
    whenever `poll` gives one, and decoding ends when `wait` gives None. `on_done(sentence, hypotheses)`: called as
    each sentence finishes (the result is then []). `stop()`: asked at each host check; True raises Stopped.
    `graphs`: the steps that allow it as CUDA graphs (graphs.py; needs `static`, no `feed`)."""
    cfg = cfg.validate()
    if graphs is not None and (feed is not None or not static):
        raise ValueError("graphs need static caches and batches given up front (no feed)")
    pending = iter(batches) if feed is None else iter(())
    upcoming = next(pending, None) if feed is None else feed.wait()
    if upcoming is None:
        return []
    search = search or algorithm(cfg, generator, upcoming[0].device)
    if check_every is None:
        check_every = CHECK_EVERY if upcoming[0].device.type == "cpu" else GPU_CHECK_EVERY
    per = search.per
    results: list[list[Hypothesis]] = []  # per sentence, in batch order (not kept with on_done)
    sizes: list[int] = []
    started = 0  # sentences begun
    prefix_iter = iter(prefixes) if prefixes is not None else None
    state: SearchState | None = None
    t = 0
    checked = True  # the host knows which sentences are done (right after a check)
    guard = CHECK_SYNCS and upcoming[0].device.type == "cuda"  # (tests; the caller resets the mode)
    while upcoming is not None or state is not None or feed is not None:
        if guard:
            torch.cuda.set_sync_debug_mode(0 if checked else "error")
        if feed is not None and upcoming is None:
            if state is None:
                upcoming = feed.wait()
                if upcoming is None:
                    break
            elif checked:
                upcoming = feed.poll(state.n)
        if state is None or (checked and upcoming is not None and (
                feed is not None or (join_below and state.n <= join_below * upcoming[0].size(0)))):
            src, src_pad_mask, lengths, encoded = _sources(upcoming)
            upcoming = next(pending, None)
            prefix_ids = next(prefix_iter) if prefix_iter else None
            prefix = prefix_tensor(prefix_ids, src.size(0), src.device)
            max_len = _max_len(model, lengths, cfg, prefix_ids if prefix is not None else None)
            new = encoded if encoded is not None else encode_batch(model, src, src_pad_mask, static)
            new.repeat_beams(per)  # `per` rows a sentence from its first step (beam copies: start scores -inf)
            n = src.size(0)
            if state is None:
                cache, t = new, 0
                state = SearchState(per, n, max_len, prefix, started, src.device, search.beam)
            else:  # join the running batch at step t (> 0)
                cache = cache.join(new)
                state.join(n, max_len, prefix, t, started)
            started += n
            if on_done is None:
                results += [[] for _ in range(n)]
                sizes.append(n)
        if graphs is not None and graphable(model, cache, state, cfg, t):
            cache.make_room(model.config.max_positions)  # (a new bucket: new buffers, and a new graph)
            state.first_rows()  # made before the key, not inside a recording
            body = in_place(partial(decode_step, model, cache, state, cfg, search), state)
            graphs.run(step_key(state, cache, cfg, search), body, t)
            cache.advance(device=False)  # the host's count (a replay runs no Python)
        else:
            decode_step(model, cache, state, cfg, search, t)
        checked = (t + 1) % check_every == 0 or t + 1 >= max(state.max_len_host)  # (all must be done)
        if checked:
            if guard:
                torch.cuda.set_sync_debug_mode(0)  # the host check itself waits for the device
            if stop is not None and stop():
                raise Stopped("decoding stopped")
            done = state.done.tolist()
            if feed is not None:
                for i in feed.abandoned(state.ids):
                    done[i] = None  # leaves, unreported
            leaving = [i for i, d in enumerate(done) if d is not False]
            # static shapes: done sentences stay in place, masked, until at most half the batch is left
            if leaving and (not static or 2 * (len(done) - len(leaving)) <= len(done)):
                finished = [i for i in leaving if done[i]]
                found = state.hypotheses(finished, cfg.alpha, cfg.lp) if finished else []
                for i, hyps in zip(finished, found, strict=True):
                    if on_done is None:
                        results[state.ids[i]] = hyps
                    else:
                        on_done(state.ids[i], _ranked(hyps, cfg) if search.beam else hyps)
                if len(leaving) == len(done):
                    state = None
                    continue
                keep = [i for i, d in enumerate(done) if d is False]
                keep = Kept(keep if search.keeps_order else cache.order(keep))
                cache.reorder(state.keep(keep), keep)  # they leave after the step, the same on every path
                t -= state.trim()  # steps before the oldest unfinished sentence began
        t += 1
    if guard:
        torch.cuda.set_sync_debug_mode(0)
    if search.beam:
        results = [_ranked(hyps, cfg) for hyps in results]
    ends = list(accumulate(sizes))
    return [results[end - size : end] for end, size in zip(ends, sizes, strict=True)]


def decode_step(model, cache, state: SearchState, cfg: SearchConfig, search: BeamSearch | Sampling,
                t: int | Tensor) -> None:
    """One step of every row, the same on every path: the model's step (one position more in the cache),
    log-softmax, the constraints, the search's `select` and `advance`, and the beams' moves in the cache. `t` is an
    int, or inside a CUDA graph a [1] device tensor: then the model's static step runs (the caller moves the
    cache's host count) and the host's constraints are absent (`graphable` says where none applies)."""
    tokens = state.column(t)
    if isinstance(t, int):
        lprobs = _log_probs(model.step(tokens, cache))
        history = state.tokens[:, 1 : t + 1] if cfg.no_repeat_ngram else None
        constrain(lprobs, cfg, state.own_t(t) if cfg.min_len else t, state.force_eos(t), history, state.forced(t))
    else:
        lprobs = _log_probs(model.static_step(tokens, cache))
        cache.advance(host=False)
        constrain(lprobs, cfg, state.own_t(t) if cfg.min_len else t, None)
    rows = search.advance(state, t, search.select(state, t, lprobs))
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

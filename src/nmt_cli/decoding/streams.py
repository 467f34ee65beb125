"""Several decoding streams over one input's batches, each on a thread of its own (CPU), as CTranslate2's
`inter_threads` (`nmt translate --workers N`).

A step is many small operations; one stream of two intra-op threads waits at each for the slower thread (and runs
its Python with the other core idle), which a busy neighbour makes far slower, while two streams of one thread keep
both cores busy (PyTorch releases the GIL), at the memory of a second working set
(docs/results.md#cpu-decoding-mechanisms). The caller deals batches to streams from the input alone
(translate.stream_batches), never from timing, so the same input gives the same output on every run.

Two streams are the default only for small models (`default_streams`: below TWO_STREAMS_BELOW parameters), whose
steps are short enough for the host's share of each to count: on the Multi30k model (7.6M parameters, with its
vocabulary shortlist) two streams were 1.06-1.10x as fast as one, at ~1.2x the peak memory. A larger model's step
keeps two intra-op threads busy on one stream (the paper's base shape: 1.00-1.03x), and two working sets cost it
1.5x the memory.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from nmt_cli.decoding.candidates import Shortlisting
from nmt_cli.decoding.config import Hypothesis, SearchConfig
from nmt_cli.decoding.scheduler import Batch, Stopped, decode_batches

TWO_STREAMS_BELOW = 10_000_000  # parameters of the largest model (an ensemble's largest member): see the docstring


def default_streams(threads: int, parameters: int) -> int:
    """Decoding streams when the caller does not say: two on two threads or more for a model of fewer than
    TWO_STREAMS_BELOW `parameters`, else one (module docstring)."""
    return 2 if threads >= 2 and parameters < TWO_STREAMS_BELOW else 1


def decode_streams(model, batches: Sequence[Batch], cfg: SearchConfig, prefixes: Sequence | None,
                   owner: Sequence[int], join_below: float, generator: torch.Generator | None = None,
                   shortlist: Shortlisting | None = None, **options) -> list[list[list[Hypothesis]]]:
    """`decode_batches` over `batches`, batch i by stream `owner[i]` (0, 1, ...; each its own thread) -> per batch,
    per sentence, its hypotheses (as decode_batches). While they run, each stream has torch.get_num_threads() //
    streams intra-op threads (at least one); the count is restored afterwards. One stream is decode_batches itself.
    Sampling's draws would depend on which stream draws first: give it one stream (the caller's job; ValueError
    otherwise). `options` go to decode_batches (one stream only: a GPU's static caches and CUDA graphs)."""
    owners = sorted(set(owner))
    if len(owners) <= 1:
        return decode_batches(model, batches, cfg, prefixes, generator, join_below, shortlist=shortlist, **options)
    if options:
        raise ValueError(f"decoding options {sorted(options)} need one stream")
    if cfg.sampling:
        raise ValueError("sampling draws from one generator: decode it as one stream")
    streams = len(owners)
    results: list[list[list[Hypothesis]] | None] = [None] * len(batches)
    errors: list[BaseException] = []
    stop = threading.Event()  # the caller was interrupted (Ctrl-C) or a stream failed: the others end too
    ended = [threading.Event() for _ in range(streams)]

    def run(k: int) -> None:
        mine = [i for i, o in enumerate(owner) if o == owners[k]]
        try:
            found = decode_batches(model, (batches[i] for i in mine), cfg,
                                   (prefixes[i] for i in mine) if prefixes is not None else None,
                                   join_below=join_below, stop=stop.is_set, shortlist=shortlist)
            for i, hyps in zip(mine, found, strict=True):
                results[i] = hyps
        except Stopped:
            pass
        except BaseException as exc:  # raised again in the caller's thread
            errors.append(exc)
            stop.set()
        finally:
            ended[k].set()

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, before // streams))  # a new thread takes this count at its first operation
    try:
        threads = [threading.Thread(target=run, args=(k,), name=f"nmt-decode-{k}", daemon=True)
                   for k in range(streams)]
        # On Ctrl-C the streams end at their next step, before the process does (a stream still running at exit
        # aborts the process in PyTorch's C++). Waited for by events, not Thread.join: once interrupted, Python
        # 3.11's join takes the thread for ended (bpo-45274's fix) and later returns at once.
        try:
            for t in threads:
                t.start()
            for e in ended:
                e.wait()
        except BaseException:
            stop.set()
            for t, e in zip(threads, ended, strict=True):
                if t.ident is not None:  # started
                    e.wait()
            raise
    finally:
        torch.set_num_threads(before)
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]

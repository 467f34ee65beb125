"""Several decoding streams over one input's batches, each on a thread of its own (CPU), as CTranslate2's
`inter_threads`.

A decoding step is many small operations: PyTorch splits each over its intra-op threads and waits for the slowest,
and the step's Python, log-softmax, beam selection and cache gathers run mostly on one of them. Two streams with
one thread each keep both cores busy instead. PyTorch's operations release the GIL, so the streams overlap all but
their Python.

The caller says which stream decodes each batch (translate.stream_batches deals the sentences out by length, so
that the streams get equal work and end together), and each stream runs `decode_batches` over its own, continuous
batching included. The assignment depends only on the input, never on timing, so the same input gives the same
output every run. A stream's rows share steps with other batches than with one stream, which changes scores in
their last digits (float sums over other padded lengths), as any change of batching does; on 1000 Multi30k lines
the texts were the same.

One stream is the default (`nmt translate --workers N` asks for more). On a quiet 2-core machine two streams of
one thread were as fast as one stream of two threads (1.01x for the small Multi30k model) at 1.4x the peak memory:
each stream holds a working set of its own. Beside a busy neighbour two streams are several times faster, because a
stream of two intra-op threads waits at every operation for its slowest thread. The figures:
docs/results.md#cpu-decoding-mechanisms.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from nmt_cli.decoding.config import Hypothesis, SearchConfig
from nmt_cli.decoding.scheduler import Batch, Stopped, decode_batches


def decode_streams(model, batches: Sequence[Batch], cfg: SearchConfig, prefixes: Sequence | None,
                   owner: Sequence[int], join_below: float, generator: torch.Generator | None = None, **options,
                   ) -> list[list[list[Hypothesis]]]:
    """`decode_batches` over `batches`, batch i by stream `owner[i]` (0, 1, ...; each its own thread) -> per batch,
    per sentence, its hypotheses (as decode_batches). While they run, each stream has torch.get_num_threads() //
    streams intra-op threads (at least one); the count is restored afterwards. One stream is decode_batches itself.
    Sampling's draws would depend on which stream draws first: give it one stream (the caller's job; ValueError
    otherwise). `options` go to decode_batches (one stream only: a GPU's static caches and CUDA graphs)."""
    owners = sorted(set(owner))
    if len(owners) <= 1:
        return decode_batches(model, batches, cfg, prefixes, generator, join_below, **options)
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
                                   join_below=join_below, stop=stop.is_set)
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

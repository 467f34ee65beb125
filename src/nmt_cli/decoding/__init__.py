"""The one decoding engine (docs/design.md, "Decoding"): every search runs one incremental step of the model
(`model.step(last tokens, cache) -> logits`) over one cache type, in one loop.

  config.py       SearchConfig, Hypothesis, the length penalty, maximum output lengths, Sources (a batch)
  constraints.py  a step's constraints on the log-probabilities (tensor operations only)
  cache.py        the Cache interface and DecoderCache (preallocated, written by index; exact or static layout)
  state.py        the search state: rows, scores, finished hypotheses, all on the device
  beam.py         beam search; sampling.py: greedy search and sampling
  scheduler.py    the loop: batches in, host checks every k steps, finished sentences out, batches joining
  streams.py      several loops over one input's batches, each on a thread of its own (CPU)
"""

from nmt_cli.decoding.config import Hypothesis, SearchConfig, length_penalty, max_output_lengths
from nmt_cli.decoding.scheduler import (
    JOIN_BELOW,
    beam_search,
    decode_batches,
    encode_batch,
    search,
)

__all__ = ["JOIN_BELOW", "Hypothesis", "SearchConfig", "beam_search", "decode_batches", "encode_batch",
           "length_penalty", "max_output_lengths", "search"]

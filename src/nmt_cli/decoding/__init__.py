"""The one decoding engine (docs/design.md, "Decoding"): every search runs one incremental step of the model
(`model.step(last tokens, cache) -> logits`) over one cache type, in one loop. Read top-down:

  scheduler.py    the loop: batches in, host checks every k steps, finished sentences out, batches joining
  beam.py         beam search; sampling.py: greedy search and sampling (a search's `select` and `advance`)
  state.py        the search state: rows, scores, finished hypotheses, all on the device
  constraints.py  a step's constraints on the log-probabilities (tensor operations only)
  step.py         the model's incremental step around the cache (embedding, layers, output)
  cache.py        the Cache interface and DecoderCache: segments of rows, joins and merges, attention over the cache
  layout.py       how a segment stores and reads positions: Exact (CPU) or Static (compiled steps, CUDA graphs)
  slots.py        beam search's slot tables (a beam reorder moves a table, not the keys and values)
  offsets.py      merged segments' row offsets (sentences that began at different steps)
  attention.py    the attention arithmetic on 3-D batches (shared with alignments)
  graphs.py       the step recorded and replayed as CUDA graphs (and the tensor layout a graph depends on)
  streams.py      several loops over one input's batches, each on a thread of its own (CPU)
  config.py       SearchConfig, Hypothesis, the length penalty, maximum output lengths
  batch.py        Sources (a batch of sources on the device), the kept sentences' index, host-to-device copies
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

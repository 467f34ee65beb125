"""The search API under its earlier name: `from nmt_cli.search import SearchConfig, search, ...` keeps working.
The engine itself is the `nmt_cli.decoding` package; ensembles are `nmt_cli.ensemble`."""

from nmt_cli.decoding import (
    JOIN_BELOW,
    Hypothesis,
    SearchConfig,
    beam_search,
    decode_batches,
    greedy_search,
    length_penalty,
    max_output_lengths,
    sample_search,
    search,
)
from nmt_cli.decoding.config import LENGTH_PENALTIES, STOP_RULES
from nmt_cli.ensemble import Ensemble

__all__ = ["JOIN_BELOW", "LENGTH_PENALTIES", "STOP_RULES", "Ensemble", "Hypothesis", "SearchConfig", "beam_search",
           "decode_batches", "greedy_search", "length_penalty", "max_output_lengths", "sample_search", "search"]

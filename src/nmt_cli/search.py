"""Greedy and beam search over any encoder-decoder exposing `encode`, `init_cache` and `decode`.

The model interface (what `nmt_cli.model.Transformer` provides, and what a test can fake):
  - `encode(src [B, S], src_pad_mask [B, S]) -> memory [B, S, D]`
  - `init_cache(memory, src_pad_mask) -> cache` with `cache.reorder(index [R'])`
  - `decode(tgt [R, T], memory, src_pad_mask, cache=None) -> logits [R, T, V]`; with a cache `tgt` holds only
    the new position(s).

Rows: the search keeps a flat batch of R = N x K rows (N unfinished sentences, K beams each, sentence-major).
Every step computes next-token log-probabilities for all rows at once, picks the 2K best (beam, token)
candidates per sentence over K x V, finalizes the end-of-sentence candidates among the first K, and continues with
the K best others (fairseq's scheme). A sentence is done when it holds K finished hypotheses or reaches its maximum
length (where EOS is forced); done sentences leave the batch through `cache.reorder`, so no work is spent on them.
With `stop="top"` a sentence is done earlier: once the best-ranked candidate of a step has been EOS and `nbest`
hypotheses have finished (the rule of OpenNMT-py and CTranslate2).

Scores: `score = sum(log p) / lp(len)`, where `len` counts the generated tokens including EOS (not BOS) and
`lp` is the GNMT form `((5 + len) / 6) ** alpha` or the fairseq form `len ** alpha`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.config import BOS_ID, EOS_ID, PAD_ID
from nmt_cli.errors import ConfigError

LENGTH_PENALTIES = ("gnmt", "fairseq")
STOP_RULES = ("beam", "top")


@dataclass
class SearchConfig:
    """Search settings. Defaults are the paper's: beam 4, alpha 0.6, max output length = source length + 50."""

    beam: int = 4
    alpha: float = 0.6  # length penalty exponent (0 disables it)
    lp: str = "gnmt"  # "gnmt": ((5 + len) / 6) ** alpha; "fairseq": len ** alpha
    max_len_a: float = 1.0  # maximum output tokens = a * source tokens + b (both counting EOS)
    max_len_b: int = 50
    nbest: int = 1  # hypotheses returned per sentence (at most `beam`)
    stop: str = "beam"  # "beam": done when `beam` hypotheses ended (fairseq); "top": when the top candidate ended
    use_cache: bool = True  # incremental decoding; False re-runs the decoder on the whole prefix (tests)

    def validate(self) -> SearchConfig:
        if self.beam < 1:
            raise ConfigError(f"beam size must be at least 1, got {self.beam}")
        if not 1 <= self.nbest <= self.beam:
            raise ConfigError(f"nbest must be between 1 and the beam size ({self.beam}), got {self.nbest}")
        if self.lp not in LENGTH_PENALTIES:
            raise ConfigError(f"unknown length penalty form {self.lp!r}; choose one of {', '.join(LENGTH_PENALTIES)}")
        if self.stop not in STOP_RULES:
            raise ConfigError(f"unknown stop rule {self.stop!r}; choose one of {', '.join(STOP_RULES)}")
        if self.alpha < 0:
            raise ConfigError(f"length penalty alpha must be >= 0, got {self.alpha}")
        if self.max_len_a < 0 or self.max_len_b < 0 or (self.max_len_a == 0 and self.max_len_b == 0):
            raise ConfigError("max-len-a and max-len-b must be >= 0 and not both 0")
        return self


@dataclass
class Hypothesis:
    """One finished translation."""

    tokens: list[int]  # generated ids, without BOS and EOS
    score: float  # sum of log-probabilities (EOS included) / length penalty
    log_prob: float  # sum of log-probabilities (EOS included)


def length_penalty(length: int, alpha: float, form: str = "gnmt") -> float:
    """lp(len): GNMT ((5 + len) / 6) ** alpha (Wu et al., 2016) or fairseq len ** alpha."""
    if form == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if form == "fairseq":
        return float(length) ** alpha
    raise ConfigError(f"unknown length penalty form {form!r}; choose one of {', '.join(LENGTH_PENALTIES)}")


def max_output_lengths(src_pad_mask: Tensor | None, src: Tensor, cfg: SearchConfig, limit: int | None) -> Tensor:
    """Maximum generated tokens (EOS included) per sentence: a * source tokens + b, capped at `limit`.  -> [B]"""
    src_len = src.new_full((src.size(0),), src.size(1)) if src_pad_mask is None else (~src_pad_mask).sum(1)
    max_len = (src_len.double() * cfg.max_len_a).long() + cfg.max_len_b
    if limit is not None:
        max_len = max_len.clamp(max=limit)
    return max_len.clamp(min=1)


def _positions_limit(model) -> int | None:
    """Longest target the model accepts: decoder inputs are BOS + all generated tokens but the final EOS."""
    config = getattr(model, "config", None)
    return getattr(config, "max_positions", None)


def _index(x, rows: Tensor):
    """index_select on dim 0 of a tensor, or of each tensor in a list (ensembles), None passes through."""
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return [t.index_select(0, rows) for t in x]
    return x.index_select(0, rows)


class _Stepper:
    """Next-token log-probabilities for a flat batch of rows, with the KV cache or re-running the prefix."""

    def __init__(self, model, memory, src_pad_mask: Tensor | None, use_cache: bool):
        self.model = model
        self.cache = model.init_cache(memory, src_pad_mask) if use_cache else None
        self.memory, self.src_pad_mask = (None, None) if use_cache else (memory, src_pad_mask)

    def log_probs(self, prefix: Tensor) -> Tensor:
        """prefix [R, t] (BOS first) -> log-probabilities of the next token [R, V] in float32."""
        if self.cache is not None:
            logits = self.model.decode(prefix[:, -1:], cache=self.cache)
        else:
            logits = self.model.decode(prefix, self.memory, self.src_pad_mask)
        return F.log_softmax(logits[:, -1].float(), dim=-1)

    def reorder(self, rows: Tensor, same_sentences: bool = False) -> None:
        """Keep rows `rows` [R'] (follow beams, drop finished sentences).

        `same_sentences`: every row keeps its sentence (only beams move), so a cache with `reorder_beams` (the
        Transformer's DecoderCache) leaves the encoder-decoder keys/values, shared by a sentence's beams, alone.
        """
        if self.cache is None:
            self.memory, self.src_pad_mask = _index(self.memory, rows), _index(self.src_pad_mask, rows)
        elif same_sentences and hasattr(self.cache, "reorder_beams"):
            self.cache.reorder_beams(rows)
        else:
            self.cache.reorder(rows)

    def repeat_beams(self, batch: int, k: int, device) -> None:
        """Each sentence becomes k consecutive rows (beam search start)."""
        if self.cache is not None and hasattr(self.cache, "repeat_beams"):
            self.cache.repeat_beams(k)
        else:
            self.reorder(torch.arange(batch, device=device).repeat_interleave(k))


def _mask_special(lprobs: Tensor, force_eos: Tensor | None) -> None:
    """Never generate PAD or BOS; rows where `force_eos` [R] is True (maximum length) may only produce EOS.

    lprobs [R, V], changed in place.
    """
    lprobs[:, PAD_ID] = float("-inf")
    lprobs[:, BOS_ID] = float("-inf")
    if force_eos is not None and bool(force_eos.any()):
        eos = lprobs[:, EOS_ID].nan_to_num(neginf=-1e4)  # a model giving EOS probability 0 still ends here
        lprobs[force_eos] = float("-inf")
        lprobs[:, EOS_ID] = eos


def _start(model, src: Tensor, src_pad_mask: Tensor | None, cfg: SearchConfig):
    """Encode; return (memory, maximum output lengths [B], the longest of them)."""
    memory = model.encode(src, src_pad_mask)
    max_len = max_output_lengths(src_pad_mask, src, cfg, _positions_limit(model))
    return memory, max_len, int(max_len.max())


@torch.inference_mode()
def greedy_search(model, src: Tensor, src_pad_mask: Tensor | None, cfg: SearchConfig | None = None,
                  ) -> list[list[Hypothesis]]:
    """Pick the most probable token at each step. src [B, S] -> one Hypothesis per sentence (as a 1-list)."""
    cfg = (cfg or SearchConfig(beam=1)).validate()
    memory, max_len, longest = _start(model, src, src_pad_mask, cfg)
    stepper = _Stepper(model, memory, src_pad_mask, cfg.use_cache)
    batch = src.size(0)
    tokens = src.new_full((batch, longest + 1), PAD_ID)  # [R, 1 + longest]
    tokens[:, 0] = BOS_ID
    log_prob = torch.zeros(batch, device=src.device)
    alive = torch.arange(batch, device=src.device)  # original sentence of each row
    results: list[list[Hypothesis]] = [[] for _ in range(batch)]
    for t in range(longest):
        lprobs = stepper.log_probs(tokens[:, : t + 1])
        _mask_special(lprobs, max_len <= t + 1)
        best_lp, best = lprobs.max(dim=-1)
        tokens[:, t + 1] = best
        log_prob += best_lp
        done = best == EOS_ID
        if not bool(done.any()):
            continue
        for row in done.nonzero().squeeze(1).tolist():
            lp_sum = float(log_prob[row])
            results[int(alive[row])] = [Hypothesis(tokens[row, 1 : t + 1].tolist(),
                                                   lp_sum / length_penalty(t + 1, cfg.alpha, cfg.lp), lp_sum)]
        keep = (~done).nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        tokens, log_prob, alive, max_len = tokens[keep], log_prob[keep], alive[keep], max_len[keep]
        stepper.reorder(keep)
    return results


class _BeamState:
    """The unfinished sentences of a beam search: N sentences x K beams, flattened sentence-major into rows."""

    def __init__(self, batch: int, beam: int, longest: int, max_len: Tensor, device):
        self.beam = beam
        self.tokens = torch.full((batch * beam, longest + 1), PAD_ID, dtype=torch.long, device=device)
        self.tokens[:, 0] = BOS_ID  # [N*K, 1 + longest]
        self.scores = torch.full((batch, beam), float("-inf"), device=device)  # cumulative log p [N, K]
        self.scores[:, 0] = 0.0  # all beams start identical: only the first may expand at step 0
        self.sentence = torch.arange(batch, device=device)  # original index of each unfinished sentence [N]
        self.max_len = max_len  # [N]
        self.top_ended = torch.zeros(batch, dtype=torch.bool, device=device)  # a step's best candidate was EOS [N]
        self.finished: list[list[Hypothesis]] = [[] for _ in range(batch)]

    @property
    def n(self) -> int:
        return self.scores.size(0)


def _block_size(width: int, k: int) -> int | None:
    """A divisor of `width` near 64 leaving at least k blocks, for `topk_rows`; None: use a plain topk."""
    for size in (64, 50, 60, 40, 74, 80, 100, 32, 125, 128):
        if width % size == 0 and width // size >= k:
            return size
    return None


def topk_rows(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """`x.topk(k, dim=1)` for x [M, W] with W large: the k best values lie in the k blocks of `W / block` columns
    with the highest maxima, so one vectorized max over blocks and a topk over k blocks replace a topk over W
    (3x faster on CPU for 8k-32k vocabularies).  -> values, indices [M, k], best first."""
    m, width = x.shape
    block = _block_size(width, k) if x.device.type == "cpu" and width >= 16 * k else None
    if block is None:
        return x.topk(min(k, width), dim=1)
    best_blocks = x.view(m, width // block, block).amax(dim=2).topk(k, dim=1).indices  # [M, k]
    columns = (best_blocks.unsqueeze(2) * block + torch.arange(block, device=x.device)).view(m, -1)  # [M, k*block]
    values, picked = x.gather(1, columns).topk(k, dim=1)
    return values, columns.gather(1, picked)


def _candidates(state: _BeamState, lprobs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Best 2K (beam, token) extensions per sentence.  lprobs [N*K, V] -> scores, beams, tokens, each [N, 2K].

    Each beam's 2K best tokens, plus the beam's score, are the only candidates (the 2K best over K x V are among
    them), so the full [N*K, V] matrix is never added to or sorted."""
    k2 = 2 * state.beam
    row_scores, row_tokens = topk_rows(lprobs, k2)  # [N*K, 2K']
    total = row_scores.add_(state.scores.view(-1, 1)).view(state.n, -1)  # [N, K*2K']
    top_scores, top_idx = total.topk(min(k2, total.size(1)), dim=1)  # [N, 2K]
    width = row_scores.size(1)
    return top_scores, torch.div(top_idx, width, rounding_mode="floor"), row_tokens.view(state.n, -1).gather(1, top_idx)


def _finalize(state: _BeamState, t: int, scores: Tensor, beams: Tensor, tokens: Tensor, cfg: SearchConfig) -> Tensor:
    """Record EOS candidates ranked within the first K; return which sentences are done [N] (bool).

    Done: K hypotheses finished, or the maximum length reached; with `cfg.stop == "top"` also once a step's
    best candidate was EOS (state.top_ended) and `cfg.nbest` hypotheses have finished."""
    k = state.beam
    done = state.max_len <= t + 1
    eos = (tokens[:, :k] == EOS_ID) & torch.isfinite(scores[:, :k])  # [N, K]
    if not bool(eos.any()):
        return done
    if cfg.stop == "top":
        state.top_ended |= eos[:, 0]
    penalty = length_penalty(t + 1, cfg.alpha, cfg.lp)
    where = eos.nonzero()  # [E, 2] (sentence row, candidate rank), sentence-major, best first
    rows = where[:, 0] * k + beams[where[:, 0], where[:, 1]]
    prefixes = state.tokens[rows, 1 : t + 1].tolist()
    lp_sums = scores[where[:, 0], where[:, 1]].tolist()
    for (n, _), prefix, lp_sum in zip(where.tolist(), prefixes, lp_sums, strict=True):
        finished = state.finished[int(state.sentence[n])]
        if len(finished) < k:
            finished.append(Hypothesis(prefix, lp_sum / penalty, lp_sum))
            if len(finished) == k:
                done[n] = True
    if cfg.stop == "top":
        for n in state.top_ended.nonzero().squeeze(1).tolist():
            if len(state.finished[int(state.sentence[n])]) >= cfg.nbest:
                done[n] = True
    return done


def _advance(state: _BeamState, t: int, scores: Tensor, beams: Tensor, tokens: Tensor, done: Tensor) -> Tensor:
    """Continue each unfinished sentence with its K best non-EOS candidates; return the kept rows [N'*K]."""
    k, width = state.beam, scores.size(1)
    rank = torch.arange(width, device=scores.device).expand_as(scores)
    order = (rank + (tokens == EOS_ID).long() * width).argsort(dim=1)[:, :k]  # non-EOS first, by rank
    keep = (~done).nonzero().squeeze(1)  # [N']
    order = order[keep]
    rows = (keep.unsqueeze(1) * k + beams[keep].gather(1, order)).view(-1)  # [N'*K] rows of the old batch
    state.tokens = state.tokens.index_select(0, rows)
    state.tokens[:, t + 1] = tokens[keep].gather(1, order).view(-1)
    state.scores = scores[keep].gather(1, order)
    state.sentence, state.max_len, state.top_ended = state.sentence[keep], state.max_len[keep], state.top_ended[keep]
    return rows


@torch.inference_mode()
def beam_search(model, src: Tensor, src_pad_mask: Tensor | None, cfg: SearchConfig | None = None,
                ) -> list[list[Hypothesis]]:
    """Batched beam search. src [B, S], src_pad_mask [B, S] True at padding -> per sentence, the `cfg.nbest`
    best hypotheses, best first."""
    cfg = (cfg or SearchConfig()).validate()
    memory, max_len, longest = _start(model, src, src_pad_mask, cfg)
    batch, k = src.size(0), cfg.beam
    stepper = _Stepper(model, memory, src_pad_mask, cfg.use_cache)
    state = _BeamState(batch, k, longest, max_len, src.device)
    for t in range(longest):
        if t == 0:  # all K beams of a sentence start identical: decode one row each, then make it K rows
            lprobs = stepper.log_probs(state.tokens[::k, :1]).repeat_interleave(k, dim=0)  # [N*K, V]
            stepper.repeat_beams(batch, k, src.device)
        else:
            lprobs = stepper.log_probs(state.tokens[:, : t + 1])  # [N*K, V]
        _mask_special(lprobs, (state.max_len <= t + 1).repeat_interleave(k))
        scores, beams, tokens = _candidates(state, lprobs)
        done = _finalize(state, t, scores, beams, tokens, cfg)
        if bool(done.all()):
            break
        stepper.reorder(_advance(state, t, scores, beams, tokens, done), same_sentences=not bool(done.any()))
    return [sorted(hyps, key=lambda h: -h.score)[: cfg.nbest] for hyps in state.finished]


def search(model, src: Tensor, src_pad_mask: Tensor | None, cfg: SearchConfig) -> list[list[Hypothesis]]:
    """Greedy search for beam 1, beam search otherwise."""
    return greedy_search(model, src, src_pad_mask, cfg) if cfg.beam == 1 else beam_search(model, src, src_pad_mask, cfg)


class Ensemble:
    """Several models presented as one: the next-token distribution is the average of their log-probabilities
    (renormalized by the search's log-softmax). Each model keeps its own cache; all must share one vocabulary."""

    def __init__(self, models: list):
        self.models = list(models)
        self.config = min((m.config for m in self.models), key=lambda c: c.max_positions)

    def encode(self, src: Tensor, src_pad_mask: Tensor | None = None) -> list[Tensor]:
        return [m.encode(src, src_pad_mask) for m in self.models]

    def init_cache(self, memory: list[Tensor], src_pad_mask: Tensor | None = None) -> EnsembleCache:
        return EnsembleCache([m.init_cache(x, src_pad_mask) for m, x in zip(self.models, memory, strict=True)])

    def decode(self, tgt: Tensor, memory: list[Tensor] | None = None, src_pad_mask: Tensor | None = None,
               cache: EnsembleCache | None = None) -> Tensor:
        """Mean log-probabilities [R, T, V] (a valid input for log_softmax)."""
        outs = []
        for i, m in enumerate(self.models):
            logits = m.decode(tgt, None if memory is None else memory[i], src_pad_mask,
                              None if cache is None else cache.caches[i])
            outs.append(F.log_softmax(logits.float(), dim=-1))
        return torch.stack(outs).mean(0)


@dataclass
class EnsembleCache:
    caches: list

    def reorder(self, index: Tensor) -> None:
        for c in self.caches:
            c.reorder(index)

    def reorder_beams(self, index: Tensor) -> None:
        """Only beams move within their sentences (see DecoderCache.reorder_beams)."""
        for c in self.caches:
            c.reorder_beams(index) if hasattr(c, "reorder_beams") else c.reorder(index)

    def repeat_beams(self, k: int) -> None:
        """Each row becomes k consecutive rows (members' caches must have `repeat_beams`, as DecoderCache)."""
        for c in self.caches:
            c.repeat_beams(k)

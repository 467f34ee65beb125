"""Greedy and beam search over any encoder-decoder exposing `encode`, `init_cache` and `decode`.

The model interface (what `nmt_cli.model.Transformer` provides, and what a test can fake):
  - `encode(src [B, S], src_pad_mask [B, S]) -> memory [B, S, D]`
  - `init_cache(memory, src_pad_mask) -> cache` with `cache.reorder(index [R'])`
  - `decode(tgt [R, T], memory, src_pad_mask, cache=None) -> logits [R, T, V]`; with a cache `tgt` holds only
    the new position(s). The search may overwrite the returned logits (a new tensor each call).

Rows: the search keeps a flat batch of R = N x K rows (N unfinished sentences, K beams each, sentence-major).
Every step computes next-token log-probabilities for all rows at once, picks the 2K best (beam, token)
candidates per sentence over K x V, finalizes the end-of-sentence candidates among the first K, and continues with
the K best others (fairseq's scheme). A sentence is done when it holds K finished hypotheses or reaches its maximum
length (where EOS is forced); done sentences leave the batch through `cache.reorder`, so no work is spent on them.
With `stop="top"` a sentence is done earlier: once the best-ranked candidate of a step has been EOS and `nbest`
hypotheses have finished (the rule of OpenNMT-py, and of CTranslate2 without a length penalty).

Continuous batching (`beam_search_batches`, what `nmt translate` uses on CPU): once a batch is down to half the next
batch's sentences, the next batch joins it instead of waiting, its sentences counting steps from where they joined.
Each batch's decoder cache stays its own (`model.JoinedCache`), so attention sees exactly its positions; the rest of
a step runs once over all rows. The last, few-row steps of every batch, which cost nearly a full step each on CPU,
are shared with the next batch's first ones.

Scores: `score = sum(log p) / lp(len)`, where `len` counts the generated tokens including EOS (not BOS) and
`lp` is the GNMT form `((5 + len) / 6) ** alpha` or the fairseq form `len ** alpha`.

Constraints, applied to every step's log-probabilities by `_constrain` (none costs anything when unused):
`min_len` (no EOS before it), `no_repeat_ngram` (no n-gram twice in a hypothesis, fairseq's rule), a forced target
prefix per sentence, and the maximum length (EOS forced). `sample_search` draws instead of searching
(temperature, top-k, top-p), e.g. for back-translation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate

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
    min_len: int = 0  # generated tokens (EOS excluded) before EOS is allowed
    no_repeat_ngram: int = 0  # > 0: no n-gram of this size occurs twice in a hypothesis
    sampling: bool = False  # draw `nbest` samples per sentence instead of searching
    topk: int = 0  # sampling: draw from the k most probable tokens only (0: all)
    topp: float = 1.0  # sampling: from the smallest set of tokens whose probability reaches p (1: all)
    temperature: float = 1.0  # sampling: divide the logits by it
    seed: int | None = None  # sampling: random seed (same seed, input and batching: same samples)

    def validate(self) -> SearchConfig:
        if self.beam < 1:
            raise ConfigError(f"beam size must be at least 1, got {self.beam}")
        if self.nbest < 1:
            raise ConfigError(f"nbest must be at least 1, got {self.nbest}")
        if self.lp not in LENGTH_PENALTIES:
            raise ConfigError(f"unknown length penalty form {self.lp!r}; choose one of {', '.join(LENGTH_PENALTIES)}")
        if self.stop not in STOP_RULES:
            raise ConfigError(f"unknown stop rule {self.stop!r}; choose one of {', '.join(STOP_RULES)}")
        if self.alpha < 0:
            raise ConfigError(f"length penalty alpha must be >= 0, got {self.alpha}")
        if self.max_len_a < 0 or self.max_len_b < 0 or (self.max_len_a == 0 and self.max_len_b == 0):
            raise ConfigError("max-len-a and max-len-b must be >= 0 and not both 0")
        if self.min_len < 0:
            raise ConfigError(f"min-len must be >= 0, got {self.min_len}")
        if self.no_repeat_ngram < 0:
            raise ConfigError(f"no-repeat-ngram must be >= 0 (0 disables it), got {self.no_repeat_ngram}")
        if self.topk < 0:
            raise ConfigError(f"topk must be >= 0 (0 disables it), got {self.topk}")
        if not 0.0 < self.topp <= 1.0:
            raise ConfigError(f"topp must be in (0, 1], got {self.topp}")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if (self.topk or self.topp < 1.0 or self.temperature != 1.0) and not self.sampling:
            raise ConfigError("topk, topp and temperature only apply with sampling; add --sampling")
        if self.sampling:
            self.nbest = max(1, self.nbest)
        elif not 1 <= self.nbest <= self.beam:
            raise ConfigError(f"nbest must be between 1 and the beam size ({self.beam}), got {self.nbest}")
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
        logits = logits[:, -1].float()  # [R, V]
        if logits.device.type == "cpu" and logits.is_contiguous():
            # in place over the step's own logits: one [R, V] tensor less to allocate and fill (~2% of CPU decoding)
            return torch._log_softmax(logits, -1, False, out=logits)
        return F.log_softmax(logits, dim=-1)

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

    def join(self, memory, src_pad_mask: Tensor | None) -> None:
        """Continuous batching: the sentences of `memory` join after the current rows, one row each until
        `repeat_joined` makes them k, decoded from their own start (the cache's `join`)."""
        self.cache = self.cache.join(self.model.init_cache(memory, src_pad_mask))

    def repeat_joined(self, k: int) -> None:
        """The rows that joined last become k rows each (after their first step, as repeat_beams)."""
        self.cache.parts[-1].repeat_beams(k)

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


def _ban_repeats(lprobs: Tensor, history: Tensor, n: int) -> None:
    """No n-gram twice: ban each token that would complete an n-gram already in `history` [R, t] (the generated
    tokens, BOS excluded). lprobs [R, V], changed in place; one vectorised pass over the history's n-grams."""
    t = history.size(1)
    if n == 1:
        if t:
            lprobs.scatter_(1, history, float("-inf"))
        return
    if t < n:  # no complete n-gram yet
        return
    grams = history.unfold(1, n, 1)  # [R, t - n + 1, n]
    tail = history[:, t - n + 1 :]  # [R, n - 1]: the n-gram being completed now
    hits = (grams[:, :, :-1] == tail.unsqueeze(1)).all(-1).nonzero()  # [H, 2] (row, position)
    if hits.numel():
        lprobs[hits[:, 0], grams[hits[:, 0], hits[:, 1], -1]] = float("-inf")


def _constrain(lprobs: Tensor, t: int, cfg: SearchConfig, force_eos: Tensor | None, history: Tensor | None = None,
               forced: Tensor | None = None) -> None:
    """All of a step's constraints on lprobs [R, V] (in place): no PAD/BOS, no EOS before `cfg.min_len` tokens, no
    repeated n-gram, the forced prefix token `forced` [R] (PAD where free), EOS at the maximum length."""
    if forced is not None:
        free = forced == PAD_ID
        # the prefix token's log-probability before any ban (a model giving it probability 0 still produces it)
        keep = lprobs.gather(1, forced.unsqueeze(1)).nan_to_num(neginf=-1e4)
    if t < cfg.min_len:
        lprobs[:, EOS_ID] = float("-inf")
    if cfg.no_repeat_ngram and history is not None:
        _ban_repeats(lprobs, history, cfg.no_repeat_ngram)
    if forced is not None and not bool(free.all()):
        rows = (~free).nonzero().squeeze(1)
        lprobs[rows] = float("-inf")
        lprobs[rows, forced[rows]] = keep[rows, 0]
    _mask_special(lprobs, force_eos)


def _prefix_tensor(prefix: list[list[int]] | None, batch: int, device) -> Tensor | None:
    """Prefixes (token ids per sentence, [] for none) as [B, P] padded with PAD; None when there is none."""
    if not prefix or not any(prefix):
        return None
    if len(prefix) != batch:
        raise ConfigError(f"{len(prefix)} prefixes for {batch} sentences; give one prefix per input line")
    width = max(len(p) for p in prefix)
    out = torch.full((batch, width), PAD_ID, dtype=torch.long)
    for i, p in enumerate(prefix):
        out[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    return out.to(device)


def _forced_at(prefix: Tensor | None, sentences: Tensor, t: int, repeat: int = 1) -> Tensor | None:
    """The prefix token each row must produce at step t ([R], PAD where free), None when no row is forced."""
    if prefix is None or t >= prefix.size(1):
        return None
    forced = prefix[sentences, t]
    return forced.repeat_interleave(repeat) if repeat > 1 else forced


def _start(model, src: Tensor, src_pad_mask: Tensor | None, cfg: SearchConfig, prefix: Tensor | None = None):
    """Encode; return (memory, maximum output lengths [B], the longest of them). A prefix of P tokens raises a
    sentence's maximum to at least P + 1 (the prefix and EOS)."""
    memory = model.encode(src, src_pad_mask)
    max_len = max_output_lengths(src_pad_mask, src, cfg, _positions_limit(model))
    if prefix is not None:
        max_len = torch.maximum(max_len, prefix.ne(PAD_ID).sum(1) + 1)
    return memory, max_len, int(max_len.max())


def _single_path(model, src: Tensor, src_pad_mask: Tensor | None, cfg: SearchConfig, prefix: Tensor | None,
                 per: int, pick) -> list[list[Hypothesis]]:
    """Greedy search and sampling: `per` rows per sentence, each extended by `pick(lprobs [R, V]) -> tokens [R]`
    until it ends. -> per sentence its `per` hypotheses, in row order."""
    memory, max_len, longest = _start(model, src, src_pad_mask, cfg, prefix)
    batch = src.size(0)
    stepper = _Stepper(model, memory, src_pad_mask, cfg.use_cache)
    if per > 1:
        stepper.repeat_beams(batch, per, src.device)  # sentence-major rows
        max_len = max_len.repeat_interleave(per)
    rows = batch * per
    tokens = src.new_full((rows, longest + 1), PAD_ID)  # [R, 1 + longest]
    tokens[:, 0] = BOS_ID
    log_prob = torch.zeros(rows, device=src.device)
    alive = torch.arange(rows, device=src.device)  # original row of each live row
    results: list[list[Hypothesis]] = [[] for _ in range(rows)]
    for t in range(longest):
        lprobs = stepper.log_probs(tokens[:, : t + 1])
        sentence = alive if per == 1 else torch.div(alive, per, rounding_mode="floor")
        _constrain(lprobs, t, cfg, max_len <= t + 1, tokens[:, 1 : t + 1], _forced_at(prefix, sentence, t))
        choice = pick(lprobs)
        tokens[:, t + 1] = choice
        log_prob += lprobs.gather(1, choice.unsqueeze(1)).squeeze(1)
        done = choice == EOS_ID
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
    return [[h for r in range(i * per, (i + 1) * per) for h in results[r]] for i in range(batch)]


@torch.inference_mode()
def greedy_search(model, src: Tensor, src_pad_mask: Tensor | None, cfg: SearchConfig | None = None,
                  prefix: list[list[int]] | None = None) -> list[list[Hypothesis]]:
    """Pick the most probable token at each step. src [B, S] -> one Hypothesis per sentence (as a 1-list).
    `prefix`: target token ids each output must start with (one list per sentence)."""
    cfg = (cfg or SearchConfig(beam=1)).validate()
    return _single_path(model, src, src_pad_mask, cfg, _prefix_tensor(prefix, src.size(0), src.device), 1,
                        lambda lprobs: lprobs.argmax(dim=-1))


class _BeamState:
    """The unfinished sentences of a beam search: N sentences x K beams, flattened sentence-major into rows.

    Steps count from the state's start. Sentences that joined later (`join`, continuous batching) began at step
    `begin` [N] (None: all at 0); a row's tokens sit in the columns of the steps that produced them, its BOS in
    column `begin`."""

    def __init__(self, batch: int, beam: int, longest: int, max_len: Tensor, device,
                 finished: list[list[Hypothesis]] | None = None):
        self.beam = beam
        self.tokens = torch.full((batch * beam, longest + 1), PAD_ID, dtype=torch.long, device=device)
        self.tokens[:, 0] = BOS_ID  # [N*K, 1 + longest]
        self.scores = torch.full((batch, beam), float("-inf"), device=device)  # cumulative log p [N, K]
        self.scores[:, 0] = 0.0  # all beams start identical: only the first may expand at step 0
        self.finished: list[list[Hypothesis]] = finished if finished is not None else []
        # the index of each unfinished sentence in `finished` [N]
        self.sentence = torch.arange(len(self.finished), len(self.finished) + batch, device=device)
        self.finished += [[] for _ in range(batch)]
        self.max_len = max_len  # [N] the step count by which each sentence ends (its maximum length, + begin)
        self.top_ended = torch.zeros(batch, dtype=torch.bool, device=device)  # a step's best candidate was EOS [N]
        self.begin: Tensor | None = None

    @property
    def n(self) -> int:
        return self.scores.size(0)

    def join(self, batch: int, max_len: Tensor, t: int) -> None:
        """Add `batch` sentences that begin at step t (before it is decoded) with maximum lengths max_len [batch]."""
        k, device = self.beam, self.scores.device
        width = max(self.tokens.size(1), t + int(max_len.max()) + 1)
        tokens = torch.full((self.tokens.size(0) + batch * k, width), PAD_ID, dtype=torch.long, device=device)
        tokens[: self.tokens.size(0), : self.tokens.size(1)] = self.tokens
        tokens[self.tokens.size(0):, t] = BOS_ID
        scores = torch.full((batch, k), float("-inf"), device=device)
        scores[:, 0] = 0.0
        begin = self.begin if self.begin is not None else self.sentence.new_zeros(self.n)
        self.tokens, self.scores = tokens, torch.cat([self.scores, scores])
        self.sentence = torch.cat([self.sentence, torch.arange(len(self.finished), len(self.finished) + batch,
                                                               device=device)])
        self.finished += [[] for _ in range(batch)]
        self.max_len = torch.cat([self.max_len, max_len + t])
        self.top_ended = torch.cat([self.top_ended, self.top_ended.new_zeros(batch)])
        self.begin = torch.cat([begin, begin.new_full((batch,), t)])

    def trim(self) -> int:
        """Drop the steps before every sentence's begin; -> how many (the caller shifts its step count)."""
        drop = int(self.begin.min()) if self.begin is not None and self.n else 0
        if drop:
            self.tokens = self.tokens[:, drop:]
            self.begin, self.max_len = self.begin - drop, self.max_len - drop
        return drop


def _block_size(width: int, k: int) -> int | None:
    """A divisor of `width` near 64 leaving at least k blocks, for `_candidates`; None: use a plain topk."""
    for size in (64, 50, 60, 40, 74, 80, 100, 32, 125, 128):
        if width % size == 0 and width // size >= k:
            return size
    return None


def _candidates(state: _BeamState, lprobs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Best 2K (beam, token) extensions per sentence.  lprobs [N*K, V] -> scores, beams, tokens, each [N, 2K].

    The full [N*K, V] matrix is never added to or sorted. On CPU the vocabulary is cut into blocks of ~64 tokens:
    the 2K best candidates lie in the 2K (beam, block) pairs whose block maximum plus the beam's score is highest,
    so one max over blocks, a topk over K x blocks and a topk over 2K blocks per sentence do the work. Otherwise
    each beam's 2K best tokens, plus the beam's score, are the only candidates."""
    k, k2 = state.beam, 2 * state.beam
    n, width = state.n, lprobs.size(1)
    block = _block_size(width, k2) if lprobs.device.type == "cpu" and width >= 16 * k2 else None
    if block is None:
        row_scores, row_tokens = lprobs.topk(min(k2, width), dim=1)  # [N*K, 2K']
        total = row_scores.add_(state.scores.view(-1, 1)).view(n, -1)  # [N, K*2K']
        top_scores, top_idx = total.topk(min(k2, total.size(1)), dim=1)  # [N, 2K]
        per_row = row_scores.size(1)
        return (top_scores, torch.div(top_idx, per_row, rounding_mode="floor"),
                row_tokens.view(n, -1).gather(1, top_idx))
    blocks = width // block
    beam_scores = state.scores.view(-1, 1)  # [N*K, 1]
    maxima = lprobs.view(n * k, blocks, block).amax(dim=2).add_(beam_scores)  # [N*K, blocks]
    best = maxima.view(n, k * blocks).topk(k2, dim=1).indices  # [N, 2K] over (beam, block)
    first_row = torch.arange(n, device=lprobs.device).unsqueeze(1) * k  # [N, 1] each sentence's first row
    rows = torch.div(best, blocks, rounding_mode="floor") + first_row
    picked = rows * blocks + best % blocks  # [N, 2K] index into the [N*K*blocks, block] view
    values = lprobs.view(-1, block).index_select(0, picked.view(-1)).view(n, k2, block)
    values = values.add_(beam_scores.view(-1)[rows].unsqueeze(2)).view(n, -1)  # [N, 2K*block]
    top_scores, top_idx = values.topk(k2, dim=1)  # [N, 2K]
    which = torch.div(top_idx, block, rounding_mode="floor")  # the chosen pair of each candidate
    tokens = (best % blocks).gather(1, which) * block + top_idx % block
    return top_scores, rows.gather(1, which) - first_row, tokens


def _finalize(state: _BeamState, t: int, scores: Tensor, beams: Tensor, tokens: Tensor, cfg: SearchConfig) -> Tensor:
    """Record EOS candidates ranked within the first K; return which sentences are done [N] (bool).

    Done: K hypotheses finished, or the maximum length reached; with `cfg.stop == "top"` also once a step's
    best candidate was EOS (state.top_ended) and `cfg.nbest` hypotheses have finished."""
    k = state.beam
    done = state.max_len <= t + 1
    eos = tokens[:, :k] == EOS_ID  # [N, K]
    if not bool(eos.any()):
        return done
    eos &= torch.isfinite(scores[:, :k])
    if cfg.stop == "top":
        state.top_ended |= eos[:, 0]
    penalty = length_penalty(t + 1, cfg.alpha, cfg.lp)
    where = eos.nonzero()  # [E, 2] (sentence row, candidate rank), sentence-major, best first
    rows = where[:, 0] * k + beams[where[:, 0], where[:, 1]]
    prefixes = state.tokens[rows, 1 : t + 1].tolist()
    lp_sums = scores[where[:, 0], where[:, 1]].tolist()
    sentence = state.sentence.tolist()  # (plain Python from here: one tensor op per hypothesis would dominate)
    begin = state.begin.tolist() if state.begin is not None else None
    now_done = []
    for (n, _), prefix, lp_sum in zip(where.tolist(), prefixes, lp_sums, strict=True):
        finished = state.finished[sentence[n]]
        if len(finished) < k:
            if begin is None:
                finished.append(Hypothesis(prefix, lp_sum / penalty, lp_sum))
            else:  # a sentence that joined later: its tokens and length from its own start
                b = begin[n]
                finished.append(Hypothesis(prefix[b:], lp_sum / length_penalty(t + 1 - b, cfg.alpha, cfg.lp), lp_sum))
            if len(finished) == k:
                now_done.append(n)
    if cfg.stop == "top":
        now_done += [n for n in state.top_ended.nonzero().squeeze(1).tolist()
                     if len(state.finished[sentence[n]]) >= cfg.nbest]
    if now_done:
        done[now_done] = True
    return done


def _advance(state: _BeamState, t: int, scores: Tensor, beams: Tensor, tokens: Tensor, done: Tensor | None,
             ) -> Tensor:
    """Continue each unfinished sentence with its K best non-EOS candidates; return the kept rows [N'*K].
    `done` [N] (bool): the sentences that leave; None when none does (the common step: nothing to select)."""
    k, width = state.beam, scores.size(1)
    rank = torch.arange(width, device=scores.device)
    order = (rank + (tokens == EOS_ID).long() * width).argsort(dim=1)[:, :k]  # non-EOS first, by rank
    if done is None:
        first_row = torch.arange(state.n, device=scores.device).unsqueeze(1) * k  # [N, 1]
    else:
        keep = (~done).nonzero().squeeze(1)  # [N']
        order, beams, tokens, scores = order[keep], beams[keep], tokens[keep], scores[keep]
        state.sentence, state.max_len, state.top_ended = state.sentence[keep], state.max_len[keep], state.top_ended[keep]
        if state.begin is not None:
            state.begin = state.begin[keep]
        first_row = keep.unsqueeze(1) * k
    rows = (first_row + beams.gather(1, order)).view(-1)  # [N'*K] rows of the old batch
    state.tokens = state.tokens.index_select(0, rows)
    state.tokens[:, t + 1] = tokens.gather(1, order).view(-1)
    state.scores = scores.gather(1, order)
    return rows


@torch.inference_mode()
def beam_search(model, src: Tensor, src_pad_mask: Tensor | None, cfg: SearchConfig | None = None,
                prefix: list[list[int]] | None = None) -> list[list[Hypothesis]]:
    """Batched beam search. src [B, S], src_pad_mask [B, S] True at padding -> per sentence, the `cfg.nbest`
    best hypotheses, best first. `prefix`: target token ids each output must start with (one list per sentence)."""
    cfg = (cfg or SearchConfig()).validate()
    return _beam_batches(model, [(src, src_pad_mask)], cfg, prefix, join_below=0.0)[0]


JOIN_BELOW = 0.5  # beam_search_batches: the next batch joins once the running one is down to half its size


def can_join(cfg: SearchConfig, device) -> bool:
    """Whether `beam_search_batches` may let batches join running ones: beam search with the cache on CPU (the
    decoder's step path), and no constraint that counts steps from a sentence's own start (min-len, no-repeat-ngram;
    prefixes are per call)."""
    return (torch.device(device).type == "cpu" and cfg.beam > 1 and not cfg.sampling and cfg.use_cache
            and not cfg.min_len and not cfg.no_repeat_ngram)


@torch.inference_mode()
def beam_search_batches(model, batches: Iterable[tuple[Tensor, Tensor | None]], cfg: SearchConfig,
                        join_below: float | None = None) -> list[list[list[Hypothesis]]]:
    """Beam search over batches (src, src_pad_mask), with continuous batching -> per batch, per sentence, the
    `cfg.nbest` best hypotheses.

    Once a running batch is down to `join_below` x the next batch's sentences, the next batch joins it: its sentences
    start at the current step, with positions, self-attention and maximum lengths counted from there
    (`DecoderCache.join`). Steps with few rows cost nearly as much as full ones on CPU (the fixed cost of ~300
    small tensor operations), and the last sentences of every batch otherwise run alone. Where `can_join` does not
    hold (or with `join_below` 0) the batches run one after the other."""
    cfg = cfg.validate()
    return _beam_batches(model, batches, cfg, None, JOIN_BELOW if join_below is None else join_below)


def _beam_batches(model, batches: Iterable[tuple[Tensor, Tensor | None]], cfg: SearchConfig,
                  prefix: list[list[int]] | None, join_below: float) -> list[list[list[Hypothesis]]]:
    k = cfg.beam
    finished: list[list[Hypothesis]] = []  # per sentence, in batch order
    sizes: list[int] = []
    pending = iter(batches)
    upcoming = next(pending, None)
    state: _BeamState | None = None
    forced_prefix = None
    t = shortest = 0
    while upcoming is not None or state is not None:
        joined = False
        if state is None:  # start afresh with the next batch
            src, src_pad_mask = upcoming
            upcoming = next(pending, None)
            forced_prefix = _prefix_tensor(prefix, src.size(0), src.device)
            memory, max_len, longest = _start(model, src, src_pad_mask, cfg, forced_prefix)
            stepper = _Stepper(model, memory, src_pad_mask, cfg.use_cache)
            state = _BeamState(src.size(0), k, longest, max_len, src.device, finished)
            sizes.append(src.size(0))
            t, shortest = 0, int(max_len.min())  # no sentence reaches its maximum length before step `shortest`
            if join_below and not (can_join(cfg, src.device) and hasattr(stepper.cache, "join")):
                join_below = 0.0
        elif join_below and upcoming is not None and state.n <= join_below * upcoming[0].size(0):
            src, src_pad_mask = upcoming  # the next batch joins the running one at step t (> 0)
            upcoming = next(pending, None)
            memory, max_len, _ = _start(model, src, src_pad_mask, cfg)
            stepper.join(memory, src_pad_mask)
            old_rows = state.tokens.size(0)
            state.join(src.size(0), max_len, t)
            sizes.append(src.size(0))
            shortest = min(shortest, t + int(max_len.min()))
            last = state.tokens[:, t : t + 1]  # as at step 0: the new sentences' beams are identical, one row each
            lprobs = stepper.log_probs(torch.cat([last[:old_rows], last[old_rows::k]]))
            lprobs = torch.cat([lprobs[:old_rows], lprobs[old_rows:].repeat_interleave(k, dim=0)])  # [N*K, V]
            stepper.repeat_joined(k)
            joined = True
        if t == 0:  # all K beams of a sentence start identical: decode one row each, then make it K rows
            lprobs = stepper.log_probs(state.tokens[::k, :1]).repeat_interleave(k, dim=0)  # [N*K, V]
            stepper.repeat_beams(state.n, k, state.tokens.device)
        elif not joined:
            lprobs = stepper.log_probs(state.tokens[:, : t + 1])  # [N*K, V]
        force_eos = (state.max_len <= t + 1).repeat_interleave(k) if t + 1 >= shortest else None
        _constrain(lprobs, t, cfg, force_eos, state.tokens[:, 1 : t + 1] if cfg.no_repeat_ngram else None,
                   _forced_at(forced_prefix, state.sentence, t, k))
        scores, beams, tokens = _candidates(state, lprobs)
        done = _finalize(state, t, scores, beams, tokens, cfg)
        if not bool(done.any()):
            stepper.reorder(_advance(state, t, scores, beams, tokens, None), same_sentences=True)
        elif bool(done.all()):
            state = None
            continue
        else:
            stepper.reorder(_advance(state, t, scores, beams, tokens, done))
            drop = state.trim()  # steps before the oldest unfinished sentence began
            t, shortest = t - drop, shortest - drop
        t += 1
    out = [sorted(hyps, key=lambda h: -h.score)[: cfg.nbest] for hyps in finished]
    ends = list(accumulate(sizes))
    return [out[end - size : end] for end, size in zip(ends, sizes, strict=True)]


def _filter(lprobs: Tensor, cfg: SearchConfig) -> Tensor:
    """Sampling distribution of each row [R, V]: temperature, then top-k, then top-p (the most probable token is
    always kept); excluded tokens get -inf. Returns renormalised log-probabilities."""
    if cfg.temperature != 1.0:
        lprobs = F.log_softmax(lprobs / cfg.temperature, dim=-1)
    if cfg.topk and cfg.topk < lprobs.size(-1):
        kth = lprobs.topk(cfg.topk, dim=-1).values[:, -1:]
        lprobs = lprobs.masked_fill(lprobs < kth, float("-inf"))
    if cfg.topp < 1.0:
        sorted_lp, order = lprobs.sort(dim=-1, descending=True)
        probs = sorted_lp.exp()
        before = probs.cumsum(-1) - probs  # mass of the more probable tokens
        drop = before >= cfg.topp
        drop[:, 0] = False
        lprobs = lprobs.scatter(1, order, sorted_lp.masked_fill(drop, float("-inf")))
    return F.log_softmax(lprobs, dim=-1)


@torch.inference_mode()
def sample_search(model, src: Tensor, src_pad_mask: Tensor | None, cfg: SearchConfig,
                  prefix: list[list[int]] | None = None, generator: torch.Generator | None = None,
                  ) -> list[list[Hypothesis]]:
    """Draw `cfg.nbest` samples per sentence (in the order drawn, not ranked): each step samples from the
    temperature/top-k/top-p distribution under the constraints. A hypothesis' log_prob and score are the model's
    own (temperature 1, unfiltered) log-probabilities of the sampled tokens, length-penalised as in beam search."""
    cfg = cfg.validate()
    if generator is None:
        generator = torch.Generator(device=src.device)
        if cfg.seed is not None:
            generator.manual_seed(cfg.seed)

    def draw(lprobs: Tensor) -> Tensor:
        return torch.multinomial(_filter(lprobs, cfg).exp(), 1, generator=generator).squeeze(1)

    return _single_path(model, src, src_pad_mask, cfg, _prefix_tensor(prefix, src.size(0), src.device), cfg.nbest,
                        draw)


def search(model, src: Tensor, src_pad_mask: Tensor | None, cfg: SearchConfig,
           prefix: list[list[int]] | None = None, generator: torch.Generator | None = None,
           ) -> list[list[Hypothesis]]:
    """Sampling when asked, else greedy search for beam 1 and beam search otherwise."""
    if cfg.sampling:
        return sample_search(model, src, src_pad_mask, cfg, prefix, generator)
    if cfg.beam == 1:
        return greedy_search(model, src, src_pad_mask, cfg, prefix)
    return beam_search(model, src, src_pad_mask, cfg, prefix)


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

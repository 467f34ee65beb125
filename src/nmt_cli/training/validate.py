"""Validation of a training run, sharded over every rank: the loss on the valid split and, with --valid-bleu, the
corpus BLEU of its translations, decoded as `nmt translate` decodes them; a multilingual run's per direction and
their mean (`PerDirection`).

    deal:   the valid sentences, longest first, to the ranks in turn (the k-th longest to rank k mod N), once
    loss:   each rank batches its share and sums label-smoothed loss, nll and target tokens in float64; one all-reduce
    BLEU:   each rank decodes its share of the sources through the decoding engine (`decode_batches`: batches of
            similar lengths, each joining the running search's tail; on a GPU a host check every GPU_CHECK_EVERY
            steps; in bf16/fp16 a copy of the model in that dtype, as `nmt translate --precision bf16`), the best
            hypotheses' token ids are gathered, rank 0 scores them once with sacrebleu and every rank gets the
            figure, so all agree on "best" and on patience

Dealing by length gives every rank about as many sentences and tokens of every length, so the ranks end together.
The loss deals by the longer side of each pair (`deal`); the sources are dealt by their length and batched by
`translate.stream_batches`, `nmt translate`'s own dealing of a chunk to its decoding streams, with its default batch
sizes and search settings (only the beam is --valid-beam): on one rank the hypotheses are those of `nmt translate`
(one decoding stream, the run's precision) for the same checkpoint, token for token. The split depends only on the
data and the number of ranks, never on timing.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from nmt_cli.config import EOS_ID, PAD_ID
from nmt_cli.data.batching import make_batches
from nmt_cli.data.store import ParallelData, collate
from nmt_cli.data.tokenizer import Tokenizer
from nmt_cli.errors import TrainingError
from nmt_cli.training.distributed.process import DTYPES, Runtime
from nmt_cli.training.loss import label_smoothed_cross_entropy


def deal(lengths: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """The indices of `rank`'s share: sentences sorted longest first (ties by index), the k-th to rank k mod N."""
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    return order[rank::world_size]


class Validator:
    """The valid split of a run, dealt to the ranks once; `validator(module, step)` validates the model on every
    rank together (a collective) and gives every rank the same figures."""

    def __init__(self, data: ParallelData, tokenizer: Tokenizer, rt: Runtime, max_tokens: int, label_smoothing: float,
                 max_positions: int, beam: int | None = None):
        """`max_tokens`: padded tokens of a loss batch (the training micro-batch); `beam`: decode and score BLEU
        with this beam (None: no BLEU)."""
        self.data, self.tokenizer, self.rt, self.label_smoothing = data, tokenizer, rt, label_smoothing
        src, tgt = data.src_lengths, data.tgt_lengths
        mine = deal(np.maximum(src, tgt), rt.rank, rt.world_size)
        if len(mine):
            longest = int(max(src[mine].max(), tgt[mine].max()))
            self.loss_batches = [mine[b] for b in make_batches(src[mine], tgt[mine], max(max_tokens, longest))]
        else:  # more ranks than sentences
            self.loss_batches = []
        self.beam = beam
        if beam is not None:
            # as Translator.encode: ids + EOS, truncated to the model's positions; an empty source gives [] (skipped)
            room = max_positions - 1
            self.sources = [list(map(int, data.src[i][:room])) + [EOS_ID] if len(data.src[i]) else []
                            for i in range(len(data))]
            self._refs: list[str] | None = None

    def __call__(self, module, step: int) -> dict:
        """{valid_nll, valid_ppl, valid_loss[, valid_bleu]} of `module` (in eval mode): the loss under the run's
        autocast, the translations at its precision."""
        loss, nll, n = self.loss_sums(module)
        if not math.isfinite(loss):
            raise TrainingError(f"the validation loss became {loss} at update {step}; the model diverged: lower "
                                "--lr, raise --warmup or set --clip-norm, and resume from an earlier checkpoint")
        # the names used everywhere (display, metrics.jsonl, checkpoint meta): valid_nll (per target token,
        # without label smoothing), valid_ppl = exp(valid_nll), valid_loss (label-smoothed, the training objective)
        out = {"valid_nll": nll / n, "valid_ppl": math.exp(min(nll / n, 50.0)), "valid_loss": loss / n}
        if self.beam is not None:
            out["valid_bleu"] = self.bleu(module)
        return out

    @torch.no_grad()
    def loss_sums(self, module) -> list[float]:
        """[label-smoothed loss, nll, target tokens] summed over the whole valid split (all ranks), in float64."""
        rt = self.rt
        sums = torch.zeros(3, dtype=torch.float64, device=rt.device)
        for idx in self.loss_batches:
            batch = collate([self.data[int(i)] for i in idx]).to(rt.device)
            with rt.autocast():
                logits = module(batch.src, batch.tgt_in, batch.src_pad_mask)  # [B, T, V]
            loss, nll, n = label_smoothed_cross_entropy(logits, batch.tgt_out, self.label_smoothing, PAD_ID)
            sums += torch.stack([loss.detach(), nll, n]).to(torch.float64)
        return rt.all_reduce_sum(sums).tolist()

    def hypotheses(self, module) -> dict[int, list[int]]:
        """This rank's share of the valid sources -> {sentence index: the best hypothesis' token ids}, decoded by the
        decoding engine as `nmt translate` decodes (Translator.translate_ids with one stream), at the run's
        precision (`decoding_model`)."""
        from nmt_cli.decoding import JOIN_BELOW, SearchConfig, decode_batches
        from nmt_cli.decoding.batch import source_batch
        from nmt_cli.inference.translate import TranslateConfig, stream_batches
        from nmt_cli.runtime.defaults import MAX_TOKENS_PER_DEVICE

        rt, sources = self.rt, self.sources
        batches, owner = stream_batches(sources, MAX_TOKENS_PER_DEVICE[rt.device.type], TranslateConfig.max_sentences,
                                        rt.world_size)
        mine = [b for b, o in zip(batches, owner, strict=True) if o == rt.rank]
        found = {i: [] for i, s in enumerate(sources) if not s} if rt.is_main else {}  # (empty: not decoded)
        if not mine:
            return found
        feed = (source_batch([sources[i] for i in b], rt.device) for b in mine)  # made as the search takes them
        per_batch = decode_batches(decoding_model(module, rt.precision), feed, SearchConfig(beam=self.beam),
                                   join_below=JOIN_BELOW)
        for b, hyps in zip(mine, per_batch, strict=True):
            found.update((i, h[0].tokens if h else []) for i, h in zip(b, hyps, strict=True))
        return found

    def bleu(self, module) -> float:
        """Corpus BLEU (sacrebleu) of every rank's translations against the detokenized references: scored once, on
        rank 0, and the same figure on every rank."""
        shares = self.rt.gather_objects(self.hypotheses(module))
        score = None
        if self.rt.is_main:
            import sacrebleu

            hyps = {i: ids for share in shares for i, ids in share.items()}
            if self._refs is None:
                self._refs = self.tokenizer.decode([self.data.tgt[i].tolist() for i in range(len(self.data))])
            texts = self.tokenizer.decode([hyps[i] for i in range(len(self.data))])
            score = float(sacrebleu.corpus_bleu(texts, [self._refs]).score)
        return self.rt.broadcast_float(score)


class PerDirection:
    """A multilingual run's validation: one Validator per direction (its rows of the valid split). The figures of
    each are under "directions"; valid_nll, valid_loss and valid_bleu are their means (every direction counts the
    same, whatever its size: "best" and --patience follow the mean), valid_ppl is exp(mean valid_nll)."""

    def __init__(self, validators: dict[str, Validator]):
        self.validators = validators

    def __call__(self, module, step: int) -> dict:
        per = {key: v(module, step) for key, v in self.validators.items()}  # a collective each, in the same order
        out = {name: float(np.mean([p[name] for p in per.values()])) for name in next(iter(per.values()))
               if name != "valid_ppl"}
        out["valid_ppl"] = math.exp(min(out["valid_nll"], 50.0))
        out["directions"] = per
        return out


def validator_for(data: ParallelData | None, tokenizer: Tokenizer, rt: Runtime, max_tokens: int,
                  label_smoothing: float, max_positions: int, beam: int | None) -> Validator | PerDirection | None:
    """The valid split `data` dealt to this rank (`Validator`'s arguments); a multilingual run's per direction
    (`PerDirection`); None without valid sentences."""
    if data is None or not len(data):
        return None
    args = (tokenizer, rt, max_tokens, label_smoothing, max_positions, beam)
    directions = data.directions("valid")
    if directions:  # a multilingual run: each direction on its own, their mean for "best"
        return PerDirection({key: Validator(rows, *args) for key, rows in directions.items() if len(rows)})
    return Validator(data, *args)


def decoding_model(module, precision: str):
    """The model the search runs: `module` itself in fp32; in bf16 or fp16 a copy in that dtype, as `nmt translate
    --precision bf16` decodes. (Not autocast: the decoding engine computes in its weights' dtype, and under autocast
    a step mixes bf16 products with float32 buffers and fails.)"""
    dtype = DTYPES[precision]
    return module if dtype == torch.float32 else copy.deepcopy(module).to(dtype)

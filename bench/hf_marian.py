"""Benchmark anchor: Hugging Face `generate` on the SAME weights as `nmt translate` (an nmt checkpoint converted
to a `transformers` MarianMTModel in memory).

    python bench/hf_marian.py CHECKPOINT INPUT OUTPUT [--hf-site DIR] [--threads 2] [--beam 4] [--lenpen 0.6]
        [--max-len-a 1 --max-len-b 50 | --fixed-length L] [--batch-sentences 48] [-n N] [--check]

prints one JSON line last: {"seconds", "sentences", "tgt_tokens", "peak_mb"} (seconds: the timed translation only,
after a short warm-up; tgt_tokens: generated tokens including EOS; peak_mb: VmHWM, this process's own peak).

Install: `pip install -e '.[export]'` (the project's export extra; `make install` does it), or into a separate
directory (`.venv/bin/pip install --no-deps --target /tmp/hfsite transformers tokenizers safetensors`) passed
with `--hf-site` (APPENDED to sys.path, so the venv's torch wins). Written against transformers 5.23.0.

Conversion: `nmt export huggingface`'s (nmt_cli.export.huggingface.to_marian), in memory: the same architecture,
nmt's fused projections split, the d_model coordinates permuted so that Marian's own [sin half | cos half]
positional table is nmt's interleaved one (see that module). Pre-LN (norm_first) and unshared-embedding checkpoints
are refused.

Search settings, chosen to mirror nmt's search: start token BOS (2), EOS 3, PAD 0; PAD and BOS are never generated
(suppress_tokens); EOS is forced at the maximum length (forced_eos_token_id); a sentence ends when it holds `beam`
finished hypotheses (early_stopping=True, fairseq's rule, as nmt). Differences that remain:
  - Length penalty: HF's `length_penalty` is the fairseq form, score = sum log p / len ** alpha (len counts the
    generated tokens with EOS), NOT nmt's default GNMT form ((5 + len) / 6) ** alpha. `nmt translate
    --lenpen-form fairseq` is the comparable setting for output agreement; speed hardly depends on it.
  - Maximum length: nmt allows a * source + b tokens per sentence; `generate` takes one limit per batch, so the
    batch's longest source sets it (sources are sorted by length, so the batches are nearly uniform).
  - Forced EOS: HF gives the forced EOS log-probability 0, nmt keeps the model's; only hypotheses that hit the
    maximum length are scored differently.
  - Finished sentences stay in HF's batch until the whole batch is done (nmt drops them).
`--fixed-length L` (random-weight models that never choose EOS) makes every output exactly L tokens followed by a
forced EOS (min_new_tokens L, max_new_tokens L + 1), i.e. L + 1 decoder steps and L + 1 counted tokens, as nmt's
fixed-length protocol in bench/translate.py (max-len-a 0, max-len-b L + 1).

`--check` first verifies the conversion on a few INPUT sentences: teacher-forced logits of the HF model against
nmt's `model(src, tgt_in, src_pad_mask)` (max abs difference), greedy outputs token for token (one sentence at a
time, so both use the same per-sentence maximum length), and, for information, beam outputs against nmt's beam
search with the fairseq length penalty. It exits with status 1 if the logits or greedy outputs disagree.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from translate import peak_mb, read_lines  # bench/translate.py, beside this script

from nmt_cli.checkpoints import format as checkpoint
from nmt_cli.config import BOS_ID, EOS_ID, PAD_ID
from nmt_cli.model import Transformer

if TYPE_CHECKING:
    from transformers import GenerationConfig, LogitsProcessorList, MarianMTModel

    from nmt_cli.checkpoints.format import Checkpoint
    from nmt_cli.data.tokenizer import Tokenizer

DEFAULT_HF_SITE = None
DEFAULT_BATCH = 48  # sentences per generate() call: 32-64 is a plateau on 2 CPU threads (small model), 8-16 slower
LOGIT_TOLERANCE = 1e-3


# ------------------------------------------------------------------------------------------------ conversion


def to_marian(ck: Checkpoint) -> MarianMTModel:
    """The checkpoint's Transformer as an equivalent MarianMTModel (fp32, eval mode): `nmt export huggingface`'s
    conversion (nmt_cli.export.huggingface), in memory."""
    from nmt_cli.errors import NmtError
    from nmt_cli.export.huggingface import to_marian as convert

    try:
        return convert(ck)
    except NmtError as exc:
        sys.exit(f"hf_marian: {exc}")


# ------------------------------------------------------------------------------------------------ translation


def encode(tok: Tokenizer, lines: list[str], max_positions: int) -> list[list[int]]:
    """Source ids + EOS as nmt encodes them ([] for an empty line; truncated to the model's positions)."""
    return [ids[: max_positions - 1] + [EOS_ID] if ids else [] for ids in tok.encode(lines)]


def pad(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, S] and attention mask [B, S] (1 at tokens)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    return ids, (ids != PAD_ID).long()


def generation_config(beam: int, lenpen: float, forced_eos: bool = True, **limits: int) -> GenerationConfig:
    """generate() settings mirroring nmt's search; `limits` are max_new_tokens (and min_new_tokens)."""
    from transformers import GenerationConfig

    beam_only = {"length_penalty": lenpen, "early_stopping": True} if beam > 1 else {}
    return GenerationConfig(
        num_beams=beam, do_sample=False, num_return_sequences=1, use_cache=True, **beam_only, **limits,
        decoder_start_token_id=BOS_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
        forced_eos_token_id=EOS_ID if forced_eos else None, suppress_tokens=[PAD_ID, BOS_ID],
    )


def nmt_forced_eos(max_new_tokens: int) -> LogitsProcessorList:
    """nmt's rule at the maximum length: only EOS allowed, with the model's own log-probability (HF's
    forced_eos_token_id gives it 0). Used by --check to show that the beam searches then agree."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class ForceEosKeepScore(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if input_ids.size(1) == max_new_tokens:  # start token + max_new_tokens - 1 generated: the last step
                eos = scores[:, EOS_ID].nan_to_num(neginf=-1e4)
                scores = torch.full_like(scores, float("-inf"))
                scores[:, EOS_ID] = eos
            return scores

    return LogitsProcessorList([ForceEosKeepScore()])


def length_limits(longest_src: int, args: argparse.Namespace, max_positions: int) -> dict[str, int]:
    """generate() length arguments for a batch whose longest source has `longest_src` tokens (EOS included)."""
    if args.fixed_length is not None:
        return {"min_new_tokens": args.fixed_length, "max_new_tokens": args.fixed_length + 1}
    limit = int(longest_src * args.max_len_a) + args.max_len_b
    return {"max_new_tokens": max(1, min(limit, max_positions))}


def generated(row: torch.Tensor) -> list[int]:
    """A generate() output row without the start token, up to and including EOS (no padding)."""
    ids = row[1:].tolist()
    return ids[: ids.index(EOS_ID) + 1] if EOS_ID in ids else [i for i in ids if i != PAD_ID]


def translate(hf: MarianMTModel, sources: list[list[int]], args: argparse.Namespace) -> list[list[int]]:
    """Generated ids (EOS included) per source, in input order; [] for empty sources."""
    max_positions = hf.config.max_position_embeddings
    order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: -len(sources[i]))
    out: list[list[int]] = [[] for _ in sources]
    for start in range(0, len(order), args.batch_sentences):
        batch = order[start : start + args.batch_sentences]
        ids, mask = pad([sources[i] for i in batch])
        config = generation_config(args.beam, args.lenpen, **length_limits(ids.size(1), args, max_positions))
        seqs = hf.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        for i, row in zip(batch, seqs, strict=True):
            out[i] = generated(row)
    return out


# ------------------------------------------------------------------------------------------------ check


def check(ck: Checkpoint, hf: MarianMTModel, lines: list[str], args: argparse.Namespace) -> bool:
    """Teacher-forced logits and greedy outputs of the two models; beam agreement for information."""
    from nmt_cli.decoding import SearchConfig, beam_search, search

    nmt: Transformer = ck.build_model("cpu")
    tok = ck.tokenizer_obj()
    max_positions = ck.model_config.max_positions
    sources = [s for s in encode(tok, lines[:64], max_positions) if s][:8]
    targets = [[BOS_ID] + s[:-1] for s in sources[1:] + sources[:1]]  # some other sentence as target input
    src, src_mask = pad(sources)
    tgt_in, _ = pad(targets)
    with torch.inference_mode():
        ref = nmt(src, tgt_in, src_mask == 0)
        got = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt_in).logits
    diff = float((ref - got).abs().max())
    logits_ok = diff <= LOGIT_TOLERANCE
    print(f"check: teacher-forced logits on {len(sources)} sentences [{tuple(ref.shape)}]: max abs difference "
          f"{diff:.3g} (logits up to {float(ref.abs().max()):.3g}) -> {'OK' if logits_ok else 'MISMATCH'}")

    def hf_search(s: list[int], beam: int, stock_eos: bool) -> list[int]:
        """One sentence at a time: the same maximum length as nmt's for this sentence."""
        ids, mask = pad([s])
        limit = max(1, min(int(len(s) * args.max_len_a) + args.max_len_b, max_positions))
        config = generation_config(beam, args.lenpen, forced_eos=stock_eos, max_new_tokens=limit)
        processors = None if stock_eos else nmt_forced_eos(limit)
        with torch.inference_mode():
            row = hf.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                              logits_processor=processors)[0]
        return [i for i in generated(row) if i != EOS_ID]

    agree = {}
    runs = [(1, True, "greedy"), (args.beam, True, f"beam {args.beam}, fairseq lp {args.lenpen}, stock forced EOS"),
            (args.beam, False, f"beam {args.beam}, fairseq lp {args.lenpen}, nmt's forced EOS")]
    for beam, stock_eos, label in runs if args.beam > 1 else runs[:1]:
        cfg = SearchConfig(beam=beam, alpha=args.lenpen, lp="fairseq", max_len_a=args.max_len_a,
                           max_len_b=args.max_len_b)
        with torch.inference_mode():
            mine = (search if beam == 1 else beam_search)(nmt, src, src_mask == 0, cfg)
        theirs = [hf_search(s, beam, stock_eos) for s in sources]
        agree[label] = sum(m[0].tokens == t for m, t in zip(mine, theirs, strict=True))
        lengths = ", ".join(str(len(t)) for t in theirs)
        print(f"check: {label}: {agree[label]}/{len(sources)} outputs identical to nmt's token for token "
              f"(HF output lengths {lengths})")
    return logits_ok and agree["greedy"] == len(sources)


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path, help="An nmt checkpoint (post-LN, shared embeddings).")
    p.add_argument("input", type=Path, help="Raw text, one sentence per line.")
    p.add_argument("output", type=Path, help="Translations, one line per input line.")
    p.add_argument("--hf-site", default=DEFAULT_HF_SITE,
                   help="Directory holding transformers (appended to sys.path) when the venv has no export extra.")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads.")
    p.add_argument("--beam", type=int, default=4, help="num_beams; 1 is greedy search.")
    p.add_argument("--lenpen", type=float, default=0.6, help="HF length_penalty (fairseq form: score / len^alpha).")
    p.add_argument("--max-len-a", type=float, default=1.0, help="Max new tokens = a * longest source + b (per batch).")
    p.add_argument("--max-len-b", type=int, default=50)
    p.add_argument("--fixed-length", type=int, default=None, metavar="L",
                   help="Every output exactly L tokens + forced EOS (random-weight models); overrides max-len.")
    p.add_argument("--batch-sentences", type=int, default=DEFAULT_BATCH, help="Sentences per generate() call.")
    p.add_argument("-n", type=int, default=None, help="Translate only the first N input lines.")
    p.add_argument("--check", action="store_true", help="Verify the conversion against nmt before translating.")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.hf_site:
        sys.path.append(args.hf_site)
    torch.set_num_threads(args.threads)
    ck = checkpoint.load(args.checkpoint)
    hf = to_marian(ck)
    lines = read_lines(args.input, args.n)
    if args.check and not check(ck, hf, lines, args):
        sys.exit("hf_marian: the converted model does not reproduce nmt's outputs")
    tok = ck.tokenizer_obj()
    sources = encode(tok, lines, ck.model_config.max_positions)
    with torch.inference_mode():
        translate(hf, [s for s in sources if s][:16], args)  # warm-up
        start = time.perf_counter()
        outputs = translate(hf, sources, args)
        seconds = time.perf_counter() - start
    texts = tok.decode(outputs)
    args.output.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    result: dict[str, Any] = {
        "seconds": seconds, "sentences": len(lines), "tgt_tokens": sum(len(o) for o in outputs),
        "peak_mb": peak_mb(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

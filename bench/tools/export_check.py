"""Check `nmt export` on real data: the exported CTranslate2 and Hugging Face models against `nmt translate` on the
same weights (default: Multi30k test, 1000 lines).

    python bench/tools/export_check.py CHECKPOINT [--src ../shared/data/multi30k/test.en --ref .../test.de]
        [--threads 2] [-n N] [--out runs/export_check]

Prints, for each engine and search setting, the share of output lines identical to nmt's and the BLEU; for the
Hugging Face export also the largest difference of teacher-forced logits (source -> reference) after
save_pretrained + from_pretrained. Needs the export extra (pip install 'nmt-cli[export]').

Search settings: beam 4, alpha 0.6. CTranslate2 divides scores by len^alpha (nmt's --lenpen-form fairseq) and
Hugging Face too; nmt's default is the GNMT form, shown for comparison.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def read(path: Path, n: int | None) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return lines[:n] if n else lines


def same(a: list[str], b: list[str], cut: list[bool] | None = None) -> str:
    """Identical lines; `cut` marks the lines where nmt stopped at its length limit (source + 50 tokens), where
    the other engine's own limit (CTranslate2: 256 tokens; generate: longest source of the batch + 50) applies."""
    k = sum(x == y for x, y in zip(a, b, strict=True))
    out = f"{k}/{len(a)} ({100 * k / len(a):.1f}%)"
    if cut is not None and k < len(a):
        limited = sum(x != y and c for x, y, c in zip(a, b, cut, strict=True))
        out += f" [{limited} of the {len(a) - k} others: nmt output cut at its length limit]"
    return out


def bleu(hyp: list[str], ref: list[str]) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu(hyp, [ref]).score


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--src", type=Path, default=MULTI30K / "test.en")
    p.add_argument("--ref", type=Path, default=MULTI30K / "test.de")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("-n", type=int, default=None, help="First N lines only.")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "export_check")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import ctranslate2
    from transformers import MarianMTModel, MarianTokenizer

    from nmt_cli.checkpoints import format as checkpoint
    from nmt_cli.export import ctranslate2 as ct2_export
    from nmt_cli.export import huggingface as hf_export
    from nmt_cli.inference.translate import TranslateConfig, Translator, _one_line

    src, ref = read(args.src, args.n), read(args.ref, args.n)
    ckpt = checkpoint.load(args.checkpoint)  # loaded once: every engine gets these weights
    sp = ckpt.tokenizer_obj()
    folders = {"ct2": args.out / "ct2", "ct2_int8": args.out / "ct2_int8", "hf": args.out / "hf"}
    start = time.perf_counter()
    ct2_export.export(ckpt, folders["ct2"], replace=True)
    ct2_export.export(ckpt, folders["ct2_int8"], quantization="int8", replace=True)
    hf_export.export(ckpt, folders["hf"], replace=True)
    print(f"{args.checkpoint}: {len(src)} lines of {args.src}; exports written in {time.perf_counter() - start:.1f} s "
          f"to {args.out}/")

    nmt: dict[str, list[str]] = {}
    cut: dict[str, list[bool]] = {}
    for name, options in {"gnmt, stop beam (nmt default)": {}, "fairseq, stop beam": {"lenpen_form": "fairseq"},
                          "fairseq, stop top": {"lenpen_form": "fairseq", "stop": "top"},
                          "greedy": {"beam": 1}}.items():
        translator = Translator([ckpt], "cpu", "fp32", TranslateConfig.from_options(**options))
        sources = translator.encode(src, 1)
        hyps = translator.translate_ids(sources)
        nmt[name] = [_one_line(t) for t in sp.decode([h[0].tokens for h in hyps])]
        cut[name] = [len(h[0].tokens) + 1 >= len(s) + 50 for h, s in zip(hyps, sources, strict=True)]
    print("nmt translate, beam 4, alpha 0.6:")
    for name, out in nmt.items():
        print(f"  {name:<32} BLEU {bleu(out, ref):5.2f}")

    pieces = [sp.pieces(line) for line in src]
    print("CTranslate2 (nmt export ctranslate2), beam 4, length_penalty 0.6:")
    for label, folder, compute, beam in (("float32", "ct2", "float32", 4), ("float32 greedy", "ct2", "float32", 1),
                                         ("int8", "ct2_int8", "int8", 4)):
        tr = ctranslate2.Translator(str(folders[folder]), device="cpu", compute_type=compute, intra_threads=args.threads)
        out = [sp.sp.decode(r.hypotheses[0]) for r in tr.translate_batch(pieces, beam_size=beam, length_penalty=0.6,
                                                                          max_batch_size=2000, batch_type="tokens")]
        if beam == 1:
            print(f"  {label:<16} BLEU {bleu(out, ref):5.2f}  identical to nmt greedy: "
                  f"{same(out, nmt['greedy'], cut['greedy'])}")
            continue
        print(f"  {label:<16} BLEU {bleu(out, ref):5.2f}  identical to nmt " + "; ".join(
            f"{name}: {same(out, nmt[name], cut[name])}" for name in list(nmt)[:3]))

    tokenizer = MarianTokenizer.from_pretrained(str(folders["hf"]))
    model = MarianMTModel.from_pretrained(str(folders["hf"])).eval()
    nmt_model = ckpt.build_model()
    worst, largest = 0.0, 0.0
    with torch.inference_mode():
        for i in range(0, len(src), 64):
            batch = tokenizer(src[i : i + 64], return_tensors="pt", padding=True)
            tgt = [[2] + ids for ids in sp.encode(ref[i : i + 64])]
            width = max(map(len, tgt))
            tgt_in = torch.tensor([t + [0] * (width - len(t)) for t in tgt])
            mine = nmt_model(batch["input_ids"], tgt_in, batch["attention_mask"] == 0)
            theirs = model(**batch, decoder_input_ids=tgt_in).logits
            keep = tgt_in != 0
            worst = max(worst, float((mine - theirs).abs()[keep].max()))
            largest = max(largest, float(mine.abs()[keep].max()))
    print(f"Hugging Face (nmt export huggingface, from_pretrained): teacher-forced logits on source -> reference, "
          f"max |difference| {worst:.2e} (logits up to {largest:.1f})")
    for label, beam, key in (("greedy", 1, "greedy"), ("beam 4", 4, "fairseq, stop beam")):
        out = []
        with torch.inference_mode():
            for i in range(0, len(src), 48):
                batch = tokenizer(src[i : i + 48], return_tensors="pt", padding=True)
                generated = model.generate(**batch, num_beams=beam, max_length=None,
                                           max_new_tokens=batch["input_ids"].size(1) + 50)
                out += tokenizer.batch_decode(generated, skip_special_tokens=True)
        print(f"  generate {label:<8} BLEU {bleu(out, ref):5.2f}  identical to nmt {key}: {same(out, nmt[key], cut[key])}")


if __name__ == "__main__":
    main()

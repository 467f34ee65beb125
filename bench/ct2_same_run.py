"""Same-run speed and agreement of nmt and CTranslate2 on one trained checkpoint (beam 4, alpha 0.6, 2 threads).

Usage: python bench/ct2_same_run.py CHECKPOINT SRC_FILE [CT2_SITE_PACKAGES]
e.g.   python bench/ct2_same_run.py runs/multi30k/run/averaged.pt runs/multi30k/data/raw/test.en \
           /tmp/ct2venv/lib/python3.11/site-packages
The conversion is `nmt export ctranslate2` (through bench/translate.py's cached convert_to_ct2). Two rounds, alternated.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
if len(sys.argv) > 3:
    sys.path.append(sys.argv[3])

import ctranslate2  # noqa: E402
import torch  # noqa: E402
from translate import convert_to_ct2  # noqa: E402

from nmt_cli.checkpoints import format as checkpoint  # noqa: E402
from nmt_cli.decoding import SearchConfig  # noqa: E402
from nmt_cli.inference.translate import TranslateConfig, Translator, load_checkpoints  # noqa: E402


def main() -> None:
    ck, src_file = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    sp = checkpoint.load(ck).tokenizer_obj().sp
    model_dir = convert_to_ct2(Path(ck), Path("runs/bench_translate/ct2_same_run"))
    lines = Path(src_file).read_text(encoding="utf-8").splitlines()
    src = [sp.encode(line, out_type=str) for line in lines]  # the model appends </s> (add_source_eos)
    kwargs = dict(beam_size=4, length_penalty=0.6, max_decoding_length=256, max_batch_size=2000, batch_type="tokens")
    speed, outputs = {}, {}
    for rnd in range(2):
        for compute_type in ("float32", "int8"):
            ct2 = ctranslate2.Translator(str(model_dir), device="cpu", compute_type=compute_type, intra_threads=2)
            start = time.perf_counter()
            results = ct2.translate_batch(src, **kwargs)
            speed[f"CTranslate2 {compute_type} round {rnd}"] = len(lines) / (time.perf_counter() - start)
            outputs[f"ct2 {compute_type}"] = [sp.decode_pieces(r.hypotheses[0]) for r in results]
        for precision in ("fp32", "bf16"):
            config = TranslateConfig(search=SearchConfig(beam=4), buffer_size=len(lines))
            nmt = Translator(load_checkpoints([ck]), "cpu", precision, config)
            nmt.translate(lines[:32])  # warm-up
            start = time.perf_counter()
            out = nmt.translate(lines)
            speed[f"nmt {precision} round {rnd}"] = len(lines) / (time.perf_counter() - start)
            outputs[f"nmt {precision}"] = [hyps[0][1] for hyps in out]
    for name, value in speed.items():
        print(f"{name}: {value:.1f} sentences/s")
    same = sum(a == b for a, b in zip(outputs["nmt fp32"], outputs["ct2 float32"], strict=True))
    print(f"identical lines, nmt fp32 vs CTranslate2 fp32: {same} / {len(lines)}")


if __name__ == "__main__":
    main()

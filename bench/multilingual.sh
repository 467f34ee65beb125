#!/usr/bin/env bash
# Multilingual quality benchmark on Multi30k (en-de, en-fr and en-cs share one English side): one en->{de,fr,cs}
# model against three bilingual models of the same size, trained for the same total number of updates (each
# bilingual model STEPS, the multilingual one 3 x STEPS), scored on the three test sets (test_2016_flickr).
#   prepare: the multilingual data with nmt prepare custom --pairs (one BPE of VOCAB pieces over four languages,
#            >>de<< >>fr<< >>cs<< tags), each bilingual direction with its own BPE of VOCAB pieces
#   train:   the same model options, warmup, learning rate and batch size for all four
#   test:    beam 4, length penalty 0.6, sacreBLEU per direction; the multilingual model with --tgt-lang; the share of
#            its output lines that py3langid (among de, fr, cs, en) finds in the language asked
# Usage: bash bench/multilingual.sh   (env: SHARED, RUN_DIR, STEPS, MODEL, MAX_TOKENS, PRECISION, WARMUP, LR, VOCAB)
set -euo pipefail
cd "$(dirname "$0")/.."
NMT=${NMT:-.venv/bin/nmt}
PY=${PY:-.venv/bin/python}
SHARED=${SHARED:-../shared/data}
DATA=$SHARED/multi30k
OUT=${RUN_DIR:-runs/multilingual}
STEPS=${STEPS:-3000}
MODEL=${MODEL:---d-model 256 --d-ff 1024 --heads 4 --layers 3 --dropout 0.1}
MAX_TOKENS=${MAX_TOKENS:-4096}
PRECISION=${PRECISION:-bf16}
WARMUP=${WARMUP:-1000}
LR=${LR:-0.001}
VOCAB=${VOCAB:-8000}
LANGS="de fr cs"
[ -f "$DATA/train.en" ] || { echo "error: $DATA/train.en not found; set SHARED=path/to/shared/data" >&2; exit 1; }
mkdir -p "$OUT"

train() {  # DATA_DIR RUN_DIR UPDATES
  rm -rf "$2"
  # shellcheck disable=SC2086
  $NMT train "$1" -o "$2" --preset base $MODEL --label-smoothing 0.1 --warmup "$WARMUP" --lr "$LR" \
    --max-tokens "$MAX_TOKENS" --update-freq 1 --max-steps "$3" --save-every $(($3 / 5)) --valid-every $(($3 / 5)) \
    --average-last 3 --precision "$PRECISION" --no-resume
}

echo "== prepare: multilingual (--pairs en-de,en-fr,en-cs) and bilingual, $VOCAB BPE pieces each"
$NMT prepare custom --pairs en-de,en-fr,en-cs --train "$DATA/train" --valid "$DATA/valid" --test "$DATA/test" \
  --vocab-size "$VOCAB" -o "$OUT/multi/data"
for l in $LANGS; do
  $NMT prepare custom --src-lang en --tgt-lang "$l" --train "$DATA/train" --valid "$DATA/valid" --test "$DATA/test" \
    --vocab-size "$VOCAB" -o "$OUT/$l/data"
done

echo "== train: $MODEL, $MAX_TOKENS tokens/update, $PRECISION; bilingual $STEPS updates each, multilingual $((3 * STEPS))"
for l in $LANGS; do
  train "$OUT/$l/data" "$OUT/$l/run" "$STEPS"
done
train "$OUT/multi/data" "$OUT/multi/run" $((3 * STEPS))

echo "== translate test (beam 4, length penalty 0.6)"
for l in $LANGS; do
  $NMT translate -m "$OUT/$l/run/averaged.pt" --beam 4 --lenpen 0.6 < "$OUT/$l/data/raw/test.en" > "$OUT/test.bi.$l"
  $NMT translate -m "$OUT/multi/run/averaged.pt" --tgt-lang "$l" --beam 4 --lenpen 0.6 \
    < "$OUT/multi/data/raw/test.en-$l.en" > "$OUT/test.multi.$l"
done

$PY - "$OUT" $LANGS <<'PY'
import json, sys
from pathlib import Path

import py3langid
import sacrebleu

from nmt_cli.checkpoints import format as checkpoint

out, langs = Path(sys.argv[1]), sys.argv[2:]
py3langid.set_languages(langs + ["en"])
bleu = sacrebleu.BLEU()


def params(run):
    return sum(p.numel() for p in checkpoint.load(run / "averaged.pt").build_model().parameters())


def updates(run):
    return [json.loads(line) for line in open(run / "metrics.jsonl")][-1]["step"]


print(f"{'direction':<10}{'bilingual':>10}{'multilingual':>14}{'delta':>8}{'in language':>13}")
for lang in langs:
    ref = (out / lang / "data" / "raw" / f"test.{lang}").read_text().splitlines()
    bi = (out / f"test.bi.{lang}").read_text().splitlines()
    multi = (out / f"test.multi.{lang}").read_text().splitlines()
    b, m = (bleu.corpus_score(h, [ref]).score for h in (bi, multi))
    inside = sum(py3langid.classify(line)[0] == lang for line in multi) / len(multi)
    print(f"en-{lang:<7}{b:>10.1f}{m:>14.1f}{m - b:>+8.1f}{inside:>12.1%}")
bi_runs = [out / lang / "run" for lang in langs]
print(f"updates: bilingual {' + '.join(str(updates(r)) for r in bi_runs)}, multilingual {updates(out / 'multi' / 'run')}")
print(f"parameters: bilingual {' + '.join(f'{params(r) / 1e6:.2f}M' for r in bi_runs)}, "
      f"multilingual {params(out / 'multi' / 'run') / 1e6:.2f}M")
print(f"BLEU: {bleu.get_signature()}")
PY

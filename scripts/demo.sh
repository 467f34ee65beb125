#!/usr/bin/env bash
# The whole pipeline on the embedded sample corpus: prepare, train (tiny preset), average, translate, score.
# Training runs a fixed number of updates (not a wall time): a slow or busy machine takes longer and reaches the
# same model. The demo fails (exit 1) when the model does not translate the sample test set well.
set -euo pipefail
NMT=${NMT:-nmt}
DIR=${NMT_DEMO_DIR:-demo}
STEPS=${NMT_DEMO_STEPS:-1200}
MIN_BLEU=${NMT_DEMO_MIN_BLEU:-90}
mkdir -p "$DIR"
echo "== nmt prepare sample"
$NMT prepare sample -o "$DIR/data"
echo "== nmt train (tiny preset, $STEPS updates; the live line shows the ETA)"
rm -rf "$DIR/run"  # a demo run starts fresh every time (the prepared data is reused)
# (the preset saves every STEPS/20 updates in so short a run and averages the last 5 into averaged.pt)
$NMT train "$DIR/data" -o "$DIR/run" --preset tiny --max-steps "$STEPS" --precision auto
echo "== nmt translate the sample test set"
$NMT translate -m "$DIR/run/averaged.pt" < "$DIR/data/raw/test.en" > "$DIR/test.hyp.de"
echo "== example translations"
paste <(head -n 5 "$DIR/data/raw/test.en") <(head -n 5 "$DIR/test.hyp.de") | sed 's/\t/\n   -> /'
echo "== nmt score"
$NMT score "$DIR/test.hyp.de" -r "$DIR/data/raw/test.de" | tee "$DIR/score.txt"
bleu=$(awk 'NR == 2 {print $2}' "$DIR/score.txt")
if ! awk -v b="$bleu" -v m="$MIN_BLEU" 'BEGIN {exit !(b + 0 >= m + 0)}'; then
  echo "error: the demo model scored BLEU $bleu on the sample test set, below the $MIN_BLEU it reaches when training" \
       "works; see $DIR/run/metrics.jsonl and report it with the output above" >&2
  exit 1
fi
echo "demo done: BLEU $bleu (at least $MIN_BLEU expected); everything is in $DIR/"

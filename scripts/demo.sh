#!/usr/bin/env bash
# The whole pipeline on the embedded sample corpus: prepare, train (tiny preset), average, translate, score.
set -euo pipefail
NMT=${NMT:-nmt}
DIR=${NMT_DEMO_DIR:-demo}
MINUTES=${NMT_DEMO_MINUTES:-4.5}
mkdir -p "$DIR"
echo "== nmt prepare sample"
$NMT prepare sample -o "$DIR/data"
echo "== nmt train (tiny preset, ${MINUTES} minutes)"
$NMT train "$DIR/data" -o "$DIR/run" --preset tiny --max-time "$MINUTES" --precision auto --average-last 5
echo "== nmt translate the sample test set"
$NMT translate -m "$DIR/run/averaged.pt" < "$DIR/data/raw/test.en" > "$DIR/test.hyp.de"
echo "== example translations"
paste <(head -n 5 "$DIR/data/raw/test.en") <(head -n 5 "$DIR/test.hyp.de") | sed 's/\t/\n   -> /'
echo "== nmt score"
$NMT score "$DIR/test.hyp.de" -r "$DIR/data/raw/test.de"

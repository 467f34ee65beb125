"""The names of a run directory's files (a leaf: it imports nothing of nmt's), so that planning, the trainer, the
checkpoint manager and the command read them from one place.

    checkpoint_last.pt        weights + the full training state (resume from here)
    checkpoint_best.pt        weights of the best validation score so far
    checkpoint_<step>.pt      weights saved every N updates (or M minutes); the last K are kept (for averaging)
    averaged.pt               the mean of the last N checkpoint_<step>.pt, at the end
    config.json, config.yaml  what the run resolved on its machine; its recipe (`nmt train --config`)
    metrics.jsonl, train.log  rank 0's log records; what `nmt train` printed
"""

LAST, BEST, AVERAGED = "checkpoint_last.pt", "checkpoint_best.pt", "averaged.pt"
CONFIG_JSON, CONFIG_YAML = "config.json", "config.yaml"
METRICS_JSONL, TRAIN_LOG = "metrics.jsonl", "train.log"

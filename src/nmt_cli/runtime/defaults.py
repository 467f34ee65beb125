"""Search and batching defaults, defined once. SearchConfig, Translator and TrainConfig take them from here, and so do
the options and help texts of `nmt translate` and `nmt train` (this module imports nothing, so `nmt --help` stays
fast). The values are the paper's search (beam 4, length penalty 0.6, source + 50 tokens) and the batch sizes
measured per device (docs/results.md#cpu-translation; translate.py says why)."""

BEAM = 4  # beam size of nmt translate, the Python API and nmt train's validation BLEU
LENPEN = 0.6  # length penalty exponent alpha
LENPEN_FORM = "gnmt"  # ((5 + len) / 6) ** alpha, the paper's
STOP = "beam"  # a sentence's search ends once BEAM hypotheses have ended
MAX_LEN_A, MAX_LEN_B = 1.0, 50  # maximum output tokens = A * source tokens + B
# Padded source tokens per translation batch, per device type (bench/translate.py, small model, 1 thread, found
# 2000 as fast as 1000 on CPU, and faster than 6000).
MAX_TOKENS_PER_DEVICE = {"cpu": 2000, "cuda": 6000}


def max_tokens_help() -> str:
    """How `--max-tokens`'s default reads in help: '2000 on CPU, 6000 on GPU'."""
    return f"{MAX_TOKENS_PER_DEVICE['cpu']} on CPU, {MAX_TOKENS_PER_DEVICE['cuda']} on GPU"

# Target pieces taken per source piece from a vocabulary shortlist when translating on a CPU (data/shortlist.py;
# docs/results.md, Shortlist: the smallest size whose BLEU stays within 0.2 of the whole vocabulary's).
SHORTLIST_SIZE = 8

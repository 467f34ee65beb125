"""Old name of `nmt_cli.data.sample_corpus` (the embedded sample corpus), kept so that `from nmt_cli.data import
sample` and `python -m nmt_cli.data.sample OUT_DIR` go on working."""

import sys

from nmt_cli.data import sample_corpus

if __name__ == "__main__":
    sample_corpus.main(sys.argv[1:])
else:
    sys.modules[__name__] = sample_corpus

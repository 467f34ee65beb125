"""Models made elsewhere, read as nmt checkpoints: MarianMT/OPUS-MT folders (marian.py) and the models a run or a
command names by path, checkpoint or hub reference (pretrained.py). Above checkpoints/ (they build Checkpoints)
and beside data/ and hub/ (their tokenizers and downloads); nothing in checkpoints/ imports them."""

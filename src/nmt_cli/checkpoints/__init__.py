"""Checkpoints: the file format, atomic writes, averaging, and loading models from elsewhere (MarianMT folders, hub references)."""

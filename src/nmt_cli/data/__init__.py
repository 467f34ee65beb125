"""Corpora, tokenizer, binarized store and token batching."""

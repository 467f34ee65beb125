"""nmt: the Transformer of "Attention Is All You Need" and the NMT workflow around it."""

__version__ = "0.1.0"

"""nmt: the Transformer of "Attention Is All You Need" and the NMT workflow around it.

The Python API (docs/api.md):

    from nmt_cli import Translator
    translator = Translator.load("runs/base/averaged.pt")   # or "hf:ORG/NAME[@REVISION]", or a list (ensemble)
    translator.translate_best(["A man is riding a bike."])  # -> ["Ein Mann fährt Fahrrad."]
"""

__version__ = "0.1.0"
__all__ = ["Translator", "Translation", "__version__"]


def __getattr__(name: str):
    # Imported on first use, so that `nmt --version` and `import nmt_cli` stay free of torch.
    if name in ("Translator", "Translation"):
        from nmt_cli.inference import translate

        return getattr(translate, name)
    raise AttributeError(f"module 'nmt_cli' has no attribute {name!r}")

"""Converters from an nmt checkpoint to the engines models are deployed with, one module each:

- `ctranslate2.py`: a CTranslate2 model directory (its spec API), optionally quantized;
- `huggingface.py`: a `transformers` MarianMTModel with its MarianTokenizer, saved with `save_pretrained`;
- `folder.py`: export folders are written into a temporary directory and renamed into place;
- `card.py`: the model card (README.md) every export carries.

ctranslate2 and transformers are optional (`pip install 'nmt-cli[export]'`); `require()` says so in one line.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from nmt_cli.errors import ConfigError

EXTRA = "pip install 'nmt-cli[export]' (in a clone: pip install -e '.[export]')"


def require(module: str, purpose: str) -> ModuleType:
    """Import `module` (ctranslate2, transformers) or raise a ConfigError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"{purpose} needs the Python package {module!r}, which is not installed "
                          f"({exc}); install the export extra: {EXTRA}") from exc

"""Joint sentencepiece BPE with fixed special ids (pad 0, unk 1, bos 2, eos 3).

The model travels as bytes inside every checkpoint, so translation needs nothing but the checkpoint.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence

import sentencepiece as spm

from nmt_cli.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt_cli.errors import DataError


def train_bpe(sentences: Iterable[str], vocab_size: int, *, character_coverage: float = 1.0,
              num_threads: int = 2, seed_sentences: int = 0) -> bytes:
    """Learn a BPE model on `sentences` (both languages for a joint vocabulary); returns the model bytes.

    `seed_sentences` > 0 caps how many sentences sentencepiece samples (bounded memory on big corpora).
    """
    model = io.BytesIO()
    kwargs = dict(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size, model_type="bpe",
        character_coverage=character_coverage, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>", num_threads=num_threads,
        hard_vocab_limit=False, minloglevel=2,
    )
    if seed_sentences:
        kwargs.update(input_sentence_size=seed_sentences, shuffle_input_sentence=True)
    try:
        spm.SentencePieceTrainer.train(**kwargs)
    except RuntimeError as exc:
        raise DataError(f"sentencepiece could not learn a {vocab_size}-token BPE model: {exc}; "
                        "try a smaller --vocab-size") from exc
    return model.getvalue()


class Tokenizer:
    """Encode raw text to ids and decode ids to detokenized text with a sentencepiece model."""

    def __init__(self, model_bytes: bytes):
        self.model_bytes = bytes(model_bytes)
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(self.model_bytes)
        except Exception as exc:  # sentencepiece raises RuntimeError/OSError on garbage
            raise DataError(f"not a valid sentencepiece model ({exc})") from exc
        if (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id()) != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise DataError("sentencepiece model has other special ids than pad 0, unk 1, bos 2, eos 3; "
                            "re-run nmt prepare to learn a compatible model")

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    @classmethod
    def from_file(cls, path) -> Tokenizer:
        with open(path, "rb") as f:
            return cls(f.read())

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, lines: Sequence[str], num_threads: int = -1) -> list[list[int]]:
        """Token ids without BOS/EOS, one list per line."""
        return self.sp.encode(list(lines), out_type=int, num_threads=num_threads)

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Detokenized text; special ids (pad/bos/eos) are dropped."""
        specials = {PAD_ID, BOS_ID, EOS_ID}
        return self.sp.decode([[i for i in seq if i not in specials] for seq in ids])

    def pieces(self, line: str) -> list[str]:
        return self.sp.encode(line, out_type=str)

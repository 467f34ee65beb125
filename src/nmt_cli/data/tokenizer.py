"""Joint sentencepiece BPE with fixed special ids (pad 0, unk 1, bos 2, eos 3), and imported tokenizers.

The model travels as bytes inside every checkpoint, so translation needs nothing but the checkpoint.
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Iterable, Sequence

import sentencepiece as spm

from nmt_cli.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt_cli.errors import DataError


def train_bpe(sentences: Iterable[str], vocab_size: int, *, character_coverage: float = 1.0,
              num_threads: int = 2, seed_sentences: int = 0, symbols: Sequence[str] = ()) -> bytes:
    """Learn a BPE model on `sentences` (both languages for a joint vocabulary); returns the model bytes.
    `symbols` (a multilingual model's `>>xx<<` tags) become whole pieces that never split, ids 4, 5, ...

    `seed_sentences` > 0 caps how many sentences sentencepiece samples (bounded memory on big corpora).
    """
    model = io.BytesIO()
    kwargs = dict(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size, model_type="bpe",
        character_coverage=character_coverage, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>", num_threads=num_threads,
        hard_vocab_limit=False, minloglevel=2,
    )
    if symbols:
        kwargs["user_defined_symbols"] = list(symbols)
    if seed_sentences:
        kwargs.update(input_sentence_size=seed_sentences, shuffle_input_sentence=True)
    try:
        spm.SentencePieceTrainer.train(**kwargs)
    except RuntimeError as exc:
        raise DataError(f"sentencepiece could not learn a {vocab_size}-token BPE model: {exc}; "
                        "try a smaller --vocab-size") from exc
    return model.getvalue()


FEW_LINES = 16  # fewer lines than this are cut one at a time: sentencepiece's list calls start a thread pool each,
# which costs more than encoding a few lines one by one (what a server's one-sentence requests would pay)


def _encode(sp: spm.SentencePieceProcessor, lines: list[str], out_type, num_threads: int) -> list[list]:
    if len(lines) < FEW_LINES:
        return [sp.encode(line, out_type=out_type) for line in lines]
    return sp.encode(lines, out_type=out_type, num_threads=num_threads)


class Tokenizer:
    """Raw text <-> model ids. Two kinds, both carried inside every checkpoint:

    - nmt's own (`Tokenizer(model_bytes)`): one joint sentencepiece BPE model whose ids are the model's ids, with
      pad 0, unk 1, bos 2, eos 3.
    - an imported one (`Tokenizer(source, target, vocab)`, OPUS-MT/MarianMT's): a source and a target
      sentencepiece model that cut text into pieces, and a vocabulary (the piece of each model id, nmt's four
      special ids first) that numbers them; a piece outside it is unk. A leading language code `>>xx<<` (multilingual
      OPUS-MT models) stays one piece, as MarianTokenizer keeps it.
    """

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, model_bytes: bytes, target_bytes: bytes | None = None, vocab: Sequence[str] | None = None):
        self.model_bytes = bytes(model_bytes)
        self.target_bytes = None if target_bytes is None else bytes(target_bytes)
        self.vocab = None if vocab is None else list(vocab)
        self.sp = _load(self.model_bytes)
        if self.vocab is None:
            if self.target_bytes is not None:
                raise DataError("a separate target sentencepiece model needs a vocabulary; this tokenizer is damaged")
            if (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id()) != (PAD_ID, UNK_ID, BOS_ID,
                                                                                            EOS_ID):
                raise DataError("sentencepiece model has other special ids than pad 0, unk 1, bos 2, eos 3; "
                                "re-run nmt prepare to learn a compatible model")
            self.target_sp = self.sp
            self.index = None
        else:
            self.target_sp = _load(self.target_bytes) if self.target_bytes is not None else self.sp
            self.index = {piece: i for i, piece in enumerate(self.vocab)}
            if len(self.index) != len(self.vocab) or len(self.vocab) <= EOS_ID:
                raise DataError("the tokenizer's vocabulary repeats a piece or lacks the special tokens; it is damaged")

    @property
    def joint(self) -> bool:
        """nmt's own kind: sentencepiece ids are the model's ids."""
        return self.vocab is None

    def key(self) -> tuple:
        """What makes two tokenizers the same (checkpoints to average, ensemble or resume)."""
        return tokenizer_key(self.model_bytes, self.target_bytes, self.vocab)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size() if self.vocab is None else len(self.vocab)

    @functools.cached_property
    def languages(self) -> list[str]:
        """The target languages of a multilingual model: the codes of its `>>xx<<` pieces (OPUS-MT's convention: the
        target language's tag starts the source), in vocabulary order; [] for a model of one direction."""
        pieces = self.vocab if self.vocab is not None else (self.sp.id_to_piece(i) for i in range(self.vocab_size))
        return [p[2:-2] for p in pieces if _TAG.fullmatch(p)]

    def encode(self, lines: Sequence[str], num_threads: int = -1, side: str = "source") -> list[list[int]]:
        """Token ids without BOS/EOS, one list per line; `side` "target" for target-language text."""
        if self.vocab is None:
            if not self.languages:
                return _encode(self.sp, list(lines), int, num_threads)
            # a multilingual model's leading tag is one piece and the rest is cut on its own, as MarianTokenizer
            # does (so an export to MarianMT reads the same ids): not "▁" + tag, as sentencepiece would cut it
            codes, texts = zip(*(_language_code(line) for line in lines), strict=True) if lines else ((), ())
            ids = _encode(self.sp, list(texts), int, num_threads)
            return [[self.sp.piece_to_id(c) for c in code] + i for code, i in zip(codes, ids, strict=True)]
        sp = self.sp if side == "source" else self.target_sp
        codes, texts = zip(*(_language_code(line) for line in lines), strict=True) if lines else ((), ())
        pieces = _encode(sp, list(texts), str, num_threads)
        unk, index = UNK_ID, self.index
        return [[index.get(p, unk) for p in code + ps] for code, ps in zip(codes, pieces, strict=True)]

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Detokenized target text; special ids (pad/bos/eos) are dropped."""
        specials = {PAD_ID, BOS_ID, EOS_ID}
        if self.vocab is None:
            seqs = [[i for i in seq if i not in specials] for seq in ids]
            if len(seqs) < FEW_LINES:
                return [self.sp.decode(seq) for seq in seqs]
            return self.sp.decode(seqs)
        # as MarianTokenizer: a piece the target model does not know (a source-only piece of a shared vocabulary)
        # is decoded as written, its "▁" then read as a space
        return [self.target_sp.decode_pieces([self.vocab[i] for i in seq if i not in specials]).replace("\u2581", " ")
                .strip() for seq in ids]

    def piece(self, i: int, side: str = "target") -> str:
        """The piece of model id `i`."""
        if self.vocab is None:
            return self.sp.id_to_piece(i)
        return self.vocab[i]

    def piece_id(self, piece: str) -> int:
        """The model id of `piece` (UNK's where the vocabulary has none)."""
        if self.vocab is None:
            return self.sp.piece_to_id(piece)
        return self.index.get(piece, UNK_ID)

    def pieces(self, line: str, side: str = "source") -> list[str]:
        return [self.piece(i, side) for i in self.encode([line], side=side)[0]]


def tokenizer_key(model_bytes: bytes, target_bytes: bytes | None, vocab: Sequence[str] | None) -> tuple:
    """A tokenizer's identity from its parts, without loading sentencepiece (Checkpoint.tokenizer_key)."""
    return bytes(model_bytes), target_bytes, None if vocab is None else tuple(vocab)


def is_sentencepiece_model(model_bytes: bytes) -> bool:
    """Whether sentencepiece takes these bytes for a model (a damaged checkpoint's tokenizer is not)."""
    try:
        _load(model_bytes)
    except DataError:
        return False
    return True


def _load(model_bytes: bytes) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(model_bytes)
    except Exception as exc:  # sentencepiece raises RuntimeError/OSError on garbage
        raise DataError(f"not a valid sentencepiece model ({exc})") from exc
    return sp


_TAG = re.compile(r">>[^<>\s]+<<")


def language_tag(line: str) -> str | None:
    """The code of the `>>xx<<` tag that starts `line`, or None."""
    code = _language_code(line)[0]
    return code[0][2:-2] if code else None


def _language_code(line: str) -> tuple[list[str], str]:
    """`>>xx<< text` -> ([">>xx<<"], " text") as MarianTokenizer splits it; other lines ([], line)."""
    if line.startswith(">>"):
        end = line.find("<<")
        if end != -1:
            return [line[: end + 2]], line[end + 2 :]
    return [], line

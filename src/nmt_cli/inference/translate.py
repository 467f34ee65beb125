"""Streaming translation: raw lines in -> chunks -> length-sorted token batches -> search -> raw lines out.

Input is read in chunks of `buffer_size` lines; each chunk is tokenized, sorted by length, cut into batches of at
most `max_tokens` padded source tokens, translated, put back into input order, written and flushed. Memory is
bounded by one chunk whatever the input size, and output appears chunk by chunk.

No input line can stop the stream or shift the output: an empty line gives an empty line, invalid UTF-8 is
replaced (U+FFFD) with a warning, an over-long line is truncated to the model's limit with a warning.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import BinaryIO, NamedTuple

import torch

from nmt_cli import languages, segments
from nmt_cli.checkpoints import averaging
from nmt_cli.checkpoints import format as ckpt_io
from nmt_cli.config import EOS_ID
from nmt_cli.data import shortlist as shortlist_data
from nmt_cli.data.tokenizer import Tokenizer, language_tag
from nmt_cli.decoding import JOIN_BELOW, Hypothesis, SearchConfig
from nmt_cli.decoding.batch import source_batch
from nmt_cli.decoding.candidates import Shortlisting
from nmt_cli.decoding.graphs import GPU_CHECK_EVERY, StepGraphs
from nmt_cli.decoding.streams import decode_streams, default_streams
from nmt_cli.errors import CheckpointError, ConfigError, DataError
from nmt_cli.hub import pull as hub
from nmt_cli.importers import marian, pretrained
from nmt_cli.inference.ensemble import Ensemble
from nmt_cli.lines import iter_lines
from nmt_cli.runtime import defaults
from nmt_cli.runtime.memory import OutOfMemory, out_of_memory_advice
from nmt_cli.runtime.precision import resolve_device, resolve_dtype, slow_bf16_warning
from nmt_cli.segments import translatable

# Batch size by padded source tokens when not given: on CPU, batches that keep the [beam x rows, vocabulary]
# step tensors small are faster. Defined in defaults.py, which `nmt translate --help` shows too.
# The largest batch max_tokens "auto" looks for: beyond it a GPU is already busy (the probe stays a few seconds).
PROBE_CAP = 65536


@dataclass
class TranslateConfig:
    """How to batch and what to write. `search` holds the beam settings."""

    search: SearchConfig = field(default_factory=SearchConfig)
    buffer_size: int = 2000  # input lines per chunk (output is flushed after each chunk)
    max_tokens: int | str | None = None  # padded source tokens per batch; None: defaults.MAX_TOKENS_PER_DEVICE of the device;
    # "auto": on a GPU the largest batch that fits, probed when the Translator is made (probe.py); on CPU the default
    max_sentences: int = 512  # sentences per batch
    join_batches: bool = True  # continuous batching: a batch joins the running one's tail (decoding/scheduler.py)
    workers: int | None = None  # CPU decoding streams, each on its threads // workers threads; None: default_streams
    cuda_graphs: bool | None = None  # GPU: decoding steps replayed as CUDA graphs (decoding/graphs.py); None: on
    nbest: int = 1  # > 1: TSV rows "line<TAB>rank<TAB>score<TAB>text"
    scores: bool = False  # prefix each output line with the best hypothesis' score and a TAB
    token_scores: bool = False  # add a column: the log-probability of each target piece and EOS
    alignment: str | None = None  # "words" | "pieces": add a column of Pharaoh i-j links (alignment.py)
    alignment_layer: int = -1  # decoder layer whose encoder-decoder attention gives the links
    replace_unk: bool = False  # replace unknown target tokens by the aligned source word
    tgt_lang: str | None = None  # a multilingual model: the target language, as its `>>xx<<` tag at each line's start
    split_sentences: bool = False  # each line a paragraph: its sentences translated one by one (segments.py)
    shortlist: bool = True  # on a CPU, the model's vocabulary shortlist where it has one (decoding/candidates.py)
    shortlist_size: int | None = None  # target pieces per source piece (None: data/shortlist.py's SIZE)

    # `nmt translate`'s option names that differ from their SearchConfig field; every other option is named as its
    # SearchConfig or TranslateConfig field (so an option added to either is accepted here as it is).
    RENAMED = {"lenpen": "alpha", "lenpen_form": "lp"}

    @classmethod
    def from_options(cls, **options) -> TranslateConfig:
        """A config from `nmt translate`'s option names (beam, lenpen, lenpen_form, stop, max_len_a, max_len_b,
        nbest, scores, buffer_size, max_tokens, max_sentences, ...); options not given keep their defaults."""
        search_fields = {f.name for f in dataclasses.fields(SearchConfig)} - {"nbest"}  # nbest: TranslateConfig's
        fields = {f.name for f in dataclasses.fields(cls)} - {"search"}
        search = {cls.RENAMED.get(k, k): v for k, v in options.items() if cls.RENAMED.get(k, k) in search_fields}
        unknown = set(options) - set(cls.RENAMED) - search_fields - fields
        if unknown:
            known = sorted((search_fields - set(cls.RENAMED.values())) | set(cls.RENAMED) | fields)
            raise ConfigError(f"unknown translation option(s) {sorted(unknown)}; known: {known}")
        return cls(search=SearchConfig(**search), **{k: v for k, v in options.items() if k in fields}).validate()

    def validate(self) -> TranslateConfig:
        if isinstance(self.max_tokens, str) and self.max_tokens != "auto":
            try:
                self.max_tokens = int(self.max_tokens)
            except ValueError:
                raise ConfigError(f"max-tokens must be a positive integer or 'auto', got {self.max_tokens!r}") from None
        for name in ("buffer_size", "max_tokens", "max_sentences", "workers", "shortlist_size"):
            value = getattr(self, name)
            if value is not None and value != "auto" and value < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.alignment not in (None, "words", "pieces"):
            raise ConfigError(f"unknown alignment unit {self.alignment!r}; choose words or pieces")
        if self.split_sentences and self.analyse:
            raise ConfigError("split-sentences gives a line's sentences their own translations, which have no "
                              "token scores, alignment or replaced unknowns of the whole line; use one of them")
        self.search = dataclasses.replace(self.search, nbest=self.nbest).validate()
        return self

    @property
    def analyse(self) -> bool:
        """Whether the hypotheses go through the teacher-forced pass of alignment.py."""
        return self.token_scores or self.alignment is not None or self.replace_unk


class Translation(NamedTuple):
    """One hypothesis of a line: its score (sum of log-probabilities / length penalty), detokenized text, and the
    extra columns when asked (`token_scores`: log p of each output token and EOS; `alignment`: Pharaoh links)."""

    score: float
    text: str
    token_scores: list[float] | None = None
    alignment: str | None = None


@dataclass
class TranslateStats:
    lines: int = 0
    src_tokens: int = 0
    tgt_tokens: int = 0
    seconds: float = 0.0


class Warner:
    """Reports the first occurrence of each kind of input problem in full, then counts the rest."""

    def __init__(self, emit: Callable[[str], None] | None = None):
        self.emit = emit or (lambda msg: print(f"warning: {msg}", file=sys.stderr, flush=True))
        self.counts: dict[str, int] = {}

    def __call__(self, kind: str, message: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.counts[kind] == 1:
            self.emit(message)

    def summary(self) -> None:
        for kind, n in self.counts.items():
            if n > 1:
                self.emit(f"{n - 1} more line(s) {kind}")


# ---------------------------------------------------------------------------------------------------- models


def load_checkpoints(models: Iterable[str | Path], average_last: int | None = None,
                     note: hub.Note | None = None) -> list[ckpt_io.Checkpoint]:
    """One checkpoint per `-m` value: a file, a MarianMT (OPUS-MT) folder, an `hf:ORG/NAME[@REVISION]` hub reference
    to either (pulled through the hub cache; `note` hears which commit; pretrained.py), or with `average_last` a
    run directory averaged on the fly."""
    out = []
    for item in models:
        if average_last:
            if hub.is_hub_ref(item):
                raise CheckpointError(f"{item}: --average-last needs a local run directory, not a hub reference")
            path = Path(item)
            if not path.is_dir():
                raise CheckpointError(f"{path}: --average-last needs a run directory holding checkpoints")
            out.append(averaging.average_checkpoints(averaging.last_checkpoints(path, average_last, note)))
        elif not hub.is_hub_ref(item) and Path(item).is_dir() and not marian.is_marian(item):
            raise CheckpointError(f"{item} is a directory; pass a checkpoint file (or a MarianMT model folder), or "
                                  "add --average-last N")
        else:
            out.append(pretrained.load(item, note)[0])
    if not out:
        raise CheckpointError("no checkpoint given; pass -m CHECKPOINT")
    if any(c.tokenizer_key() != out[0].tokenizer_key() for c in out[1:]):
        raise CheckpointError("the ensembled checkpoints use different tokenizers; ensemble models of one vocabulary")
    return out


def length_batches(sources: list[list[int]], max_tokens: int, max_sentences: int) -> Iterator[list[int]]:
    """Indices of the non-empty `sources`, longest first, in batches of at most `max_tokens` padded tokens and
    `max_sentences` sentences (a longer single sentence is a batch of its own)."""
    order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: -len(sources[i]))
    batch: list[int] = []
    for i in order:
        width = len(sources[batch[0]]) if batch else len(sources[i])
        if batch and ((len(batch) + 1) * width > max_tokens or len(batch) >= max_sentences):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def stream_batches(sources: list[list[int]], max_tokens: int, max_sentences: int, streams: int,
                   ) -> tuple[list[list[int]], list[int]]:
    """`length_batches` for `streams` decoding streams -> the batches and the stream of each. The non-empty
    sources, longest first, are dealt to the streams in turn (the k-th longest to stream k mod streams) and each
    stream's share is batched on its own: every stream gets about as many tokens of every length, so the streams end
    together. (Dealing out the batches instead left the last, short one to one stream: on the Multi30k test set 9
    batches, 7874 source tokens against 7308, the other core idle for the difference.) It depends only on the input,
    never on timing."""
    streams = max(1, streams)
    order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: -len(sources[i]))
    batches, owner = [], []
    for k in range(streams):  # (one stream: length_batches itself)
        share = set(order[k::streams])
        mine = list(length_batches([s if i in share else [] for i, s in enumerate(sources)], max_tokens,
                                   max_sentences))
        batches += mine
        owner += [k] * len(mine)
    return batches, owner


class Translator:
    """A model (or ensemble) with its tokenizer: translates lists of raw lines. The Python API (`from nmt_cli import
    Translator`; docs/api.md) and `nmt translate` both build it with `Translator.load`."""

    @classmethod
    def load(cls, model: str | Path | Iterable[str | Path], *, average_last: int | None = None,
             device: str = "auto", precision: str = "fp32", warn: Warner | None = None,
             note: hub.Note | None = None, **options) -> Translator:
        """Load a checkpoint file, an `hf:ORG/NAME[@REVISION]` hub reference or a run directory (with
        `average_last`), or a list of them (an ensemble). `options` are `nmt translate`'s option names, with
        SearchConfig's defaults (beam, lenpen, lenpen_form, stop, max_len_a, max_len_b, nbest, ...) and
        defaults.MAX_TOKENS_PER_DEVICE for max_tokens.
        """
        models = [model] if isinstance(model, (str, Path)) else list(model)
        config = TranslateConfig.from_options(**options)
        return cls(load_checkpoints(models, average_last, note), device, precision, config, warn)

    def __init__(self, checkpoints: list[ckpt_io.Checkpoint], device: str = "auto", precision: str = "fp32",
                 config: TranslateConfig | None = None, warn: Warner | None = None):
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(precision, self.device)
        if self.device.type == "cuda":
            from nmt_cli.model import avoid_cudnn_attention

            avoid_cudnn_attention()
        self.config = (config or TranslateConfig()).validate()
        if self.config.split_sentences:
            segments.require()  # before the model loads: what to install, in one line
        auto = self.config.max_tokens == "auto"
        if self.config.max_tokens is None or auto:
            self.config = dataclasses.replace(self.config, max_tokens=defaults.MAX_TOKENS_PER_DEVICE[self.device.type])
        self.max_tokens_reason: str | None = None  # with max_tokens "auto": how it was chosen (the CLI prints it)
        self.warn = warn or Warner()
        slow = slow_bf16_warning(self.dtype, self.device)
        if slow is not None:
            self.warn("slow bf16", slow)
        self.tokenizer: Tokenizer = checkpoints[0].tokenizer_obj()
        self.source_lang = checkpoints[0].langs.get("src")  # the sentence rules of --split-sentences
        models = [c.build_model(self.device, share=True).to(self.dtype) for c in checkpoints]
        # each model's parameters, counted before packing or quantizing (which turn weights into buffers)
        self.model_parameters = [sum(p.numel() for p in m.parameters()) for m in models]
        if self.device.type == "cpu":
            from nmt_cli.inference import packed

            onednn = precision == "fp32" and packed.use_packed()  # oneDNN's float32 products, not MKL's (packed.py)
            if onednn or self.dtype == torch.bfloat16:  # products through oneDNN
                packed.bound_caches()  # its memory, bounded
                for m in models:
                    m.row_multiple = packed.ROW_MULTIPLE  # and few product shapes for it to prepare
            if onednn:
                models = [packed.pack_linears(m) for m in models]
        if precision == "int8":
            from nmt_cli.inference.int8 import quantize_int8

            models = [quantize_int8(m) for m in models]
        if self.device.type == "cpu" and (precision == "int8" or onednn):
            from nmt_cli.inference import allocator

            allocator.give_back()  # the float32 weights just replaced: their heap memory to the system, not kept
        self.model = models[0] if len(models) == 1 else Ensemble(models)
        self.shortlist = self._shortlist(checkpoints)
        self.max_src_tokens = min(c.model_config.max_positions for c in checkpoints) - 1  # + EOS
        self.src_tokens = self.tgt_tokens = 0  # counted over all translate_ids calls (EOS included)
        # GPU: static caches, a host check every few steps, and the steps as CUDA graphs (decoding/graphs.py), kept
        # for the whole input (a graph serves every batch whose tensors land at the same addresses)
        self.graphs = (StepGraphs(self.device) if self.device.type == "cuda" and self.config.cuda_graphs is not False
                       and not isinstance(self.model, Ensemble) else None)
        if auto:
            self._probe_max_tokens()
        self.generator = torch.Generator(device=self.device)  # sampling: one stream for the whole input
        if self.config.search.seed is not None:
            self.generator.manual_seed(self.config.search.seed)
        else:
            self.generator.seed()

    def _shortlist(self, checkpoints: list[ckpt_io.Checkpoint]) -> Shortlisting | None:
        """How decoding uses the models' vocabulary shortlist: on a CPU, where every model has one and it is not
        turned off; an ensemble's is the union of its members' lists. None: the whole vocabulary."""
        cfg = self.config
        if not cfg.shortlist or self.device.type != "cpu" or any(c.shortlist is None for c in checkpoints):
            return None
        if self.tokenizer.languages:  # a multilingual model: one list a source piece mixes the target languages
            return None  # (lists per target language: not yet; measured wrong-language output on the toy test)
        size = cfg.shortlist_size or shortlist_data.SIZE
        lists = [shortlist_data.Shortlist.from_dict(c.shortlist, c.model_config.vocab_size) for c in checkpoints]
        pieces = torch.cat([s.pieces[:, :size] for s in lists], dim=1)
        tags = [self.tokenizer.piece_id(f">>{lang}<<") for lang in self.tokenizer.languages]
        always = torch.cat([torch.arange(4), torch.tensor(tags, dtype=torch.long)] + [s.frequent.long() for s in lists])
        return Shortlisting(pieces, always, pieces.size(1))

    def _probe_max_tokens(self) -> None:
        """max_tokens "auto": on a GPU, SAFETY x the largest batch whose full-length search fits (probe.py), at
        most PROBE_CAP; elsewhere the device's default."""
        if self.device.type != "cuda":
            self.max_tokens_reason = (f"{self.config.max_tokens}, the {self.device.type.upper()} default (the probe "
                                      "needs a CUDA GPU)")
            return
        from nmt_cli.inference.probe import largest_translate_batch
        from nmt_cli.runtime.memory import SAFETY

        found = largest_translate_batch(self.model, self.config.search, self.max_src_tokens + 1,
                                        self.config.max_sentences, self.device, PROBE_CAP,
                                        static=self.decode_options().get("static", False))
        if found is None:
            raise OutOfMemory(f"--max-tokens auto: not even one sentence fits in GPU memory with --beam "
                              f"{self.config.search.beam}; lower --beam or use --device cpu")
        self.config = dataclasses.replace(self.config, max_tokens=found)
        self.max_tokens_reason = f"{found} ({SAFETY:.0%} of the largest batch that fit a full-length search, probed)"

    def tagged(self, lines: list[str], first_line: int, tgt_lang: str | None = None) -> list[str]:
        """`lines` as a multilingual model reads them: each non-empty line starts with its target language's
        `>>xx<<` tag (`tgt_lang`, else the config's), unless it already has a tag (per-line targets); a model of one
        direction gets them unchanged. A code names the model's tag of its language (`fr` or `fre` for `>>fra<<`,
        `languages.resolve`), a line's own tag too. A language the model does not know, or a line with no target at
        all, is a ConfigError of one line naming the languages it knows."""
        known = self.tokenizer.languages
        if not known:
            return lines
        tgt = tgt_lang or self.config.tgt_lang or (known[0] if len(known) == 1 else None)
        choose = f"choose one of {', '.join(known)}"
        if tgt is not None:
            tgt = languages.resolve(tgt, known)
        out = []
        for i, line in enumerate(lines):
            tag = language_tag(line)
            if tag is not None and tag not in known:
                try:
                    line = f">>{languages.resolve(tag, known)}<<{line[len(tag) + 4:]}"
                except ConfigError:
                    raise ConfigError(f"line {first_line + i} asks for >>{tag}<<, which the model does not know; "
                                      f"{choose}") from None
            if tag is None and line.strip():
                if tgt is None:
                    raise ConfigError(f"a multilingual model needs a target language: give --tgt-lang ({choose}) or "
                                      f"start each line with its tag, e.g. >>{known[0]}<< (line {first_line + i} has none)")
                line = f">>{tgt}<< {line}"
            out.append(line)
        return out

    def encode(self, lines: list[str], first_line: int, tgt_lang: str | None = None) -> list[list[int]]:
        """Source ids with EOS appended ([] for an empty line), a multilingual model's target tag first (`tagged`);
        over-long lines truncated with a warning."""
        out = []
        for i, ids in enumerate(self.tokenizer.encode(self.tagged(lines, first_line, tgt_lang))):
            if len(ids) > self.max_src_tokens:
                self.warn("truncated", f"line {first_line + i}: {len(ids)} tokens, truncated to the model's "
                                       f"limit of {self.max_src_tokens}")
                ids = ids[: self.max_src_tokens]
            out.append(ids + [EOS_ID] if ids else [])
        return out

    def streams(self) -> int:
        """Decoding streams (decoding/streams.py): `workers` on a CPU when given, else `default_streams` (two for a
        small model on two threads or more); one on a GPU, and for sampling, which draws from one generator."""
        if self.device.type != "cpu" or self.config.search.sampling:
            return 1
        if self.config.workers is not None:
            return self.config.workers
        return default_streams(torch.get_num_threads(), max(self.model_parameters))

    def decode_options(self) -> dict:
        """decode_batches' options: with CUDA graphs on (a GPU), static caches, a host check every GPU_CHECK_EVERY
        steps and the steps as graphs; else the defaults (a host check every step on CPU, every GPU_CHECK_EVERY
        steps on a GPU)."""
        if self.graphs is None:
            return {}
        return dict(static=True, check_every=GPU_CHECK_EVERY, graphs=self.graphs)

    def batches(self, sources: list[list[int]]) -> tuple[list[list[int]], list[int]]:
        """Indices of non-empty sources, longest first, in batches of <= max_tokens padded tokens, and the decoding
        stream of each (`stream_batches`)."""
        return stream_batches(sources, self.config.max_tokens, self.config.max_sentences, self.streams())

    def encode_prefixes(self, prefixes: list[str], first_line: int) -> list[list[int]]:
        """Target prefix ids per line (no BOS/EOS; [] for an empty prefix); one that leaves no room to go on is
        truncated with a warning."""
        room = self.max_src_tokens - 1
        out = []
        for i, ids in enumerate(self.tokenizer.encode(prefixes, side="target")):
            if len(ids) > room:
                self.warn("prefix truncated", f"prefix of line {first_line + i}: {len(ids)} tokens, truncated to "
                                              f"{room}")
                ids = ids[:room]
            out.append(ids)
        return out

    @torch.inference_mode()
    def translate_ids(self, sources: list[list[int]], prefixes: list[list[int]] | None = None,
                      ) -> list[list[Hypothesis]]:
        """Hypotheses (best first; samples in the order drawn) per source, in input order; an empty source gives
        one empty hypothesis (its prefix, when one is given)."""
        results: list[list[Hypothesis]] = [[Hypothesis(list(prefixes[i]) if prefixes else [], 0.0, 0.0)]
                                           for i in range(len(sources))]
        batches, owner = self.batches(sources)
        with out_of_memory_advice(self._out_of_memory):
            per_batch = decode_streams(self.model, [source_batch([sources[i] for i in b], self.device) for b in batches],
                                       self.config.search, [[prefixes[i] for i in b] for b in batches] if prefixes else
                                       None, owner, JOIN_BELOW if self.config.join_batches else 0.0,
                                       self.generator, shortlist=self.shortlist, **self.decode_options())
        for batch, found in zip(batches, per_batch, strict=True):
            for i, hyps in zip(batch, found, strict=True):
                results[i] = hyps
                self.src_tokens += len(sources[i])
                self.tgt_tokens += len(hyps[0].tokens) + 1
        return results

    def _out_of_memory(self) -> str:
        cfg = self.config
        return (f"out of {self.device.type.upper()} memory translating batches of up to {cfg.max_tokens} padded source "
                f"tokens with beam {cfg.search.beam}; lower --max-tokens or --beam (Python: max_tokens, beam)")

    def translate(self, lines: list[str], first_line: int = 1, prefixes: list[str] | None = None,
                  tgt_lang: str | None = None) -> list[list[Translation]]:
        """Raw lines -> per line, its hypotheses as Translation(score, text, ...), best first. `prefixes`:
        one target prefix per line ('' for none), kept verbatim at the start of each output. `tgt_lang`: a
        multilingual model's target language (else the config's, or each line's own `>>xx<<` tag). A line with
        nothing to translate (no letter: an emoji, a number, a URL alone; segments.py) and no prefix comes back as
        given (without its `>>xx<<` tag), score 0. With `split_sentences` each line is a paragraph whose
        sentences are translated one by one and joined back with the line's own spacing (`_paragraphs`)."""
        if self.config.split_sentences:
            if prefixes is not None:
                raise ConfigError("a prefix starts a line's translation; with split-sentences a line has several: "
                                  "use one of them")
            return self._paragraphs(lines, first_line, tgt_lang)
        return self._lines(lines, first_line, prefixes, tgt_lang)

    def _lines(self, lines: list[str], first_line: int, prefixes: list[str] | None,
               tgt_lang: str | None) -> list[list[Translation]]:
        given = {i: text for i, text in enumerate(_untagged(line) for line in lines)
                 if not translatable(text) and not (prefixes and prefixes[i])}
        sources = self.encode([line if i not in given else "" for i, line in enumerate(lines)], first_line, tgt_lang)
        prefix_ids = self.encode_prefixes(prefixes, first_line) if prefixes is not None else None
        hyps = self.translate_ids(sources, prefix_ids)
        flat = [h for hs in hyps for h in hs]
        texts = self.tokenizer.decode([h.tokens for h in flat])
        if prefixes is not None:
            owner = [i for i, hs in enumerate(hyps) for _ in hs]
            texts = [_keep_prefix(t, prefixes[i], prefix_ids[i], self.tokenizer) for t, i in zip(texts, owner,
                                                                                                strict=True)]
        with out_of_memory_advice(self._out_of_memory):
            extras = self._analyse(lines, sources, hyps) if self.config.analyse else [(None, None, None)] * len(flat)
        it = iter(zip(flat, texts, extras, strict=True))
        out = []
        for i, hs in enumerate(hyps):
            row = []
            for _ in hs:
                h, text, (token_scores, alignment, replaced) = next(it)
                if i in given:
                    text, replaced = given[i], None
                row.append(Translation(h.score, _one_line(replaced if replaced is not None else text), token_scores,
                                  alignment))
            out.append(row)
        return out

    def _paragraphs(self, lines: list[str], first_line: int, tgt_lang: str | None) -> list[list[Translation]]:
        """Each line cut into its sentences (segments.split, the rules of the model's source language), those
        translated as lines, and joined back with the line's spacing; a line's tag applies to each of its
        sentences. The n-th hypothesis of a line joins the n-th of each sentence (or its last), its score the sum."""
        split = []
        for line in lines:
            tag = language_tag(line)
            head = line[:len(tag) + 4] + " " if tag is not None else ""
            pieces = segments.split(_untagged(line), self.source_lang, sentences=True)
            split.append((head, pieces))
        flat = [head + s if s else s for head, pieces in split for s in pieces[0::2]]
        results = self._lines(flat, first_line, None, tgt_lang)
        out, k = [], 0
        for _, pieces in split:
            rows = results[k:k + len(pieces[0::2])]
            k += len(rows)
            ranks = max(len(r) for r in rows)
            joined = []
            for rank in range(ranks):
                picked = [r[min(rank, len(r) - 1)] for r in rows]
                text = "".join(p if i % 2 else picked[i // 2].text for i, p in enumerate(pieces))
                joined.append(Translation(sum(h.score for h in picked), text))
            out.append(joined)
        return out

    def translate_best(self, lines: list[str], tgt_lang: str | None = None) -> list[str]:
        """Raw lines -> the best translation of each, in order (an empty line gives an empty string)."""
        return [hyps[0].text for hyps in self.translate(lines, tgt_lang=tgt_lang)]

    def _analyse(self, lines: list[str], sources: list[list[int]], hyps: list[list[Hypothesis]]) -> list[tuple]:
        """(token scores, alignment column, text with unknown tokens replaced or None) per hypothesis, from one
        teacher-forced pass per batch (alignment.analyse)."""
        from nmt_cli.inference import alignment

        cfg, tok = self.config, self.tokenizer
        pairs = [(i, h) for i, hs in enumerate(hyps) for h in hs]
        out = []
        for start in range(0, len(pairs), 64):
            chunk = pairs[start : start + 64]
            analyses = alignment.analyse(self.model, [sources[i] or [EOS_ID] for i, _ in chunk],
                                         [h.tokens for _, h in chunk], cfg.alignment_layer)
            for (i, h), a in zip(chunk, analyses, strict=True):
                src_pieces = [tok.piece(t, "source") for t in sources[i][:-1]]
                tgt_pieces = [tok.piece(t) for t in h.tokens]
                column = None
                if cfg.alignment == "words":
                    column = alignment.pharaoh(a.links, src_pieces, tgt_pieces)
                elif cfg.alignment == "pieces":
                    column = alignment.pharaoh(a.links)
                replaced = (alignment.replace_unk(h.tokens, tgt_pieces, a.links, src_pieces, lines[i].split())
                            if cfg.replace_unk else None)
                out.append((a.token_scores if cfg.token_scores else None, column, replaced))
        return out


def _untagged(line: str) -> str:
    """`line` without the `>>xx<<` tag (and the space after it) that may start it."""
    tag = language_tag(line)
    return line if tag is None else line[len(tag) + 4:].lstrip(" ")


def _keep_prefix(text: str, prefix: str, prefix_ids: list[int], tokenizer: Tokenizer) -> str:
    """The output starts with the prefix exactly as given (sentencepiece may have normalised its characters)."""
    if not prefix:
        return text
    decoded = tokenizer.decode([prefix_ids])[0]
    return prefix + text[len(decoded):] if text.startswith(decoded) else text


def _one_line(text: str) -> str:
    """Output text can never hold a line break (it would shift the alignment of later lines)."""
    return text.replace("\r", " ").replace("\n", " ") if ("\n" in text or "\r" in text) else text


# ---------------------------------------------------------------------------------------------------- streaming


def read_chunks(stream: BinaryIO, size: int, warn: Warner, first_line: int = 1) -> Iterator[list[str]]:
    """Lines of a binary stream (split by the rule of `nmt_cli.lines`; invalid UTF-8 replaced with a warning),
    `size` at a time."""
    number = first_line
    lines = iter_lines(stream)
    while True:
        raw = list(islice(lines, size))
        if not raw:
            return
        chunk = []
        for line in raw:
            try:
                chunk.append(line.decode("utf-8"))
            except UnicodeDecodeError as exc:
                warn("had invalid UTF-8", f"line {number}: invalid UTF-8 ({exc.reason} at byte {exc.start}); "
                                          "replaced with U+FFFD")
                chunk.append(line.decode("utf-8", errors="replace"))
            number += 1
        yield chunk


def format_chunk(results: list[list[Translation]], first_line: int, config: TranslateConfig) -> str:
    """Plain text (optionally `score<TAB>text`) or n-best TSV `line<TAB>rank<TAB>score<TAB>text` (1-based); with
    --token-scores and/or --print-alignment one more TAB-separated column each, in that order."""
    rows = []

    def extra(h: Translation) -> str:
        cols = []
        if config.token_scores:
            cols.append(" ".join(f"{x:.4f}" for x in h.token_scores or []))
        if config.alignment is not None:
            cols.append(h.alignment or "")
        return "".join("\t" + c for c in cols)

    for i, hyps in enumerate(results):
        if config.nbest > 1:
            rows.extend(f"{first_line + i}\t{rank}\t{h.score:.4f}\t{h.text}{extra(h)}" for rank, h in enumerate(hyps, 1))
        elif config.scores:
            rows.append(f"{hyps[0].score:.4f}\t{hyps[0].text}{extra(hyps[0])}")
        else:
            rows.append(f"{hyps[0].text}{extra(hyps[0])}")
    return "".join(row + "\n" for row in rows)


def translate_stream(translator: Translator, source: BinaryIO, sink: BinaryIO,
                     on_chunk: Callable[[TranslateStats], None] | None = None,
                     prefixes: BinaryIO | None = None) -> TranslateStats:
    """Translate every line of `source` into `sink` (UTF-8), chunk by chunk, flushing after each chunk. `prefixes`:
    a stream with one target prefix per input line."""
    stats, start = TranslateStats(), time.perf_counter()
    config = translator.config
    prefix_chunks = read_chunks(prefixes, config.buffer_size, translator.warn) if prefixes is not None else None
    for chunk in read_chunks(source, config.buffer_size, translator.warn, stats.lines + 1):
        chunk_prefixes = None
        if prefix_chunks is not None:
            chunk_prefixes = next(prefix_chunks, [])
            if len(chunk_prefixes) < len(chunk):
                raise DataError(f"the prefix file ends at line {stats.lines + len(chunk_prefixes)} but the input "
                                f"goes on; give one prefix line (possibly empty) per input line")
        results = translator.translate(chunk, stats.lines + 1, chunk_prefixes)
        sink.write(format_chunk(results, stats.lines + 1, config).encode("utf-8"))
        sink.flush()
        stats.lines += len(chunk)
        stats.src_tokens, stats.tgt_tokens = translator.src_tokens, translator.tgt_tokens
        stats.seconds = time.perf_counter() - start
        if on_chunk is not None:
            on_chunk(stats)
    if prefix_chunks is not None and next(prefix_chunks, None):
        translator.warn("extra prefixes", f"the prefix file has more lines than the input ({stats.lines}); the "
                                          "rest is ignored")
    translator.warn.summary()
    return stats


def set_threads(threads: int | None) -> None:
    """torch intra-op threads (None keeps torch's default: one per core)."""
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)

"""`nmt serve`: translation over HTTP, LibreTranslate's API and nmt's own (nmt_cli/serve; the `serve` extra)."""

from __future__ import annotations

from pathlib import Path

import typer

from nmt_cli.commands.helpformat import Command
from nmt_cli.commands.translate import OPTIONS, LengthPenalty, Stop
from nmt_cli.commands.translate import Device as DeviceChoice
from nmt_cli.runtime.precision import TranslatePrecision

_SUMMARY = "Serve translation over HTTP (LibreTranslate's API)"
_HELP = (
    "Serve one model per language pair (a multilingual model: each of its directions) over HTTP: LibreTranslate's API (POST /translate, /detect, /translate_file, "
    "/suggest, GET /languages, /spec), so its clients work unchanged, a web page at /, and nmt's decoding options "
    "per request, GET /health and GET /info. Sentences of "
    "concurrent requests share the decoder's batches; each response returns as soon as its own sentences are done.\n\n"
    "The decoding options below are the defaults a request can change. Needs the serve extra: "
    "pip install 'nmt-cli[serve]'. SIGTERM stops gracefully: no new connections, the requests in flight finish, "
    "exit 0. See docs/serve.md."
)
_EPILOG = """\
Examples:
  nmt serve -m runs/ende/averaged.pt --port 5000
  curl -s localhost:5000/translate -H 'Content-Type: application/json' \\
      -d '{"q": "A dog runs.", "source": "en", "target": "de"}'
  nmt serve -m en-de.pt -m de-en.pt --host 0.0.0.0 --api-keys keys.txt
  nmt serve -m en-de.pt --suggestions fixes.jsonl  # the web page is at /
  nmt serve -m model.pt --langs en-de --precision int8 --threads 4
  nmt serve -m runs/multi/averaged.pt -m de-en.pt  # en->de,fr,cs and de->en
  nmt serve -m hf:Helsinki-NLP/opus-mt-en-ROMANCE --langs en-mul
"""
_SERVER = "Server"


def register(app: typer.Typer) -> None:
    @app.command("serve", cls=Command, short_help=_SUMMARY, help=_HELP, epilog=_EPILOG)
    def serve(
        models: list[str] = typer.Option(
            ..., "-m", "--model", metavar="CKPT",
            help="Checkpoint file, MarianMT folder or hf:ORG/NAME[@REVISION]; repeat for more language pairs "
                 "(one model per pair).",
        ),
        langs: list[str] = typer.Option(
            None, "--langs", metavar="SRC-TGT",
            help="The language pair of each -m, in order (e.g. en-de); needed for a checkpoint that does not "
                 "record its languages, and overrides one that does. A multilingual model: SRC-mul serves every "
                 "target it knows, SRC-TGT that one.",
        ),
        host: str = typer.Option("127.0.0.1", "--host", rich_help_panel=_SERVER,
                                 help="Address to listen on (0.0.0.0: every interface)."),
        port: int = typer.Option(8080, "--port", min=0, max=65535, rich_help_panel=_SERVER,
                                 help="Port to listen on (0: any free port; the one chosen is printed)."),
        api_keys: Path = typer.Option(
            None, "--api-keys", metavar="FILE", rich_help_panel=_SERVER,
            help="Require api_key: one accepted key a line ('#' comments); others get 403.",
        ),
        char_limit: int = typer.Option(10000, "--char-limit", min=1, metavar="N", rich_help_panel=_SERVER,
                                       help="Characters per request (413 above)."),
        batch_limit: int = typer.Option(64, "--batch-limit", min=1, metavar="N", rich_help_panel=_SERVER,
                                        help="Sentences to translate per request (413 above)."),
        queue_size: int = typer.Option(
            1024, "--queue-size", min=1, metavar="N", rich_help_panel=_SERVER,
            help="Sentences waiting or being translated per model; a request that does not fit gets 503 with "
                 "Retry-After.",
        ),
        timeout: float = typer.Option(60.0, "--timeout", min=0.1, metavar="SECONDS", rich_help_panel=_SERVER,
                                      help="Time limit of a request (503 with Retry-After past it)."),
        max_beam: int = typer.Option(16, "--max-beam", min=1, metavar="N", rich_help_panel=_SERVER,
                                     help="Largest beam (and alternatives + 1) a request may ask for."),
        suggestions: Path = typer.Option(
            None, "--suggestions", metavar="FILE", rich_help_panel=_SERVER,
            help="Take POST /suggest: append each correction users send to FILE as a JSON line (q, s, source, "
                 "target, translation, time), to fine-tune on later; without it, /suggest is a 403.",
        ),
        file_char_limit: int = typer.Option(
            100000, "--file-char-limit", min=1, metavar="N", rich_help_panel=_SERVER,
            help="Characters of text in a file for POST /translate_file (.txt, .html, .docx; 413 above).",
        ),
        file_ttl: float = typer.Option(600.0, "--file-ttl", min=1, metavar="SECONDS", rich_help_panel=_SERVER,
                                       help="How long a translated file stays to be downloaded."),
        disable_files_translation: bool = typer.Option(
            False, "--disable-files-translation", rich_help_panel=_SERVER,
            help="Refuse POST /translate_file (403), as LibreTranslate's option of that name.",
        ),
        req_limit: int = typer.Option(
            None, "--req-limit", min=1, metavar="N", rich_help_panel=_SERVER, show_default="none",
            help="Requests a minute per client (its API key, else its address), each text of q one request, as "
                 "LibreTranslate's option: 429 with Retry-After above.",
        ),
        disable_web_ui: bool = typer.Option(False, "--disable-web-ui", rich_help_panel=_SERVER,
                                            help="No web page at / (404), as LibreTranslate's option."),
        access_log: bool = typer.Option(False, "--access-log", rich_help_panel=_SERVER,
                                        help="Log every request on stderr."),
        engine_process: bool = typer.Option(
            None, "--engine-process/--no-engine-process", rich_help_panel=_SERVER, show_default="on CPU",
            help="Decode in processes of their own, so that the HTTP side never holds the decoding's Python GIL: "
                 "one per model, two with 2 threads or more on CPU (as nmt translate's streams), half the threads "
                 "each (the default on CPU; not yet tried on a GPU, where it is off unless asked for).",
        ),
        beam: int = OPTIONS["beam"](),
        lenpen: float = OPTIONS["lenpen"](),
        lenpen_form: LengthPenalty = OPTIONS["lenpen_form"](),
        stop: Stop = OPTIONS["stop"](),
        max_len_a: float = OPTIONS["max_len_a"](),
        max_len_b: int = OPTIONS["max_len_b"](),
        min_len: int = OPTIONS["min_len"](),
        no_repeat_ngram: int = OPTIONS["no_repeat_ngram"](),
        sampling: bool = OPTIONS["sampling"](),
        topk: int = OPTIONS["topk"](),
        topp: float = OPTIONS["topp"](),
        temperature: float = OPTIONS["temperature"](),
        seed: int = OPTIONS["seed"](),
        max_tokens: str = OPTIONS["max_tokens"](),
        device: DeviceChoice = OPTIONS["device"](),
        precision: TranslatePrecision = OPTIONS["precision"](),
        threads: int = OPTIONS["threads"](),
        shortlist: bool = OPTIONS["shortlist"](),
        shortlist_size: int = OPTIONS["shortlist_size"](),
    ) -> None:
        from nmt_cli.errors import ConfigError

        try:
            from nmt_cli.serve import server as web
        except ImportError as exc:
            raise ConfigError(f"nmt serve needs the serve extra ({exc.name} is missing): pip install "
                              "'nmt-cli[serve]' (in a clone: pip install -e '.[serve]')") from None
        from nmt_cli.commands.messages import note_line, usage_error, warning_line
        from nmt_cli.inference import translate as core
        from nmt_cli.runtime import cpus
        from nmt_cli.serve.engine import Engine
        from nmt_cli.serve.service import Limits, Model, Service, directions

        if langs and len(langs) != len(models):
            raise usage_error(f"--langs given {len(langs)} time(s) for {len(models)} -m; give one pair per model")
        if batch_limit > queue_size:
            raise usage_error(f"--batch-limit {batch_limit} is above --queue-size {queue_size}: such a request could "
                              "never be queued; lower --batch-limit or raise --queue-size")
        pairs = [_pair(p) for p in langs] if langs else [None] * len(models)
        keys = _read_keys(api_keys) if api_keys is not None else None
        limits = Limits(batch_limit=batch_limit, char_limit=char_limit, queue_size=queue_size, timeout=timeout,
                        max_beam=max_beam, files=not disable_files_translation, file_char_limit=file_char_limit,
                        file_ttl=file_ttl, req_limit=req_limit or 0, web_ui=not disable_web_ui)
        if suggestions is not None:
            from nmt_cli.serve.suggestions import Suggestions

            Suggestions(suggestions)  # a file that cannot be written is refused now, in one line
        core.set_threads(threads)
        sampler = cpus.start() if threads is None else None
        options = dict(beam=beam, lenpen=lenpen, lenpen_form=lenpen_form.value, stop=stop.value, max_len_a=max_len_a,
                       max_len_b=max_len_b, min_len=min_len, no_repeat_ngram=no_repeat_ngram, sampling=sampling,
                       topk=topk, topp=topp, temperature=temperature, seed=seed, max_tokens=max_tokens,
                       shortlist=shortlist, shortlist_size=shortlist_size)
        loaded, seen = [], {}
        for name, pair in zip(models, pairs, strict=True):
            ckpts = core.load_checkpoints([name], note=note_line)
            translator = core.Translator(ckpts, device.value, precision.value,
                                         core.TranslateConfig.from_options(**options), core.Warner(warning_line))
            served = directions(ckpts[0].langs, translator.tokenizer.languages, pair)
            if not served:
                raise ConfigError(f"{name} does not record its languages; say them with --langs SRC-TGT "
                                  "(e.g. --langs en-de; a multilingual model: --langs en-mul)")
            label = f"{served[0][0]}-{served[0][1]}" if len(served) == 1 else name
            if translator.max_tokens_reason is not None:
                note_line(f"{label}: --max-tokens auto: {translator.max_tokens_reason}")
            mine = []
            for src, tgt, tag in served:
                other = seen.get((src, tgt))
                if other is not None and (other[1] is None) == (tag is None):
                    raise ConfigError(f"{other[0]} and {name} both translate {src}-{tgt}; serve one model per "
                                      "language pair (a multilingual model's direction yields to a bilingual one)")
                if other is None or tag is None:  # a bilingual model takes its pair from a multilingual one
                    seen[(src, tgt)] = (name, tag)
                    mine.append((src, tgt, tag))
            loaded.append((name, mine, translator))
        if sampler is not None and all(t.device.type == "cpu" for _, _, t in loaded):
            choice = sampler.threads()
            core.set_threads(choice.threads)
            threads = choice.threads
            if choice.threads < cpus.core_count():
                note_line(f"threads: {choice.reason} (--threads N to choose)")
        cpu = all(t.device.type == "cpu" for _, _, t in loaded)
        processes = engine_process if engine_process is not None else cpu
        # on CPU with 2 threads or more, as offline translation's streams: two engine processes a model with half
        # the threads each; one engine (in the server's process) leaves one thread to the HTTP side and the
        # encoding (docs/serve.md, Threads)
        streams = 2 if processes and cpu and threads is not None and threads >= 2 else 1
        decoding = threads
        if cpu and threads is not None and threads > 1:
            decoding = threads // 2 if streams == 2 else threads - 1
            if streams == 1:
                core.set_threads(decoding)

        def engine(name: str, label: str, tr: core.Translator):
            if not processes:
                return Engine(tr, queue_size, f"nmt-{label}")
            from nmt_cli.serve.remote import EnginePool, RemoteEngine

            spec = dict(model=name, device=device.value, precision=precision.value,
                        config=core.TranslateConfig.from_options(**options), threads=decoding)
            engines = [RemoteEngine(tr, spec, queue_size, f"nmt-{label}-{i}") for i in range(streams)]
            return engines[0] if streams == 1 else EnginePool(engines, queue_size)

        served_models = []
        for name, mine, tr in loaded:  # one engine a model, shared by a multilingual model's directions
            shared = engine(name, f"{mine[0][0]}-{mine[0][1]}" if len(mine) == 1 else "multi", tr) if mine else None
            served_models += [Model(name, src, tgt, shared, tag) for src, tgt, tag in mine]
        service = Service(served_models, limits, keys, precision.value, threads, suggestions)
        for (src, tgt), m in sorted(service.models.items()):
            note_line(f"{src}-{tgt}: {m.name}" + (f" (>>{m.tag}<<)" if m.tag else ""))
        status = web.run(service, host, port, access_log)
        raise typer.Exit(status)


def _pair(text: str) -> tuple[str, str]:
    from nmt_cli.commands.messages import usage_error

    parts = text.split("-")
    if len(parts) != 2 or not all(parts) or parts[0] == parts[1] or parts[0] == "mul":
        raise usage_error(f"--langs {text!r}: give SRC-TGT, two different language codes (e.g. en-de)")
    return parts[0], parts[1]


def _read_keys(path: Path) -> set[str]:
    from nmt_cli.errors import DataError

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read the API keys file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    keys = {line.strip() for line in lines if line.strip() and not line.strip().startswith("#")}
    if not keys:
        raise DataError(f"{path} holds no API key (one a line); add one or leave out --api-keys")
    return keys

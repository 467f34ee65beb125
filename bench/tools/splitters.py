"""Sentence splitters compared on a small hand-made set of paragraphs in the languages nmt's models translate from
(English, German, French, Czech: the sample corpus, Multi30k and the multilingual recipe): abbreviations, initials,
numbers, ellipses, quotes, brackets, URLs, questions and exclamations. Prints, per splitter, the paragraphs split
exactly as the reference, the precision and recall of its sentence boundaries, whether the pieces keep every
character (joined back they give the paragraph), and microseconds a paragraph (median of --rounds rounds), then
each paragraph it split otherwise.

    pip install pysbd sentencex sentence-splitter
    python bench/tools/splitters.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

# (language, [sentences]): a paragraph is its sentences joined by one space
PARAGRAPHS = [
    ("en", ["Dr. Smith went to Washington on Jan. 5.", "He arrived at 3 p.m. and left at 6."]),
    ("en", ["The U.S. economy grew by 2.5% last year.", "Prices rose, e.g. for food and rent."]),
    ("en", ["Wait... is that it?", "Yes!", "It costs $3.50 (approx.) at the shop."]),
    ("en", ["\"Where are you going?\" she asked.", "\"Home,\" he said."]),
    ("en", ["Visit https://example.org/a.b?c=1 for details.", "Mail us at info@example.org."]),
    ("en", ["A dog runs.", "A cat sleeps."]),
    ("en", ["J. R. R. Tolkien wrote it in 1937.", "It sold well."]),
    ("en", ["Version 2.0 is out.", "See section 3.1 for what changed."]),
    ("en", ["Mr. and Mrs. Brown live at No. 5 Elm St. in Springfield.", "They have two children."]),
    ("en", ["It was late.", "the lights were out (mostly).", "Nobody came."]),
    ("de", ["Dr. Müller kommt am 3. Mai um 10 Uhr.", "Er bringt z. B. Kuchen mit."]),
    ("de", ["Das kostet ca. 5 Euro, d.h. nicht viel.", "Wir kaufen es."]),
    ("de", ["Ein Hund rennt.", "Eine Katze schläft."]),
    ("de", ["Am 1. Januar 2020 war es kalt.", "Wer kam?", "Niemand!"]),
    ("de", ["Die Firma (gegr. 1990) wächst.", "Sie hat u. a. Kunden in Wien."]),
    ("fr", ["M. Dupont est arrivé à 8 h.", "Il est reparti à midi."]),
    ("fr", ["Il a acheté des pommes, des poires, etc. au marché.", "C'était cher !"]),
    ("fr", ["Le chien court.", "Le chat dort."]),
    ("fr", ["« Où vas-tu ? » demanda-t-elle.", "Il ne répondit pas."]),
    ("fr", ["Mme Martin habite au 3, rue de la Paix.", "Elle a 2,5 hectares de terrain."]),
    ("cs", ["Pes běží.", "Kočka spí."]),
    ("cs", ["Dr. Novák přišel v 8 hod.", "Odešel v poledne."]),
    ("cs", ["Stalo se to 5. května 1945.", "Byl to konec války."]),
    ("cs", ["Koupil jsem např. chléb a mléko.", "Bylo to levné."]),
]


def splitters() -> dict:
    out = {}
    try:
        import pysbd

        cache = {}

        def run_pysbd(lang, text):
            if lang not in cache:
                try:
                    cache[lang] = pysbd.Segmenter(language=lang, clean=False, char_span=False)
                except ValueError:  # a language it does not have (Czech): its English rules
                    print(f"    (pysbd has no {lang}: English rules)")
                    cache[lang] = pysbd.Segmenter(language="en", clean=False, char_span=False)
            return cache[lang].segment(text)

        out["pysbd " + _version("pysbd")] = run_pysbd
    except ImportError:
        pass
    try:
        import sentencex

        out["sentencex " + _version("sentencex")] = lambda lang, text: list(sentencex.segment(lang, text))
    except ImportError:
        pass
    try:
        from sentence_splitter import SentenceSplitter

        cache2 = {}

        def run_moses(lang, text):
            if lang not in cache2:
                try:
                    cache2[lang] = SentenceSplitter(language=lang)
                except Exception:  # a language it does not have: its English rules
                    print(f"    (sentence-splitter has no {lang}: English rules)")
                    cache2[lang] = SentenceSplitter(language="en")
            return cache2[lang].split(text)

        out["sentence-splitter " + _version("sentence-splitter")] = run_moses
    except ImportError:
        pass
    return out


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def boundaries(sentences: list[str]) -> set[int]:
    """Character offsets (spaces left out) where a sentence ends, the last one excluded."""
    ends, n = set(), 0
    for s in sentences[:-1]:
        n += len("".join(s.split()))
        ends.add(n)
    return ends


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds over the set (the median is shown)")
    args = parser.parse_args()
    print(f"{len(PARAGRAPHS)} paragraphs, {sum(len(s) for _, s in PARAGRAPHS)} sentences "
          f"({', '.join(sorted({lang for lang, _ in PARAGRAPHS}))})")
    print(f"{'splitter':26} {'exact':>7} {'precision':>9} {'recall':>7} {'lossless':>9} {'us/paragraph':>13}")
    for name, split in splitters().items():
        exact = tp = fp = fn = lossless = 0
        wrong = []
        for lang, gold in PARAGRAPHS:
            text = " ".join(gold)
            got = [s for s in split(lang, text) if s.strip()]
            lossless += "".join(got) == text
            if [s.strip() for s in got] == gold:
                exact += 1
            else:
                wrong.append((lang, got))
            g, p = boundaries(gold), boundaries([s.strip() for s in got])
            tp, fp, fn = tp + len(g & p), fp + len(p - g), fn + len(g - p)
        rounds = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            for lang, gold in PARAGRAPHS:
                split(lang, " ".join(gold))
            rounds.append((time.perf_counter() - start) / len(PARAGRAPHS) * 1e6)
        print(f"{name:26} {exact:>3}/{len(PARAGRAPHS):<3} {tp / max(1, tp + fp):>9.3f} {tp / max(1, tp + fn):>7.3f} "
              f"{lossless:>5}/{len(PARAGRAPHS):<3} {statistics.median(rounds):>13.0f}")
        for lang, got in wrong:
            print(f"    {lang}: {got}")


if __name__ == "__main__":
    main()

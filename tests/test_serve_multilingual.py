"""`nmt serve` with a multilingual model: /languages lists each of its directions, a request's source and target
route to it with the target's tag, and a bilingual model served beside it keeps its own pair."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'nmt-cli[serve]')")
httpx = pytest.importorskip("httpx", reason="the test-serve extra is not installed")

from conftest import toy_pairs  # noqa: E402
from helpers_serve import Server  # noqa: E402
from helpers_translate import make_checkpoint  # noqa: E402
from nmt_cli.checkpoints import format as checkpoint  # noqa: E402
from nmt_cli.data.tokenizer import train_bpe  # noqa: E402
from nmt_cli.inference.translate import Translator  # noqa: E402
from nmt_cli.serve.service import directions  # noqa: E402

LINES = [en for en, _ in toy_pairs(6, seed=12)]
TAGS = [">>de<<", ">>fr<<", ">>cs<<"]


@pytest.fixture(scope="module")
def models(tmp_path_factory, toy_tokenizer_bytes):
    folder = tmp_path_factory.mktemp("serve-multi")
    tokenizer = train_bpe([s for p in toy_pairs(400, seed=1) for s in p], vocab_size=70, symbols=TAGS)
    multi = make_checkpoint(folder / "multi.pt", tokenizer, seed=4, max_positions=128)
    ck = checkpoint.load(multi)
    ck.langs = {"src": "en", "tgt": "mul", "directions": [["en", "de"], ["en", "fr"], ["en", "cs"]],
                "tags": {t[2:-2]: t for t in TAGS}}
    checkpoint.save(ck, multi)
    bilingual = make_checkpoint(folder / "en-de.pt", toy_tokenizer_bytes, seed=3, max_positions=128)
    return multi, bilingual


def test_directions_of_a_model():
    trained = {"src": "en", "tgt": "mul", "directions": [["en", "de"], ["en", "fr"]]}
    assert directions(trained, ["de", "fr"]) == [("en", "de", "de"), ("en", "fr", "fr")]
    opus = {"src": "en", "tgt": "mul"}  # an imported OPUS-MT model: ISO 639-3 tags, served under ISO 639-1 codes
    assert directions(opus, ["deu", "fra", "eng"]) == [("en", "de", "deu"), ("en", "fr", "fra")]
    assert directions({}, ["deu", "fra"], ("en", "mul")) == [("en", "de", "deu"), ("en", "fr", "fra")]
    assert directions({}, ["deu", "fra"], ("en", "fr")) == [("en", "fr", "fra")]
    assert directions({"src": "en", "tgt": "de"}, []) == [("en", "de", None)]
    assert directions({}, ["cmn_Hans", "cmn_Hant"], ("en", "mul")) == [("en", "cmn_Hans", "cmn_Hans"),
                                                                       ("en", "cmn_Hant", "cmn_Hant")]


def test_a_multilingual_and_a_bilingual_model_served_together(models):
    multi, bilingual = models
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = Translator.load(multi, device="cpu")
        expected = {lang: ref.translate_best(LINES, tgt_lang=lang) for lang in ("de", "fr", "cs")}
        expected_bilingual = Translator.load(bilingual, device="cpu").translate_best(LINES)
    finally:
        torch.set_num_threads(threads)
    assert expected["fr"] != expected["cs"]  # the tag changes what even an untrained model writes
    s = Server("-m", str(multi), "-m", str(bilingual))
    try:
        langs = {lang["code"]: lang["targets"] for lang in httpx.get(s.url + "/languages").json()}
        assert langs == {"en": ["cs", "de", "en", "fr"], "cs": ["cs"], "de": ["de"], "fr": ["fr"]}
        for target in ("fr", "cs"):
            r = httpx.post(s.url + "/translate", json={"q": LINES, "source": "en", "target": target}, timeout=60)
            assert r.status_code == 200 and r.json()["translatedText"] == expected[target], r.text
        # en-de: the bilingual model's pair, which a multilingual model's direction yields to
        r = httpx.post(s.url + "/translate", json={"q": LINES, "source": "en", "target": "de"}, timeout=60)
        assert r.json()["translatedText"] == expected_bilingual
        info = {(m["source"], m["target"]): m for m in httpx.get(s.url + "/info").json()["models"]}
        assert info[("en", "fr")]["tag"] == ">>fr<<" and info[("en", "de")]["tag"] is None
        assert info[("en", "de")]["model"] == str(bilingual)
        r = httpx.post(s.url + "/translate", json={"q": "a cat", "source": "en", "target": "es"}, timeout=60)
        assert r.status_code == 400 and "es is not supported" in r.json()["error"]
    finally:
        assert s.stop() == 0, "".join(s.log)

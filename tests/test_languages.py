"""Which of a multilingual model's tags a requested language code means (nmt_cli.languages)."""

import pytest

from nmt_cli.errors import ConfigError
from nmt_cli.languages import resolve


def test_iso_639_1_and_639_3_codes_find_each_other():
    opus = ["deu", "fra", "ces"]
    assert [resolve(c, opus) for c in ("de", "fr", "fre", "cs", "cze", "fra")] == ["deu", "fra", "fra", "ces",
                                                                                   "ces", "fra"]
    assert resolve("deu", ["de", "fr"]) == "de"  # and the other way round (nmt's own tags as the data named them)
    assert resolve("ar", ["arb", "heb"]) == "arb"  # a macrolanguage finds its member


def test_unknown_and_ambiguous_codes_are_refused_naming_the_known_ones():
    with pytest.raises(ConfigError, match=r"does not translate into 'es'; choose one of deu, fra"):
        resolve("es", ["deu", "fra"])
    with pytest.raises(ConfigError, match=r"does not translate into 'xx'"):
        resolve("xx", ["deu"])
    with pytest.raises(ConfigError, match=r"'zh' matches several of the model's languages \(cmn_Hans, cmn_Hant\)"):
        resolve("zh", ["cmn_Hans", "cmn_Hant"])

"""Language codes: which of a multilingual model's `>>xx<<` tags a requested language means.

OPUS-MT's multi-target models tag targets with ISO 639-3 codes (`>>fra<<`, `>>deu<<`, `>>cmn_Hans<<`), older ones
and nmt's own with what their data called them (often ISO 639-1: `>>fr<<`). A user asks for `fr` or `fra` either
way. langcodes (the IANA registry's data, no other dependency) reduces each code to its BCP 47 language, a
macrolanguage's members to it (`arb` -> `ar`, `cmn` -> `zh`), so `fr`, `fra` and `fre` all find `>>fra<<`, and a
code that several tags share (`zh` on a model with `>>cmn_Hans<<` and `>>cmn_Hant<<`) is refused with both named.
"""

from __future__ import annotations

import functools

from nmt_cli.errors import ConfigError


@functools.lru_cache(maxsize=4096)
def base(code: str) -> str:
    """The BCP 47 language of `code` (`fra` -> `fr`, `cmn_Hans` -> `zh`, `pt-BR` -> `pt`); an unknown code is
    returned lower-cased as it is."""
    import langcodes

    try:
        return langcodes.Language.get(langcodes.standardize_tag(code.replace("_", "-"), macro=True)).language or code
    except (ValueError, LookupError):
        return code.lower()


def resolve(code: str, known: list[str]) -> str:
    """The tag code among `known` that `code` asks for: itself when a tag has it exactly, else the one tag whose
    language is the same (`fr` -> `fra`). A ConfigError naming the known codes when none or several match."""
    if code in known:
        return code
    matches = [k for k in known if base(k) == base(code)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ConfigError(f"{code!r} matches several of the model's languages ({', '.join(matches)}); give one of them")
    raise ConfigError(f"the model does not translate into {code!r}; choose one of {', '.join(known)}")

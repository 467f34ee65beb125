"""The embedded sample corpus: deterministic, disjoint splits, and German grammar checked by hand."""

import pytest

from nmt_cli.data import sample_corpus as sample
from nmt_cli.data.sample_corpus import NP, PLACES, VERBS, Clause, PlacePP, WithPP, generate

NOUNS = {n.en: n for n in sample._nouns()}
ADJS = {a.en: a for a in sample._adjectives()}
VERB = {v.en[0]: v for v in VERBS}
PLACE = {p.en: p for p in PLACES}


def np_(noun, det="the", adj=None, plural=False):
    return NP(NOUNS[noun], plural, det, ADJS[adj] if adj else None)


def main(clause, **kw):
    return sample._sentence(clause.en_words(**{k: v for k, v in kw.items() if k != "verb_first"})), \
        sample._sentence(clause.de_main(**kw))


def test_the_big_dog_sees_the_small_cat():
    c = Clause(np_("dog", adj="big"), VERB["see"], "present", acc=np_("cat", adj="small"))
    assert main(c) == ("The big dog sees the small cat.", "Der große Hund sieht die kleine Katze.")


def test_accusative_masculine_and_mixed_declension():
    c = Clause(np_("cat"), VERB["see"], "present", acc=np_("dog", adj="big"))
    assert main(c)[1] == "Die Katze sieht den großen Hund."
    assert np_("dog", "a", "big").de("nom") == "ein großer Hund"
    assert np_("dog", "a", "big").de("acc") == "einen großen Hund"
    assert np_("child", "a", "small").de("nom") == "ein kleines Kind"
    assert np_("cat", "my", "old").de("dat") == "meiner alten Katze"
    assert np_("dog", "a", "big", plural=True).de("nom") == "große Hunde"  # strong declension, no article
    assert np_("apple", "a", "red").en() == "a red apple" and np_("apple", "a").en() == "an apple"


def test_dative_after_mit_and_dative_plural():
    assert WithPP("with", np_("man", adj="old")).de() == "mit dem alten Mann"
    assert WithPP("with", np_("child", "my", plural=True)).de() == "mit meinen Kindern"
    assert WithPP("for", np_("brother", "our")).de() == "für unseren Bruder"  # für takes the accusative


def test_weak_masculine_nouns():
    assert np_("boy").de("nom") == "der Junge"
    assert np_("boy").de("acc") == "den Jungen"
    assert np_("student", "a").de("dat") == "einem Studenten"


def test_dative_verb_and_ditransitive():
    c = Clause(np_("man"), VERB["help"], "present", dat=np_("child"))
    assert main(c) == ("The man helps the child.", "Der Mann hilft dem Kind.")
    c = Clause(np_("woman"), VERB["give"], "present", dat=np_("boy"), acc=np_("book", "a"))
    assert main(c) == ("The woman gives the boy a book.", "Die Frau gibt dem Jungen ein Buch.")


def test_two_way_prepositions_and_contractions():
    assert PlacePP(PLACE["garden"], direction=False).de() == "im Garten"
    assert PlacePP(PLACE["garden"], direction=True).de() == "in den Garten"
    assert PlacePP(PLACE["house"], direction=True).de() == "ins Haus"
    assert PlacePP(PLACE["school"], direction=True).de() == "zur Schule"
    assert PlacePP(PLACE["station"], direction=False, adj=ADJS["old"]).de() == "am alten Bahnhof"


def test_verb_second_after_a_fronted_adverb():
    c = Clause(np_("dog"), VERB["see"], "present", acc=np_("cat"), adv="today")
    assert main(c, front_adv=True) == ("Today the dog sees the cat.", "Heute sieht der Hund die Katze.")
    assert main(c) == ("The dog sees the cat today.", "Der Hund sieht heute die Katze.")


def test_tenses_and_verb_final_subordinate_clause():
    c = Clause(np_("dog"), VERB["see"], "perfect", acc=np_("cat"))
    assert main(c) == ("The dog has seen the cat.", "Der Hund hat die Katze gesehen.")
    assert " ".join(c.de_sub()) == "der Hund die Katze gesehen hat"
    go = Clause(np_("child", plural=True), VERB["go"], "perfect", pps=[PlacePP(PLACE["school"], True)])
    assert main(go) == ("The children have gone to the school.", "Die Kinder sind zur Schule gegangen.")
    fut = Clause("I", VERB["buy"], "future", acc=np_("apple", "a"))
    assert main(fut) == ("I will buy an apple.", "Ich werde einen Apfel kaufen.")
    past = Clause("we", VERB["eat"], "past", acc=np_("cake", "the"))
    assert main(past) == ("We ate the cake.", "Wir aßen den Kuchen.")
    modal = Clause(np_("girl"), VERB["read"], "modal", modal="want", acc=np_("newspaper"))
    assert main(modal) == ("The girl wants to read the newspaper.", "Das Mädchen will die Zeitung lesen.")


def test_negation_and_questions():
    c = Clause(np_("dog"), VERB["see"], "present", acc=np_("cat", "a"), neg=True)
    assert main(c) == ("The dog does not see a cat.", "Der Hund sieht keine Katze.")
    c = Clause(np_("dog"), VERB["see"], "perfect", acc=np_("cat"), neg=True)
    assert main(c)[1] == "Der Hund hat die Katze nicht gesehen."
    q = Clause(np_("dog"), VERB["see"], "present", acc=np_("cat"))
    assert sample._sentence(q.en_words(question=True), "?") == "Does the dog see the cat?"
    assert sample._sentence(q.de_main(verb_first=True), "?") == "Sieht der Hund die Katze?"


def test_generation_is_deterministic_with_disjoint_splits():
    sizes = {"train": 3000, "valid": 200, "test": 200}
    a, b = generate(sizes, seed=7), generate(sizes, seed=7)
    assert a == b
    assert {k: len(v) for k, v in a.items()} == sizes
    assert generate(sizes, seed=8)["train"] != a["train"]
    en = {s: {p[0] for p in pairs} for s, pairs in a.items()}
    de = {s: {p[1] for p in pairs} for s, pairs in a.items()}
    for x, y in (("train", "valid"), ("train", "test"), ("valid", "test")):
        assert not en[x] & en[y] and not de[x] & de[y]
    assert len(en["train"]) == sizes["train"]  # no duplicates inside a split either


def test_sentences_are_well_formed():
    pairs = generate({"train": 2000}, seed=3)["train"]
    for en, de in pairs:
        assert 4 <= len(en.split()) <= 22
        assert en[0].isupper() and de[0].isupper()
        assert en[-1] in ".?" and de[-1] == en[-1]
        assert "  " not in de and " ," not in de
    german_words = {w.strip(".,?") for _, de in pairs for w in de.split()}
    nouns = {n.de for n in NOUNS.values()}
    assert nouns & german_words  # nouns appear capitalized, as German requires
    assert not {n.lower() for n in nouns} & german_words - {"junge"}  # junge: the adjective jung


@pytest.mark.parametrize("conj_de", ["weil", "dass", "wenn", "als", "während"])
def test_subordinate_conjunctions_occur_with_verb_final_order(conj_de):
    finite = {f for v in VERBS for f in (v.de[1], v.de[2], v.de[0], v.de[3], v.de_past_pl)} | \
        {"hat", "haben", "habe", "ist", "sind", "bin", "wird", "werden", "werde", "kann", "können", "muss",
         "müssen", "will", "wollen", "war", "waren"}
    pairs = generate({"train": 4000}, seed=5)["train"]
    hits = 0
    for _, de in pairs:
        for clause in de.rstrip(".?").split(", "):
            words = clause.split()
            if words[0].lower() == conj_de and len(words) > 2:
                hits += 1
                assert words[-1] in finite, de  # the finite verb closes the subordinate clause
    assert hits > 10

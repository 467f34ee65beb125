"""The embedded sample corpus: English -> German sentence pairs generated from templates, written for nmt.

Every pair is built from a small lexicon with real words and rendered by hand-written grammar rules on both
sides, so the German is grammatical: gender, number and case agreement of articles, possessives and adjectives
(weak, mixed and strong declension), weak masculine nouns (den Jungen), dative plural -n, prepositions that
govern the dative or the accusative (im Garten vs. in den Garten) with their contractions (im, ins, zum, zur, am),
verbs that take a dative object (helfen, folgen), verb-second order (Heute sieht der Hund ...), verb-final
subordinate clauses (..., dass der Hund die Katze gesehen hat), verb-first questions, negation with nicht/kein,
and five tenses/moods (present, simple past, perfect with haben/sein, future with werden, modal verbs).

Generation is deterministic (seeded `random.Random`) and takes well under a second for 30k pairs. The English
side is unambiguous (one German rendering per English sentence), so a small model can learn it in minutes.
No third-party text is used.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

SAMPLE_VERSION = 1
DEFAULT_SIZES = {"train": 30000, "valid": 800, "test": 800}
DEFAULT_SEED = 1234

# ---------------------------------------------------------------------------------------------------- lexicon


@dataclass(frozen=True)
class Noun:
    en: str
    en_pl: str
    de: str
    de_pl: str
    gender: str  # "m", "f" or "n"
    cat: str  # person, animal, food, text, thing, place
    weak: str = ""  # weak masculine: the accusative/dative singular form (Junge -> Jungen)


def _nouns() -> list[Noun]:
    rows = [
        # persons
        ("man", "men", "Mann", "Männer", "m", "person"), ("woman", "women", "Frau", "Frauen", "f", "person"),
        ("child", "children", "Kind", "Kinder", "n", "person"), ("girl", "girls", "Mädchen", "Mädchen", "n", "person"),
        ("teacher", "teachers", "Lehrer", "Lehrer", "m", "person"),
        ("doctor", "doctors", "Arzt", "Ärzte", "m", "person"), ("friend", "friends", "Freund", "Freunde", "m", "person"),
        ("sister", "sisters", "Schwester", "Schwestern", "f", "person"),
        ("brother", "brothers", "Bruder", "Brüder", "m", "person"),
        ("mother", "mothers", "Mutter", "Mütter", "f", "person"), ("father", "fathers", "Vater", "Väter", "m", "person"),
        ("cook", "cooks", "Koch", "Köche", "m", "person"), ("king", "kings", "König", "Könige", "m", "person"),
        # animals
        ("dog", "dogs", "Hund", "Hunde", "m", "animal"), ("cat", "cats", "Katze", "Katzen", "f", "animal"),
        ("horse", "horses", "Pferd", "Pferde", "n", "animal"), ("bird", "birds", "Vogel", "Vögel", "m", "animal"),
        ("mouse", "mice", "Maus", "Mäuse", "f", "animal"), ("cow", "cows", "Kuh", "Kühe", "f", "animal"),
        ("goat", "goats", "Ziege", "Ziegen", "f", "animal"), ("pig", "pigs", "Schwein", "Schweine", "n", "animal"),
        # food
        ("apple", "apples", "Apfel", "Äpfel", "m", "food"), ("cake", "cakes", "Kuchen", "Kuchen", "m", "food"),
        ("egg", "eggs", "Ei", "Eier", "n", "food"), ("sausage", "sausages", "Wurst", "Würste", "f", "food"),
        ("pear", "pears", "Birne", "Birnen", "f", "food"), ("bread roll", "bread rolls", "Brötchen", "Brötchen", "n", "food"),
        # things to read
        ("book", "books", "Buch", "Bücher", "n", "text"), ("letter", "letters", "Brief", "Briefe", "m", "text"),
        ("newspaper", "newspapers", "Zeitung", "Zeitungen", "f", "text"), ("map", "maps", "Karte", "Karten", "f", "text"),
        # things
        ("ball", "balls", "Ball", "Bälle", "m", "thing"), ("car", "cars", "Auto", "Autos", "n", "thing"),
        ("key", "keys", "Schlüssel", "Schlüssel", "m", "thing"), ("picture", "pictures", "Bild", "Bilder", "n", "thing"),
        ("flower", "flowers", "Blume", "Blumen", "f", "thing"), ("bag", "bags", "Tasche", "Taschen", "f", "thing"),
        ("cup", "cups", "Tasse", "Tassen", "f", "thing"), ("glass", "glasses", "Glas", "Gläser", "n", "thing"),
        ("bicycle", "bicycles", "Fahrrad", "Fahrräder", "n", "thing"), ("chair", "chairs", "Stuhl", "Stühle", "m", "thing"),
        ("hat", "hats", "Hut", "Hüte", "m", "thing"), ("clock", "clocks", "Uhr", "Uhren", "f", "thing"),
        ("box", "boxes", "Kiste", "Kisten", "f", "thing"), ("lamp", "lamps", "Lampe", "Lampen", "f", "thing"),
        ("gift", "gifts", "Geschenk", "Geschenke", "n", "thing"),
    ]
    nouns = [Noun(*r) for r in rows]
    weak = [("boy", "boys", "Junge", "Jungen", "m", "person", "Jungen"),
            ("student", "students", "Student", "Studenten", "m", "person", "Studenten"),
            ("neighbour", "neighbours", "Nachbar", "Nachbarn", "m", "person", "Nachbarn"),
            ("farmer", "farmers", "Bauer", "Bauern", "m", "person", "Bauern"),
            ("bear", "bears", "Bär", "Bären", "m", "animal", "Bären")]
    return nouns + [Noun(*r) for r in weak]


@dataclass(frozen=True)
class Place:
    """A place for prepositional phrases: `at`: (en prep, de prep) for location (dative),
    `to`: (en prep, de prep, de case) for direction."""

    en: str
    de: str
    gender: str
    at: tuple[str, str]
    to: tuple[str, str, str]


PLACES = [
    Place("garden", "Garten", "m", ("in", "in"), ("into", "in", "acc")),
    Place("house", "Haus", "n", ("in", "in"), ("into", "in", "acc")),
    Place("kitchen", "Küche", "f", ("in", "in"), ("into", "in", "acc")),
    Place("park", "Park", "m", ("in", "in"), ("into", "in", "acc")),
    Place("forest", "Wald", "m", ("in", "in"), ("into", "in", "acc")),
    Place("city", "Stadt", "f", ("in", "in"), ("into", "in", "acc")),
    Place("school", "Schule", "f", ("in", "in"), ("to", "zu", "dat")),
    Place("station", "Bahnhof", "m", ("at", "an"), ("to", "zu", "dat")),
    Place("lake", "See", "m", ("at", "an"), ("to", "an", "acc")),
    Place("river", "Fluss", "m", ("at", "an"), ("to", "zu", "dat")),
    Place("window", "Fenster", "n", ("at", "an"), ("to", "zu", "dat")),
    Place("market", "Markt", "m", ("at", "auf"), ("to", "auf", "acc")),
    Place("bridge", "Brücke", "f", ("on", "auf"), ("onto", "auf", "acc")),
    Place("village", "Dorf", "n", ("in", "in"), ("into", "in", "acc")),
]


@dataclass(frozen=True)
class Adj:
    en: str
    de: str  # predicative form
    stem: str  # stem for endings (teuer -> teur)
    cats: tuple[str, ...]


def _adjectives() -> list[Adj]:
    anim, obj = ("person", "animal"), ("thing", "text", "food")
    rows = [("big", "groß", "groß", anim + obj + ("place",)), ("small", "klein", "klein", anim + obj + ("place",)),
            ("old", "alt", "alt", anim + obj + ("place",)), ("young", "jung", "jung", anim),
            ("new", "neu", "neu", ("thing", "text", "place")), ("tired", "müde", "müd", anim),
            ("hungry", "hungrig", "hungrig", anim), ("friendly", "freundlich", "freundlich", anim),
            ("happy", "glücklich", "glücklich", anim), ("clever", "klug", "klug", anim),
            ("red", "rot", "rot", ("thing", "food")), ("blue", "blau", "blau", ("thing",)),
            ("black", "schwarz", "schwarz", ("thing", "animal")), ("white", "weiß", "weiß", ("thing", "animal")),
            ("beautiful", "schön", "schön", anim + ("thing", "place")), ("heavy", "schwer", "schwer", ("thing", "text")),
            ("expensive", "teuer", "teur", ("thing", "text")), ("dark", "dunkel", "dunkl", ("thing", "place")),
            ("fresh", "frisch", "frisch", ("food",)), ("sweet", "süß", "süß", ("food",)),
            ("long", "lang", "lang", ("text",)), ("quiet", "ruhig", "ruhig", anim + ("place",)),
            ("fast", "schnell", "schnell", ("animal", "thing")), ("good", "gut", "gut", anim + obj)]
    return [Adj(*r) for r in rows]


@dataclass(frozen=True)
class Verb:
    """en: base, 3sg, past, participle. de: infinitive, 1sg, 3sg, past sg, participle, auxiliary.
    obj: None (intransitive), "acc", "dat" or "dat+acc" (ditransitive); cats: allowed object categories."""

    en: tuple[str, str, str, str]
    de: tuple[str, str, str, str, str, str]
    subj: tuple[str, ...]
    obj: str | None = None
    cats: tuple[str, ...] = ()
    motion: bool = False  # takes a direction phrase (into the garden)
    en_past_ok: bool = True  # English past differs from the base form (not: read)

    @property
    def de_pl(self) -> str:
        return self.de[0]

    @property
    def de_past_pl(self) -> str:
        past = self.de[3]
        return past + ("n" if past.endswith("e") else "en")


P, A = ("person",), ("person", "animal")
ANY_OBJ = ("person", "animal", "thing", "text", "food")
VERBS = [
    Verb(("see", "sees", "saw", "seen"), ("sehen", "sehe", "sieht", "sah", "gesehen", "haben"), A, "acc", ANY_OBJ),
    Verb(("like", "likes", "liked", "liked"), ("mögen", "mag", "mag", "mochte", "gemocht", "haben"), A, "acc",
         ANY_OBJ),
    Verb(("find", "finds", "found", "found"), ("finden", "finde", "findet", "fand", "gefunden", "haben"), A, "acc",
         ("thing", "text", "food", "animal")),
    Verb(("buy", "buys", "bought", "bought"), ("kaufen", "kaufe", "kauft", "kaufte", "gekauft", "haben"), P, "acc",
         ("thing", "text", "food")),
    Verb(("read", "reads", "read", "read"), ("lesen", "lese", "liest", "las", "gelesen", "haben"), P, "acc",
         ("text",), en_past_ok=False),
    Verb(("eat", "eats", "ate", "eaten"), ("essen", "esse", "isst", "aß", "gegessen", "haben"), A, "acc", ("food",)),
    Verb(("wash", "washes", "washed", "washed"), ("waschen", "wasche", "wäscht", "wusch", "gewaschen", "haben"), P,
         "acc", ("thing", "animal")),
    Verb(("visit", "visits", "visited", "visited"), ("besuchen", "besuche", "besucht", "besuchte", "besucht",
                                                     "haben"), P, "acc", ("person",)),
    Verb(("hear", "hears", "heard", "heard"), ("hören", "höre", "hört", "hörte", "gehört", "haben"), A, "acc",
         ("person", "animal")),
    Verb(("carry", "carries", "carried", "carried"), ("tragen", "trage", "trägt", "trug", "getragen", "haben"), P,
         "acc", ("thing", "text", "food")),
    Verb(("need", "needs", "needed", "needed"), ("brauchen", "brauche", "braucht", "brauchte", "gebraucht", "haben"),
         A, "acc", ("thing", "text", "food")),
    Verb(("call", "calls", "called", "called"), ("rufen", "rufe", "ruft", "rief", "gerufen", "haben"), P, "acc",
         ("person", "animal")),
    Verb(("paint", "paints", "painted", "painted"), ("malen", "male", "malt", "malte", "gemalt", "haben"), P, "acc",
         ("thing", "animal", "person")),
    Verb(("take", "takes", "took", "taken"), ("nehmen", "nehme", "nimmt", "nahm", "genommen", "haben"), P, "acc",
         ("thing", "text", "food")),
    Verb(("forget", "forgets", "forgot", "forgotten"), ("vergessen", "vergesse", "vergisst", "vergaß", "vergessen",
                                                        "haben"), P, "acc", ("thing", "text")),
    Verb(("meet", "meets", "met", "met"), ("treffen", "treffe", "trifft", "traf", "getroffen", "haben"), P, "acc",
         ("person",)),
    Verb(("love", "loves", "loved", "loved"), ("lieben", "liebe", "liebt", "liebte", "geliebt", "haben"), A, "acc",
         ("person", "animal")),
    Verb(("catch", "catches", "caught", "caught"), ("fangen", "fange", "fängt", "fing", "gefangen", "haben"), A,
         "acc", ("animal", "thing")),
    Verb(("open", "opens", "opened", "opened"), ("öffnen", "öffne", "öffnet", "öffnete", "geöffnet", "haben"), P,
         "acc", ("text", "thing")),
    Verb(("help", "helps", "helped", "helped"), ("helfen", "helfe", "hilft", "half", "geholfen", "haben"), P, "dat",
         ("person", "animal")),
    Verb(("follow", "follows", "followed", "followed"), ("folgen", "folge", "folgt", "folgte", "gefolgt", "sein"), A,
         "dat", ("person", "animal")),
    Verb(("thank", "thanks", "thanked", "thanked"), ("danken", "danke", "dankt", "dankte", "gedankt", "haben"), P,
         "dat", ("person",)),
    Verb(("give", "gives", "gave", "given"), ("geben", "gebe", "gibt", "gab", "gegeben", "haben"), P, "dat+acc",
         ("thing", "text", "food")),
    Verb(("show", "shows", "showed", "shown"), ("zeigen", "zeige", "zeigt", "zeigte", "gezeigt", "haben"), P,
         "dat+acc", ("thing", "text", "animal")),
    Verb(("bring", "brings", "brought", "brought"), ("bringen", "bringe", "bringt", "brachte", "gebracht", "haben"),
         P, "dat+acc", ("thing", "text", "food")),
    Verb(("sleep", "sleeps", "slept", "slept"), ("schlafen", "schlafe", "schläft", "schlief", "geschlafen",
                                                 "haben"), A),
    Verb(("play", "plays", "played", "played"), ("spielen", "spiele", "spielt", "spielte", "gespielt", "haben"), A),
    Verb(("wait", "waits", "waited", "waited"), ("warten", "warte", "wartet", "wartete", "gewartet", "haben"), A),
    Verb(("laugh", "laughs", "laughed", "laughed"), ("lachen", "lache", "lacht", "lachte", "gelacht", "haben"), P),
    Verb(("sing", "sings", "sang", "sung"), ("singen", "singe", "singt", "sang", "gesungen", "haben"), A),
    Verb(("work", "works", "worked", "worked"), ("arbeiten", "arbeite", "arbeitet", "arbeitete", "gearbeitet",
                                                 "haben"), P),
    Verb(("go", "goes", "went", "gone"), ("gehen", "gehe", "geht", "ging", "gegangen", "sein"), A, motion=True),
    Verb(("run", "runs", "ran", "run"), ("laufen", "laufe", "läuft", "lief", "gelaufen", "sein"), A, motion=True),
    Verb(("swim", "swims", "swam", "swum"), ("schwimmen", "schwimme", "schwimmt", "schwamm", "geschwommen", "sein"),
         A, motion=True),
    Verb(("come", "comes", "came", "come"), ("kommen", "komme", "kommt", "kam", "gekommen", "sein"), A, motion=True),
    Verb(("drive", "drives", "drove", "driven"), ("fahren", "fahre", "fährt", "fuhr", "gefahren", "sein"), P,
         motion=True),
]

# Auxiliaries: present 1sg, 3sg, pl; past sg, pl.
AUX = {"haben": ("habe", "hat", "haben"), "sein": ("bin", "ist", "sind"), "werden": ("werde", "wird", "werden")}
COPULA_PAST = ("war", "waren")
MODALS = {  # English (3sg, other), German (1sg, 3sg, pl)
    "can": (("can", "can"), ("kann", "kann", "können")),
    "must": (("must", "must"), ("muss", "muss", "müssen")),
    "want": (("wants to", "want to"), ("will", "will", "wollen")),
}

PRONOUNS = {  # key: (English subject, German subject, person/number key)
    "I": ("I", "ich", "1sg"), "we": ("we", "wir", "pl"), "he": ("he", "er", "3sg"), "she": ("she", "sie", "3sg"),
    "they": ("they", "sie", "pl"),
}

TIME_ADVERBS = {  # English, German, allowed tenses
    "today": ("today", "heute", ("present", "perfect", "modal", "future")),
    "now": ("now", "jetzt", ("present", "modal")),
    "yesterday": ("yesterday", "gestern", ("past",)),  # English has no present perfect with yesterday
    "tomorrow": ("tomorrow", "morgen", ("future", "modal")),
    "morning": ("in the morning", "am Morgen", ("present", "past", "future", "modal")),
    "evening": ("in the evening", "am Abend", ("present", "past", "future", "modal")),
    "sunday": ("on Sunday", "am Sonntag", ("present", "past", "future", "modal")),
    "everyday": ("every day", "jeden Tag", ("present", "past", "modal")),
}

# ------------------------------------------------------------------------------------------ noun phrases

DEF = {"nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
       "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
       "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"}}
EIN_END = {"nom": {"m": "", "f": "e", "n": "", "pl": "e"}, "acc": {"m": "en", "f": "e", "n": "", "pl": "e"},
           "dat": {"m": "em", "f": "er", "n": "em", "pl": "en"}}
WEAK_ADJ = {"nom": {"m": "e", "f": "e", "n": "e", "pl": "en"}, "acc": {"m": "en", "f": "e", "n": "e", "pl": "en"},
            "dat": {"m": "en", "f": "en", "n": "en", "pl": "en"}}
MIXED_ADJ = {"nom": {"m": "er", "f": "e", "n": "es", "pl": "en"}, "acc": {"m": "en", "f": "e", "n": "es", "pl": "en"},
             "dat": {"m": "en", "f": "en", "n": "en", "pl": "en"}}
STRONG_PL_ADJ = {"nom": "e", "acc": "e", "dat": "en"}
CONTRACT = {("in", "dem"): "im", ("in", "das"): "ins", ("zu", "dem"): "zum", ("zu", "der"): "zur",
            ("an", "dem"): "am", ("an", "das"): "ans", ("von", "dem"): "vom", ("bei", "dem"): "beim"}
# determiner key -> (English, German ein-type stem or None for the definite article)
DETS = {"the": ("the", None), "a": ("a", "ein"), "my": ("my", "mein"), "our": ("our", "unser"),
        "his": ("his", "sein"), "her": ("her", "ihr"), "no": ("a", "kein")}


@dataclass(frozen=True)
class NP:
    """A noun phrase: noun, plural?, determiner key (the/a/my/our/his/her; "a" in plural = no article),
    optional adjective."""

    noun: Noun
    plural: bool
    det: str
    adj: Adj | None = None

    def en(self) -> str:
        words = ([self.adj.en] if self.adj else []) + [self.noun.en_pl if self.plural else self.noun.en]
        det = DETS[self.det][0]
        if det == "a":
            if self.plural:
                return " ".join(words)
            det = "an" if words[0][0] in "aeiou" else "a"
        return " ".join([det] + words)

    def de(self, case: str, negated: bool = False) -> str:
        """The German noun phrase in `case` (nom/acc/dat); negated turns ein/no article into kein."""
        n = self.noun
        g = "pl" if self.plural else n.gender
        det = "no" if negated and self.det == "a" else self.det
        stem = DETS[det][1]
        if stem is None:
            article, adj_end = DEF[case][g], WEAK_ADJ[case][g]
        elif self.plural and det == "a":
            article, adj_end = "", STRONG_PL_ADJ[case]
        else:
            article, adj_end = stem + EIN_END[case][g], MIXED_ADJ[case][g]
        if self.plural:
            noun = n.de_pl + ("n" if case == "dat" and n.de_pl[-1] not in "ns" else "")
        else:
            noun = n.weak if n.weak and case != "nom" else n.de
        adj = self.adj.stem + adj_end if self.adj else ""
        return " ".join(w for w in (article, adj, noun) if w)

    @property
    def person(self) -> str:
        return "pl" if self.plural else "3sg"


@dataclass(frozen=True)
class PlacePP:
    """A prepositional phrase with a place: location (dative) or direction (accusative or zu + dative)."""

    place: Place
    direction: bool
    adj: Adj | None = None

    def en(self) -> str:
        prep = self.place.to[0] if self.direction else self.place.at[0]
        words = ["the"] + ([self.adj.en] if self.adj else []) + [self.place.en]
        return " ".join([prep] + words)

    def de(self) -> str:
        if self.direction:
            prep, case = self.place.to[1], self.place.to[2]
        else:
            prep, case = self.place.at[1], "dat"
        g = self.place.gender
        article = DEF[case][g]
        adj = self.adj.stem + WEAK_ADJ[case][g] if self.adj else ""
        head = [CONTRACT[(prep, article)]] if (prep, article) in CONTRACT else [prep, article]
        return " ".join(head + ([adj] if adj else []) + [self.place.de])


@dataclass(frozen=True)
class WithPP:
    """mit + dative (with), für + accusative (for), ohne + accusative (without)."""

    prep: str  # with / for / without
    np: NP

    def en(self) -> str:
        return f"{self.prep} {self.np.en()}"

    def de(self) -> str:
        de_prep, case = {"with": ("mit", "dat"), "for": ("für", "acc"), "without": ("ohne", "acc")}[self.prep]
        return f"{de_prep} {self.np.de(case)}"


# --------------------------------------------------------------------------------------------- clauses


@dataclass
class Clause:
    """One clause: subject (NP or pronoun key), verb, objects, optional PPs, tense, negation, time adverb."""

    subj: NP | str
    verb: Verb | None  # None: copula with a predicative adjective
    tense: str  # present, past, perfect, future, modal
    modal: str = "can"
    dat: NP | None = None
    acc: NP | None = None
    pred: Adj | None = None
    pps: list = field(default_factory=list)
    neg: bool = False
    adv: str | None = None

    # ---- English
    def _person(self) -> str:
        return PRONOUNS[self.subj][2] if isinstance(self.subj, str) else self.subj.person

    def en_subject(self) -> str:
        return PRONOUNS[self.subj][0] if isinstance(self.subj, str) else self.subj.en()

    def en_verb(self, question: bool = False) -> tuple[list[str], list[str]]:
        """(words before the subject in a question, verb words after the subject)."""
        p = self._person()
        if self.verb is None:  # copula
            be = {"present": {"1sg": "am", "3sg": "is", "pl": "are"}, "past": {"1sg": "was", "3sg": "was", "pl": "were"}}
            form = be[self.tense][p]
            rest = ["not"] if self.neg else []
            return ([form], rest) if question else ([], [form] + rest)
        base, s3, past, part = self.verb.en
        if self.tense == "present":
            if self.neg or question:
                aux = "does" if p == "3sg" else "do"
                return self._split(aux, ["not", base] if self.neg else [base], question)
            return [], [s3 if p == "3sg" else base]
        if self.tense == "past":
            if self.neg or question:
                return self._split("did", ["not", base] if self.neg else [base], question)
            return [], [past]
        if self.tense == "perfect":
            aux = "has" if p == "3sg" else "have"
            return self._split(aux, ["not", part] if self.neg else [part], question)
        if self.tense == "future":
            return self._split("will", ["not", base] if self.neg else [base], question)
        en_forms = MODALS[self.modal][0]
        form = en_forms[0] if p == "3sg" else en_forms[1]
        if self.modal == "want":
            if self.neg or question:
                aux = "does" if p == "3sg" else "do"
                return self._split(aux, (["not"] if self.neg else []) + ["want", "to", base], question)
            return [], form.split() + [base]
        if self.neg:
            return [], ["cannot", base]
        return self._split(form, [base], question)

    @staticmethod
    def _split(aux: str, rest: list[str], question: bool) -> tuple[list[str], list[str]]:
        return ([aux], rest) if question else ([], [aux] + rest)

    def en_words(self, question: bool = False, front_adv: bool = False) -> list[str]:
        pre, verb = self.en_verb(question)
        objs = [x.en() for x in (self.dat, self.acc) if x is not None]
        pred = [self.pred.en] if self.pred else []
        adv = TIME_ADVERBS[self.adv][0] if self.adv else None
        words = [adv] if adv and front_adv else []
        words += pre + [self.en_subject()] + verb + objs + pred + [pp.en() for pp in self.pps]
        if adv and not front_adv:
            words.append(adv)
        return words

    # ---- German
    def de_subject(self) -> str:
        return PRONOUNS[self.subj][1] if isinstance(self.subj, str) else self.subj.de("nom")

    def de_verbs(self) -> tuple[str, str | None]:
        """(finite verb, non-finite part or None)."""
        p = self._person()
        idx = {"1sg": 0, "3sg": 1, "pl": 2}[p]
        if self.verb is None:
            if self.tense == "present":
                return AUX["sein"][idx], None
            return COPULA_PAST[0 if p != "pl" else 1], None
        inf, s1, s3, past, part, aux = self.verb.de
        if self.tense == "present":
            return (s1, s3, inf)[idx], None
        if self.tense == "past":
            return (past if p != "pl" else self.verb.de_past_pl), None
        if self.tense == "perfect":
            return AUX[aux][idx], part
        if self.tense == "future":
            return AUX["werden"][idx], inf
        return MODALS[self.modal][1][idx], inf

    def de_middle(self, with_adv: bool) -> list[str]:
        """Middle field after the finite verb and subject: time adverb, objects, nicht, predicate, PPs."""
        words = [TIME_ADVERBS[self.adv][1]] if (self.adv and with_adv) else []
        last = self.acc if self.acc is not None else self.dat
        kein = self.neg and last is not None and last.det == "a"  # nicht + ein -> kein
        if self.dat is not None:
            words.append(self.dat.de("dat", negated=kein and last is self.dat))
        if self.acc is not None:
            words.append(self.acc.de("acc", negated=kein))
        if self.pred:  # copula: Der Hund ist nicht müde.
            return words + (["nicht"] if self.neg else []) + [self.pred.de]
        if self.neg and not kein:
            words.append("nicht")
        return words + [pp.de() for pp in self.pps]

    def de_main(self, front_adv: bool = False, verb_first: bool = False) -> list[str]:
        """Verb-second main clause (or verb-first when `verb_first`: questions, after a fronted clause)."""
        fin, nonfin = self.de_verbs()
        tail = self.de_middle(with_adv=not front_adv) + ([nonfin] if nonfin else [])
        if verb_first:
            return [fin, self.de_subject()] + tail
        if front_adv:
            return [TIME_ADVERBS[self.adv][1], fin, self.de_subject()] + tail
        return [self.de_subject(), fin] + tail

    def de_sub(self) -> list[str]:
        """Verb-final subordinate clause (without the conjunction)."""
        fin, nonfin = self.de_verbs()
        return [self.de_subject()] + self.de_middle(with_adv=True) + ([nonfin] if nonfin else []) + [fin]


# ------------------------------------------------------------------------------------------- generator


class SampleGenerator:
    """Draws random clauses and sentences; `pair()` returns one (English, German) sentence pair."""

    def __init__(self, seed: int = DEFAULT_SEED):
        self.rng = random.Random(seed)
        self.nouns = _nouns()
        self.adjs = _adjectives()
        self.by_cat: dict[str, list[Noun]] = {}
        for n in self.nouns:
            self.by_cat.setdefault(n.cat, []).append(n)

    # ---- pieces
    def noun_phrase(self, cats: tuple[str, ...], allow_poss: bool = True, adj_p: float = 0.35) -> NP:
        r = self.rng
        cat = r.choice([c for c in cats if c in self.by_cat])
        noun = r.choice(self.by_cat[cat])
        plural = r.random() < 0.3
        dets = ["the"] * 5 + ["a"] * 3 + (["my", "our", "his", "her"] if allow_poss else [])
        det = r.choice(dets)
        adj = None
        if r.random() < adj_p:
            adj = r.choice([a for a in self.adjs if cat in a.cats])
        return NP(noun, plural, det, adj)

    def subject(self, cats: tuple[str, ...]) -> NP | str:
        if "person" in cats and self.rng.random() < 0.2:
            return self.rng.choice(list(PRONOUNS))
        return self.noun_phrase(cats, adj_p=0.3)

    def tense(self, verb: Verb | None) -> str:
        tenses = ["present"] * 4 + ["past"] * 2 + ["perfect"] * 2 + ["future", "modal"]
        if verb is not None and not verb.en_past_ok:
            tenses = [t for t in tenses if t != "past"]
        if verb is None:
            tenses = ["present", "present", "past"]
        return self.rng.choice(tenses)

    def place_pp(self, direction: bool) -> PlacePP:
        r = self.rng
        place = r.choice(PLACES)
        adj = r.choice([a for a in self.adjs if "place" in a.cats]) if r.random() < 0.25 else None
        return PlacePP(place, direction, adj)

    def clause(self, simple: bool = False) -> Clause:
        """A random clause; `simple` keeps it short (for use inside complex sentences)."""
        r = self.rng
        if r.random() < 0.08:  # copula: The dog is hungry.
            subj = self.subject(("person", "animal"))
            cat = "person" if isinstance(subj, str) else subj.noun.cat
            adj = r.choice([a for a in self.adjs if cat in a.cats])
            return Clause(subj, None, self.tense(None), pred=adj, neg=r.random() < 0.15)
        verb = r.choice(VERBS)
        c = Clause(self.subject(verb.subj), verb, self.tense(verb), modal=r.choice(list(MODALS)))
        if verb.obj == "acc":
            c.acc = self.noun_phrase(verb.cats)
        elif verb.obj == "dat":
            c.dat = self.noun_phrase(verb.cats)
        elif verb.obj == "dat+acc":
            c.dat = self.noun_phrase(("person",))
            c.acc = self.noun_phrase(verb.cats)
        extra = 0.25 if simple else 0.55
        if verb.motion:  # motion verbs take a direction (into the garden), never a location
            if r.random() < 0.8:
                c.pps.append(self.place_pp(direction=True))
        elif r.random() < extra:
            kind = r.random()
            if kind < 0.5:
                c.pps.append(self.place_pp(direction=False))
            elif kind < 0.75 and verb.subj == P:
                c.pps.append(WithPP("with", self.noun_phrase(("person", "animal"))))
            elif verb.obj == "acc" and verb.cats != ("person",):
                c.pps.append(WithPP(r.choice(["for", "for", "without"]), self.noun_phrase(("person", "animal"))))
        if c.tense == "modal" and c.modal == "must":
            c.neg = False  # "must not" != "muss nicht"; keep the pair unambiguous
        elif r.random() < 0.15 and not c.pps:
            c.neg = True
        if not simple and r.random() < 0.3:
            options = [k for k, v in TIME_ADVERBS.items() if c.tense in v[2]]
            c.adv = r.choice(options)
        return c

    def _align_when(self, main: Clause, sub: Clause, allow_past: bool = True) -> str:
        """Make the tenses of a when/if sentence agree; returns the German conjunction (als for one past event).
        English uses the present in a when-clause about the future (When the dog sleeps, the cat will play)."""
        choices = ["present", "present", "future"] + (["past"] if allow_past else [])
        if main.verb is None or sub.verb is None:
            choices = ["present", "past"] if allow_past else ["present"]
        tense = self.rng.choice(choices)
        if tense == "past" and not all(c.verb is None or c.verb.en_past_ok for c in (main, sub)):
            tense = "present"
        main.tense = tense
        sub.tense = "present" if tense == "future" else tense
        return "als" if tense == "past" else "wenn"

    # ---- sentences
    def pair(self) -> tuple[str, str]:
        r = self.rng
        kind = r.random()
        if kind < 0.45:
            c = self.clause()
            front = c.adv is not None and r.random() < 0.5
            return _sentence(c.en_words(front_adv=front)), _sentence(c.de_main(front_adv=front))
        if kind < 0.55:  # yes/no question
            c = self.clause()
            c.adv, c.neg = None, False
            if c.tense == "past" and c.verb is not None:
                c.tense = "perfect"  # Hat der Hund ...? is the natural German question
            return _sentence(c.en_words(question=True), "?"), _sentence(c.de_main(verb_first=True), "?")
        if kind < 0.72:  # I know that ... / She says that ...
            frame_en, frame_de = r.choice([("I know that", "Ich weiß,"), ("she says that", "sie sagt,"),
                                           ("we think that", "wir denken,"), ("he hopes that", "er hofft,"),
                                           ("they believe that", "sie glauben,"),
                                           ("the teacher says that", "der Lehrer sagt,")])
            c = self.clause(simple=True)
            return (_sentence(frame_en.split() + c.en_words()),
                    _sentence(frame_de.split() + ["dass"] + c.de_sub()))
        if kind < 0.84:  # main clause + because/while/when + subordinate clause
            m, s = self.clause(simple=True), self.clause(simple=True)
            en_conj, de_conj = r.choice([("because", "weil"), ("while", "während"), ("when", "wenn")])
            if en_conj == "when":
                de_conj = self._align_when(m, s)
            return (_sentence(m.en_words() + [en_conj] + s.en_words()),
                    _sentence(m.de_main() + [",", de_conj] + s.de_sub()))
        if kind < 0.92:  # When S, M.  -> Wenn S', V M'.
            s, m = self.clause(simple=True), self.clause(simple=True)
            en_conj = r.choice(["when", "if", "because"])
            de_conj = "weil" if en_conj == "because" else self._align_when(m, s, allow_past=en_conj == "when")
            return (_sentence([en_conj] + s.en_words() + [","] + m.en_words()),
                    _sentence([de_conj] + s.de_sub() + [","] + m.de_main(verb_first=True)))
        a, b = self.clause(simple=True), self.clause(simple=True)  # coordination
        en_conj, de_conj = r.choice([("and", "und"), ("but", "aber")])
        comma = [","] if de_conj == "aber" else []
        return (_sentence(a.en_words() + ([","] if en_conj == "but" else []) + [en_conj] + b.en_words()),
                _sentence(a.de_main() + comma + [de_conj] + b.de_main()))


def _sentence(words: list[str], end: str = ".") -> str:
    """Join words, attach commas, capitalize the first letter, add the final punctuation."""
    text = " ".join(w for w in words if w).replace(" ,", ",")
    return text[0].upper() + text[1:] + end


def generate(sizes: dict[str, int] | None = None, seed: int = DEFAULT_SEED,
             min_words: int = 4, max_words: int = 22) -> dict[str, list[tuple[str, str]]]:
    """Deterministic splits {name: [(en, de), ...]}; no English or German sentence occurs twice anywhere."""
    sizes = dict(sizes or DEFAULT_SIZES)
    total = sum(sizes.values())
    gen = SampleGenerator(seed)
    seen_en: set[str] = set()
    seen_de: set[str] = set()
    pairs: list[tuple[str, str]] = []
    attempts = 0
    while len(pairs) < total:
        attempts += 1
        if attempts > 20 * total + 1000:
            raise RuntimeError("sample generator cannot produce enough distinct sentences")
        en, de = gen.pair()
        if not min_words <= len(en.split()) <= max_words or en in seen_en or de in seen_de:
            continue
        seen_en.add(en)
        seen_de.add(de)
        pairs.append((en, de))
    out, start = {}, 0
    for name in ("test", "valid", "train"):  # held-out splits first, from the same distribution
        if name in sizes:
            out[name] = pairs[start : start + sizes[name]]
            start += sizes[name]
    for name in sizes:
        if name not in out:
            out[name] = pairs[start : start + sizes[name]]
            start += sizes[name]
    return {name: out[name] for name in sizes}


def write_sample(out_dir, sizes: dict[str, int] | None = None, seed: int = DEFAULT_SEED) -> dict[str, int]:
    """Write `{split}.en` / `{split}.de` text files into out_dir; returns {split: pairs}."""
    from pathlib import Path

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, pairs in generate(sizes, seed).items():
        for side, lang in ((0, "en"), (1, "de")):
            (out_dir / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
        counts[split] = len(pairs)
    return counts


def main(argv: list[str]) -> None:
    """python -m nmt_cli.data.sample_corpus OUT_DIR: dump the text files."""
    print(write_sample(argv[0] if argv else "sample"))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])

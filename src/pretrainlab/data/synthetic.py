"""An embedded, seeded artificial language with a learnable signal for every objective.

Documents are stories about one topic, told in order:

- **Syntax and co-occurrence (MLM).** Sentences follow a small grammar
  ``[stage] DET (ADJ) NOUN NUM VERB AGR DET (ADJ) NOUN NUM (PREP DET NOUN NUM) .`` with number
  agreement carried by particles: ``a``/``the`` + noun + ``ka`` (singular), ``some``/``the`` + noun +
  ``ki`` (plural), and the verb's particle agrees with its subject (``ta``/``ti``). Each verb prefers
  its own objects. Agreement across a few positions is also what a discriminator can check when a
  generator fills masked positions independently (ELECTRA).
- **Topical coherence (NSP).** Each document has a topic; most content words come from that
  topic's own vocabulary, so a sentence from another document usually belongs to another topic.
- **Ordered discourse (SOP).** A document's sentences form an entity chain (each sentence's
  subject is the previous sentence's object: ``... a kolam. the kolam ...``) and carry stage
  markers that only move forward (``once`` ... ``then`` ... ``later`` ... ``finally``).

Words are pronounceable syllable strings, some long, so WordPiece splits some into pieces.
Everything is drawn from ``random.Random(seed)``: the same settings give the same corpus.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Bump when the generator changes what it produces: it is part of every cache key of the corpus.
GENERATOR_VERSION = 5

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kl", "st", "tr"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
CODAS = ["", "", "", "n", "m", "r", "l", "k", "s"]
# Stage markers in discourse order: a document walks through them and never goes back.
STAGES = ["once", "first", "then", "next", "meanwhile", "later", "afterwards", "eventually", "finally"]
PREPOSITIONS = ["near", "under", "with", "beyond", "inside"]
# Number is marked by particles: after a noun (singular ka / plural ki) and after a verb, agreeing
# with the subject (ta / ti). Frequent tokens that must agree across a few positions.
NOUN_NUMBER = {False: "ka", True: "ki"}
VERB_AGREEMENT = {False: "ta", True: "ti"}


@dataclass(frozen=True)
class SyntheticLanguage:
    """Vocabulary and grammar of the artificial language (a function of ``seed`` and sizes)."""

    seed: int = 0
    num_topics: int = 8
    nouns_per_topic: int = 6
    verbs_per_topic: int = 3
    adjectives_per_topic: int = 2
    shared_nouns: int = 4
    shared_verbs: int = 2

    def build(self) -> _Lexicon:
        rng = random.Random(f"lexicon-{self.seed}")
        seen: set[str] = set(STAGES) | set(PREPOSITIONS) | {"a", "the", "some", "ka", "ki", "ta", "ti"}

        def word(min_syl: int, max_syl: int) -> str:
            while True:
                w = "".join(
                    rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS)
                    for _ in range(rng.randint(min_syl, max_syl))
                )
                if w not in seen:
                    seen.add(w)
                    return w

        def words(n: int, lo: int, hi: int) -> list[str]:
            return [word(lo, hi) for _ in range(n)]

        topics = [
            {
                "nouns": words(self.nouns_per_topic, 1, 3),
                "verbs": words(self.verbs_per_topic, 1, 2),
                "adjectives": words(self.adjectives_per_topic, 1, 2),
            }
            for _ in range(self.num_topics)
        ]
        shared = {"nouns": words(self.shared_nouns, 2, 4), "verbs": words(self.shared_verbs, 1, 2)}
        # selectional preference: each verb has a few favourite objects within its topic
        prefs = {}
        for t in topics:
            for v in t["verbs"]:
                prefs[v] = rng.sample(t["nouns"], k=min(2, len(t["nouns"])))
        return _Lexicon(topics, shared, prefs)


@dataclass
class _Lexicon:
    topics: list[dict]
    shared: dict
    prefs: dict


def _noun_phrase(rng: random.Random, noun: str, plural: bool, definite: bool, adjectives: list[str]) -> list[str]:
    det = "the" if definite else ("some" if plural else "a")
    words = [det]
    if adjectives and rng.random() < 0.5:
        words.append(rng.choice(adjectives))
    words += [noun, NOUN_NUMBER[plural]]
    return words


def _document(rng: random.Random, lex: _Lexicon, n_sentences: int) -> list[str]:
    topic = lex.topics[rng.randrange(len(lex.topics))]

    def content(kind: str) -> str:
        pool = topic[kind] if kind == "adjectives" or rng.random() < 0.97 else lex.shared[kind]
        return rng.choice(pool)

    # stage markers only move forward: spread the document over the stage list
    stage_pos = sorted(rng.sample(range(1, len(STAGES) - 1), k=min(n_sentences - 2, len(STAGES) - 2)))
    subject, subject_plural = content("nouns"), rng.random() < 0.4
    sentences = []
    for i in range(n_sentences):
        words: list[str] = []
        if i == 0:
            words.append(STAGES[0])
        elif i == n_sentences - 1:
            words.append(STAGES[-1])
        else:
            k = min(len(stage_pos) - 1, (i - 1) * len(stage_pos) // max(1, n_sentences - 2))
            words.append(STAGES[stage_pos[k]])
        words += _noun_phrase(rng, subject, subject_plural, definite=i > 0, adjectives=topic["adjectives"])
        verb = content("verbs")
        words += [verb, VERB_AGREEMENT[subject_plural]]
        obj = rng.choice(lex.prefs[verb]) if verb in lex.prefs and rng.random() < 0.8 else content("nouns")
        obj_plural = rng.random() < 0.4
        words += _noun_phrase(rng, obj, obj_plural, definite=False, adjectives=topic["adjectives"])
        if rng.random() < 0.35:
            words += [rng.choice(PREPOSITIONS)] + _noun_phrase(
                rng, content("nouns"), rng.random() < 0.4, definite=True, adjectives=[]
            )
        sentence = " ".join(words) + "."
        sentences.append(sentence[0].upper() + sentence[1:])
        subject, subject_plural = obj, obj_plural  # the entity chain
    return sentences


def generate_documents(
    num_documents: int, min_sentences: int, max_sentences: int, language: SyntheticLanguage
) -> list[str]:
    """``num_documents`` documents as plain text (sentences separated by spaces)."""
    if num_documents < 1:
        raise ValueError(f"data.num_documents must be at least 1, got {num_documents}.")
    if not 3 <= min_sentences <= max_sentences:
        raise ValueError(
            f"need 3 <= data.min_sentences <= data.max_sentences, got {min_sentences} and {max_sentences}."
        )
    lex = language.build()
    rng = random.Random(f"documents-{language.seed}")
    return [" ".join(_document(rng, lex, rng.randint(min_sentences, max_sentences))) for _ in range(num_documents)]

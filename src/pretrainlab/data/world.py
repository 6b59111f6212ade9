"""Sentences of the synthetic language with a meaning: clauses (who does what to whom, where), drawn
topic by topic, with part of every topic's words held out (``split_words``). What the synthetic
evaluation sets are made of: the GLUE-shaped suite (``glue.synthetic``), named entities and minimal
pairs (``evaluation``), and question answering."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from pretrainlab.data.synthetic import NOUN_NUMBER, PREPOSITIONS, STAGES, VERB_AGREEMENT, SyntheticLanguage


@dataclass(frozen=True)
class Clause:
    stage: str | None
    subj: str
    subj_pl: bool
    subj_adj: str | None
    verb: str
    obj: str
    obj_pl: bool
    obj_adj: str | None
    prep: tuple[str, str, bool] | None  # (preposition, noun, plural)
    subj_def: bool = True

    def words(self, verb_agreement: bool = True, noun_number: bool = True) -> list[str]:
        def np_(noun: str, pl: bool, adj: str | None, definite: bool) -> list[str]:
            det = "the" if definite else ("some" if pl else "a")
            return [det] + ([adj] if adj else []) + [noun, NOUN_NUMBER[pl if noun_number else not pl]]

        w = [self.stage] if self.stage else []
        w += np_(self.subj, self.subj_pl, self.subj_adj, self.subj_def)
        w += [self.verb, VERB_AGREEMENT[self.subj_pl if verb_agreement else not self.subj_pl]]
        w += np_(self.obj, self.obj_pl, self.obj_adj, False)
        if self.prep:
            w += [self.prep[0]] + np_(self.prep[1], self.prep[2], None, True)
        return w

    def render(self, **kw) -> str:
        return render(self.words(**kw))


def render(words: list[str]) -> str:
    s = " ".join(words) + "."
    return s[0].upper() + s[1:]


KINDS = ("nouns", "verbs", "adjectives")


def split_words(language: SyntheticLanguage, share: float, seed: int) -> list[dict[str, list[str]]]:
    """Every topic's held-out words: ``share`` of each kind, at least one, and never so many that
    fewer than two nouns or verbs (one adjective) stay for training, where labels need "another
    verb" or "another noun" of the same topic. What the training splits of ``unseen_words=share``
    never use."""
    rng = random.Random(f"unseen-{seed}-{share}")
    held = []
    for topic in language.build().topics:
        held.append(
            {
                kind: rng.sample(
                    topic[kind],
                    k=max(
                        1, min(len(topic[kind]) - (1 if kind == "adjectives" else 2), round(share * len(topic[kind])))
                    ),
                )
                for kind in KINDS
            }
        )
    return held


class World:
    """Draws clauses from the language; ``words`` = "seen" or "unseen" keeps each topic to the words of
    that side of ``held`` (``split_words``). Where a choice that must differ from a given word has
    nothing else left in its topic, it takes a word of the same side from another topic."""

    def __init__(
        self, language: SyntheticLanguage, rng: random.Random, held: list[dict] | None = None, words: str = "all"
    ):
        self.lex = language.build()
        self.rng = rng
        if held is not None and words != "all":
            unseen = words == "unseen"
            self.lex.topics = [
                {k: [w for w in t[k] if (w in h[k]) == unseen] for k in KINDS} for t, h in zip(self.lex.topics, held)
            ]
            nouns = {n for t in self.lex.topics for n in t["nouns"]}
            self.lex.prefs = {v: [n for n in objs if n in nouns] for v, objs in self.lex.prefs.items()}

    def _pick(self, t: int, kind: str, avoid: str | None) -> str:
        pool = [w for w in self.lex.topics[t][kind] if w != avoid]
        return self.rng.choice(pool or [w for topic in self.lex.topics for w in topic[kind] if w != avoid])

    def topic(self, topics: list[int] | None = None) -> int:
        return self.rng.choice(topics) if topics else self.rng.randrange(len(self.lex.topics))

    def noun(self, t: int, avoid: str | None = None) -> str:
        return self._pick(t, "nouns", avoid)

    def verb(self, t: int, avoid: str | None = None) -> str:
        return self._pick(t, "verbs", avoid)

    def adj(self, t: int) -> str | None:
        return self.rng.choice(self.lex.topics[t]["adjectives"]) if self.rng.random() < 0.4 else None

    def clause(self, t: int, prep: bool | None = None, stage: bool = True) -> Clause:
        r = self.rng
        verb = self.verb(t)
        prefs = self.lex.prefs.get(verb)
        obj = r.choice(prefs) if prefs and r.random() < 0.8 else self.noun(t)
        subj = self.noun(t, avoid=obj)
        has_prep = r.random() < 0.4 if prep is None else prep
        return Clause(
            stage=r.choice(STAGES) if stage and r.random() < 0.5 else None,
            subj=subj,
            subj_pl=r.random() < 0.4,
            subj_adj=self.adj(t),
            verb=verb,
            obj=obj,
            obj_pl=r.random() < 0.4,
            obj_adj=self.adj(t),
            prep=(r.choice(PREPOSITIONS), self.noun(t), r.random() < 0.4) if has_prep else None,
        )

    def restyle(self, c: Clause, t: int) -> Clause:
        """The same event told differently: stage, adjectives and place may change."""
        r = self.rng
        return replace(
            c,
            stage=r.choice(STAGES) if r.random() < 0.5 else None,
            subj_adj=self.adj(t),
            obj_adj=self.adj(t),
            prep=c.prep if r.random() < 0.5 else None,
        )

    def other_verb_or(self, c: Clause, t: int, slot: str, base: Clause) -> Clause:
        """``c`` with, at even odds, another verb than ``base``'s or another noun in ``slot``."""
        if self.rng.random() < 0.5:
            return replace(c, verb=self.verb(t, avoid=base.verb))
        return replace(c, **{slot: self.noun(t, avoid=getattr(base, slot))})  # type: ignore[arg-type]  # a noun slot

    def core(self, c: Clause) -> Clause:
        return replace(c, stage=None, subj_adj=None, obj_adj=None, prep=None)


__all__ = ["KINDS", "Clause", "World", "render", "split_words"]

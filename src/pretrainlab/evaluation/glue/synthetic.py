"""A GLUE-shaped suite in the synthetic language, written in the real GLUE file layout.

Nine tasks with the names, file formats and metrics of GLUE, built from the vocabulary and
grammar of the pretraining corpus (``pretrainlab.data.synthetic``), so the whole fine-tuning
pipeline (local reader included) runs offline, and an encoder pretrained on the synthetic corpus
has something to transfer:

    cola  acceptability: agreement violations, missing verbs, swapped words (Matthews corr.)
    sst2  "sentiment" = the sentence's topic is one of the positive topics
    mrpc  paraphrase: the same event told differently vs a different verb or object
    qqp   duplicate questions about who does what to whom
    stsb  similarity 0-5: the share of the event's four content slots the two sentences agree on
    mnli  premise/hypothesis: entailed core / added information (neutral) / another verb
          (contradiction); mismatched dev = topics never seen in training
    qnli  does the sentence answer "what does the X <verb>?"
    rte   mnli with two classes, small
    wnli  which earlier noun the second sentence's subject continues (entity chain), tiny

Labels follow fixed rules, so every task is learnable; some need word order and agreement, which
a pretrained encoder has seen and a scratch one has not.

``unseen_words`` (a share, 0 by default) holds part of every topic's nouns, verbs and adjectives out
of the training splits: the dev sets are built from those words alone, as real dev sets hold words
their training sets lack. A fine-tuned encoder then has to know them from pretraining (their
topic, their word class, how they combine), which is what a scratch encoder cannot know.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from pretrainlab.data.synthetic import NOUN_NUMBER, PREPOSITIONS, VERB_AGREEMENT, SyntheticLanguage
from pretrainlab.data.world import Clause, World, render, split_words
from pretrainlab.evaluation.data import SyntheticSet
from pretrainlab.evaluation.glue.tasks import TASKS

SUITE_VERSION = 1

# (train, dev) sizes at scale 1
SIZES = {
    "cola": (2000, 400),
    "sst2": (2000, 400),
    "mrpc": (1200, 400),
    "qqp": (2000, 400),
    "stsb": (1200, 400),
    "mnli": (3000, 400),
    "qnli": (2000, 400),
    "rte": (600, 200),
    "wnli": (300, 70),
}


def _cola(w: World, i: int, t: int) -> tuple:
    c = w.clause(t)
    if w.rng.random() < 0.7:
        return ("syn", "1", "", c.render())
    kind = w.rng.randrange(4)
    if kind == 0:
        words = c.words(verb_agreement=False)
    elif kind == 1:
        words = c.words(noun_number=False)
    elif kind == 2:
        words = [x for x in c.words() if x != c.verb]
    else:
        words = c.words()
        j = w.rng.randrange(len(words) - 1)
        words[j], words[j + 1] = words[j + 1], words[j]
        if words == c.words():
            words = [x for x in c.words() if x != c.verb]
    return ("syn", "0", "*", render(words))


def _sst2(w: World, i: int, t: int) -> tuple:
    return (w.clause(t).render().lower().rstrip("."), str(int(t % 2 == 0)))


def _mrpc(w: World, i: int, t: int) -> tuple:
    a = w.clause(t)
    if w.rng.random() < 0.68:
        b, label = w.restyle(a, t), 1
    else:
        b = w.other_verb_or(w.restyle(a, t), t, "obj", base=a)
        label = 0
    return (str(label), str(100000 + 2 * i), str(100001 + 2 * i), a.render(), b.render())


def _question(c: Clause, style: int) -> str:
    subj = " ".join(x for x in ["the", c.subj_adj, c.subj, NOUN_NUMBER[c.subj_pl]] if x)
    agr = VERB_AGREEMENT[c.subj_pl]
    if style == 0:
        return f"What does {subj} {c.verb} {agr}?"
    return f"Which thing does {subj} {c.verb} {agr}?"


def _qqp(w: World, i: int, t: int) -> tuple:
    a = w.clause(t)
    if w.rng.random() < 0.37:
        b, label = replace(a, subj_adj=w.adj(t)), 1
    else:
        b = w.other_verb_or(a, t, "subj", base=a)
        label = 0
    return (
        str(i),
        str(2 * i),
        str(2 * i + 1),
        _question(a, w.rng.randrange(2)),
        _question(b, w.rng.randrange(2)),
        str(label),
    )


def _stsb(w: World, i: int, t: int) -> tuple:
    a = w.clause(t, prep=True)
    slots = w.rng.sample(["subj", "verb", "obj", "prep"], k=w.rng.randint(0, 4))
    b = w.restyle(a, t)
    b = replace(b, prep=a.prep)
    for s in slots:
        if s == "subj":
            b = replace(b, subj=w.noun(t, avoid=a.subj))
        elif s == "verb":
            b = replace(b, verb=w.verb(t, avoid=a.verb))
        elif s == "obj":
            b = replace(b, obj=w.noun(t, avoid=a.obj))
        else:
            assert a.prep is not None  # "prep" is among the slots only when the clause has one
            b = replace(b, prep=(a.prep[0], w.noun(t, avoid=a.prep[1]), a.prep[2]))
    score = 5.0 * (4 - len(slots)) / 4
    return (str(i), "synthetic", "syn", "2026", f"{i:04d}", "none", "none", a.render(), b.render(), f"{score:.3f}")


NLI = ("entailment", "neutral", "contradiction")


def _nli_pair(w: World, t: int, label: str) -> tuple[str, str]:
    a = w.clause(t)
    core = w.core(a)
    if label == "entailment":
        h = core
    elif label == "neutral":  # adds a place the premise does not mention
        avoid = a.prep[1] if a.prep else None
        h = replace(core, prep=(w.rng.choice(PREPOSITIONS), w.noun(t, avoid=avoid), w.rng.random() < 0.4))
    else:  # another verb for the same subject and object
        h = replace(core, verb=w.verb(t, avoid=a.verb))
    return a.render(), h.render()


def _mnli(w: World, i: int, t: int, dev: bool = False) -> tuple:
    label = NLI[w.rng.randrange(3)]
    p, h = _nli_pair(w, t, label)
    extra = [label] * (5 if dev else 1)
    return (str(i), str(i), f"{i}n", f"topic{t}", "-", "-", "-", "-", p, h, *extra, label)


def _rows(build, w: World, n: int, topics: list[int] | None, **kwargs) -> list[tuple]:
    """``n`` rows of a task: one call of its builder per row, each on a topic drawn from ``topics``."""
    return [build(w, i, w.topic(topics), **kwargs) for i in range(n)]


def _qnli(w: World, i: int, t: int) -> tuple:
    c = w.clause(t)
    q = replace(c, subj_adj=None)
    if w.rng.random() < 0.5:
        label = "entailment"
    else:
        label = "not_entailment"
        q = w.other_verb_or(q, t, "subj", base=c)
    return (str(i), _question(q, 0), c.render(), label)


def _rte(w: World, i: int, t: int) -> tuple:
    label = "entailment" if w.rng.random() < 0.5 else w.rng.choice(["neutral", "contradiction"])
    p, h = _nli_pair(w, t, label)
    return (str(i), p, h, "entailment" if label == "entailment" else "not_entailment")


def _wnli(w: World, i: int, t: int) -> tuple:
    first = w.clause(t, prep=False, stage=False)
    second = replace(w.clause(t, prep=False, stage=False), subj=first.obj, subj_pl=first.obj_pl, subj_adj=None)
    label = int(w.rng.random() < 0.5)
    claim = second if label else replace(second, subj=first.subj, subj_pl=first.subj_pl)
    return (str(i), f"{first.render()} {second.render()}", claim.render(), str(label))


HEADERS = {
    "cola": None,
    "sst2": ["sentence", "label"],
    "mrpc": ["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
    "qqp": ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
    "stsb": [
        "index",
        "genre",
        "filename",
        "year",
        "old_index",
        "source1",
        "source2",
        "sentence1",
        "sentence2",
        "score",
    ],
    "qnli": ["index", "question", "sentence", "label"],
    "rte": ["index", "sentence1", "sentence2", "label"],
    "wnli": ["index", "sentence1", "sentence2", "label"],
}
_MNLI_HEAD = [
    "index",
    "promptID",
    "pairID",
    "genre",
    "sentence1_binary_parse",
    "sentence2_binary_parse",
    "sentence1_parse",
    "sentence2_parse",
    "sentence1",
    "sentence2",
]
BUILDERS = {
    "cola": _cola,
    "sst2": _sst2,
    "mrpc": _mrpc,
    "qqp": _qqp,
    "stsb": _stsb,
    "qnli": _qnli,
    "rte": _rte,
    "wnli": _wnli,
}


def _write(path: Path, header: list[str] | None, rows: list[tuple], final_newline: bool = True) -> None:
    lines = (["\t".join(header)] if header else []) + ["\t".join(r) for r in rows]
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""), encoding="utf-8")


@dataclass(frozen=True)
class SyntheticGlue(SyntheticSet):
    """The suite's settings (``glue.synthetic``); ``write`` generates every task once per settings into
    ``<cache>/glue-synthetic/<key>/``, in the ``download_glue_data.py`` layout, with ``suite.json``."""

    folder: ClassVar[str] = "glue-synthetic"
    version: ClassVar[int] = SUITE_VERSION

    scale: float = 1.0  # multiplies every task's train and dev size
    unseen_words: float = 0.0  # share of each topic's words kept out of the training splits (dev uses only them)

    def __post_init__(self) -> None:
        if not 0.0 <= self.unseen_words < 1.0:
            raise ValueError(
                f"glue.synthetic.unseen_words={self.unseen_words}: expected a share of each topic's "
                f"words in [0, 1), e.g. 0.5."
            )

    def generate(self, into: Path) -> None:
        self._tasks(into)
        settings = ("seed", "scale", "language_seed", "num_topics", "unseen_words")
        record = {**{k: getattr(self, k) for k in settings}, "version": self.version}
        (into / "suite.json").write_text(json.dumps(record, indent=2))

    def _tasks(self, out: Path) -> None:
        language = SyntheticLanguage(seed=self.language_seed, num_topics=self.num_topics)
        held = split_words(language, self.unseen_words, self.seed) if self.unseen_words > 0 else None
        seen = list(range(max(1, self.num_topics - 2)))  # MNLI mismatched: the last two topics
        unseen = [t for t in range(self.num_topics) if t not in seen] or seen
        for task, (n_train, n_dev) in SIZES.items():
            n_train, n_dev = max(8, round(n_train * self.scale)), max(8, round(n_dev * self.scale))
            d = out / TASKS[task].directory
            d.mkdir()
            for split, n in (("train", n_train), ("dev", n_dev)):
                words = "all" if held is None else ("seen" if split == "train" else "unseen")
                w = World(language, random.Random(f"glue-{self.seed}-{task}-{split}"), held, words)
                if task == "mnli":
                    dev = split == "dev"
                    head = _MNLI_HEAD + (["label1", "label2", "label3", "label4", "label5"] if dev else ["label1"])
                    head += ["gold_label"]
                    if dev:
                        _write(d / "dev_matched.tsv", head, _rows(_mnli, w, n, seen, dev=True))
                        w2 = World(language, random.Random(f"glue-{self.seed}-{task}-mismatched"), held, words)
                        _write(d / "dev_mismatched.tsv", head, _rows(_mnli, w2, n, unseen, dev=True))
                    else:
                        _write(d / "train.tsv", head, _rows(_mnli, w, n, seen))
                else:
                    # CoLA's dev file, like the real one, has no final newline
                    _write(
                        d / f"{split}.tsv",
                        HEADERS[task],
                        _rows(BUILDERS[task], w, n, None),
                        final_newline=not (task == "cola" and split == "dev"),
                    )

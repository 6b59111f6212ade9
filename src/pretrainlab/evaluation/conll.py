"""CoNLL-2003 named entities, the data every NER evaluation reads (``ner``, ``probe_ner``): its files,
entity chunks and F1 as ``conlleval`` counts them, and a synthetic NER set in the synthetic language.

Files are the shared task's: one token per line, ``word POS chunk tag`` (the first field is the word,
the last the tag), a blank line after each sentence, ``-DOCSTART-`` lines between documents (matched
on the first field: the release writes them differently in train and test). Tags are IOB1 as
released (an entity starts with ``I-X``; ``B-X`` only where it follows another ``X``) or IOB2 as the
hub's ``conll2003`` gives them (every entity starts with ``B-X``). Both describe the same chunks,
which is what is scored: :func:`chunks` follows conlleval's start-of-chunk and end-of-chunk rules, so
either scheme (and a model's IOB2 predictions, ill-formed ones included) is read as conlleval reads
it. The model is trained on IOB2 labels (:func:`to_iob2`).

F1 is micro-averaged over entity chunks: a predicted chunk is correct when the gold has a chunk of
the same type with the same start and end.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pretrainlab.data.hashing import file_digest
from pretrainlab.data.hub import go_offline, hub_offline, hub_reachable
from pretrainlab.data.synthetic import SyntheticLanguage
from pretrainlab.data.world import World, split_words
from pretrainlab.evaluation.data import DataBlock, SyntheticSet

log = logging.getLogger("pretrainlab")

HUB_DATASET = "eriktks/conll2003"
# the split files of a CoNLL-2003 directory, as this project's README names them and as the release does
SPLIT_FILES = {"train": ("train.txt", "eng.train"), "validation": ("dev.txt", "eng.testa")}

Sentence = tuple[list[str], list[str]]  # words, tags


class ConllDataError(ValueError):
    """A NER file that does not have the CoNLL layout."""


# the column of the entity tags, by the number of fields a file's lines have: CoNLL-2003's "word POS chunk
# NER" and the two-column "word NER"; any other layout says where its tags are (ner.tag_column)
TAG_COLUMN = {4: 4, 2: 2}


def read_conll(path: str | Path, complete: bool = False, tag_column: int | None = None) -> list[Sentence]:
    """The sentences of a CoNLL file, the entity tag of each word read from ``tag_column`` (counted from
    1; by default the 4th of CoNLL-2003's four fields, or the 2nd of two). Every word line must have
    the file's number of fields: a line with another number is skipped with a warning in a training
    file and fails the read when ``complete`` (evaluation files are read completely or not at all). A
    file of another layout (three fields: "word POS chunk" lacks its entity tags, and its chunk tags
    look like entity tags) is refused unless ``tag_column`` says where the tags are."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}.")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ConllDataError(f"{path} is not UTF-8 ({e}); re-encode it (iconv -t utf-8).") from None
    rows = [(n, line.split()) for n, line in enumerate(lines, start=1)]
    widths = collections.Counter(len(f) for _, f in rows if f and f[0] != "-DOCSTART-")
    if not widths:
        raise ConllDataError(f"{path} holds no sentences.")
    width = widths.most_common(1)[0][0]
    column = tag_column or TAG_COLUMN.get(width)
    if column is None:
        raise ConllDataError(
            f"{path}: its lines have {width} fields; CoNLL-2003's have 4 (word POS chunk NER) or 2 (word NER), "
            f"the entity tag last. "
            + (
                "Lines of 'word POS chunk' lack the entity tags, and their chunk tags (B-NP, I-VP) would be read as "
                "entities. "
                if width == 3
                else ""
            )
            + "If the file holds entity tags, say which column (counted from 1): ner.tag_column=<n>."
        )
    if not 2 <= column <= width:
        raise ConllDataError(
            f"{path}: ner.tag_column={column}, but its lines have {width} fields (the first is the word); name a "
            f"column from 2 to {width}."
        )
    sentences: list[Sentence] = []
    words: list[str] = []
    tags: list[str] = []
    skipped = []
    for n, fields in rows:
        if not fields:
            if words:
                sentences.append((words, tags))
            words, tags = [], []
            continue
        if fields[0] == "-DOCSTART-":
            continue
        if len(fields) != width:
            if complete:
                raise ConllDataError(
                    f"{path}, line {n}: {len(fields)} field(s) where the file's other lines have {width} (the entity "
                    f"tag in field {column}). An evaluation file is read completely or not at all; repair the file."
                )
            skipped.append(n)
            continue
        tag = fields[column - 1]
        if tag != "O" and (len(tag) < 3 or tag[1] != "-" or tag[0] not in "BIES"):
            raise ConllDataError(
                f"{path}, line {n}: tag {tag!r} (field {column} of {width}) is not O, B-<type> or I-<type> (IOB1 or IOB2)."
            )
        words.append(fields[0])
        tags.append(tag)
    if words:
        sentences.append((words, tags))
    if skipped:
        log.warning(
            "%s: skipped %d line(s) without the file's %d fields (lines %s)",
            path,
            len(skipped),
            width,
            ", ".join(map(str, skipped[:5])),
        )
    if not sentences:
        raise ConllDataError(f"{path} holds no sentences.")
    return sentences


def _split(tag: str) -> tuple[str, str]:
    return ("O", "") if tag == "O" else (tag[0], tag[2:])


def _starts(prev: str, prev_type: str, tag: str, type_: str) -> bool:
    """conlleval's startOfChunk (B/I/E/S/O)."""
    if tag in ("B", "S"):
        return True
    if tag in ("I", "E") and prev in ("O", "E", "S"):
        return True
    return tag != "O" and prev_type != type_


def _ends(prev: str, prev_type: str, tag: str, type_: str) -> bool:
    """conlleval's endOfChunk (B/I/E/S/O)."""
    if prev in ("E", "S"):
        return True
    if prev in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev != "O" and prev_type != type_


def chunks(tags: list[str]) -> set[tuple[str, int, int]]:
    """The entity chunks of one sentence, (type, first token, last token), as conlleval reads them."""
    out = set()
    prev, prev_type, start = "O", "", None
    for i, t in enumerate([*tags, "O"]):
        tag, type_ = _split(t)
        if start is not None and _ends(prev, prev_type, tag, type_):
            out.add((prev_type, start, i - 1))
            start = None
        if _starts(prev, prev_type, tag, type_):
            start = i
        prev, prev_type = tag, type_
    return out


def scores(gold: list[list[str]], pred: list[list[str]]) -> dict[str, float]:
    """Entity-level micro precision, recall and F1 over sentences (``conlleval``'s numbers, as
    fractions), and the counts they come from."""
    if len(gold) != len(pred) or any(len(g) != len(p) for g, p in zip(gold, pred)):
        raise ValueError("gold and predicted tags must have one tag per word")
    correct = guessed = true = 0
    for g, p in zip(gold, pred):
        gc, pc = chunks(g), chunks(p)
        correct += len(gc & pc)
        guessed += len(pc)
        true += len(gc)
    precision = correct / guessed if guessed else 0.0
    recall = correct / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "correct": correct, "guessed": guessed, "gold": true}


def to_iob2(tags: list[str]) -> list[str]:
    """The same chunks written IOB2 (every chunk starts with B-)."""
    out = ["O"] * len(tags)
    for type_, start, end in chunks(tags):
        out[start] = f"B-{type_}"
        for i in range(start + 1, end + 1):
            out[i] = f"I-{type_}"
    return out


# --- sources ----------------------------------------------------------------------------------------------
def split_files(root: Path) -> dict[str, Path]:
    """The train and dev files of a CoNLL-2003 directory (``train.txt`` / ``dev.txt``, or the
    release's ``eng.train`` / ``eng.testa``)."""
    found = {}
    for split, names in SPLIT_FILES.items():
        path = next((root / n for n in names if (root / n).is_file()), None)
        if path is None:
            raise FileNotFoundError(
                f"ner.data_dir={root}: no {' or '.join(names)}. It must be a CoNLL-2003 directory "
                f"(train.txt and dev.txt, or eng.train and eng.testa)."
            )
        found[split] = path
    return found


def read_local(data_dir: str | Path, tag_column: int | None = None) -> dict[str, list[Sentence]]:
    files = split_files(Path(os.path.expanduser(str(data_dir))))
    return {split: read_conll(path, split != "train", tag_column) for split, path in files.items()}


def read_hub(dataset: str = HUB_DATASET) -> dict[str, list[Sentence]]:
    """CoNLL-2003 from the Hugging Face hub (IOB2 tags, no -DOCSTART- lines)."""
    if not hub_offline() and not hub_reachable():
        log.info("the Hugging Face hub is not reachable: looking for %s in the datasets cache only", dataset)
        go_offline()
    from datasets import load_dataset

    try:
        ds = load_dataset(dataset)
    except Exception as e:  # noqa: BLE001 - offline, or no such dataset
        raise ConnectionError(
            f"could not load CoNLL-2003 from the Hugging Face hub ({dataset}): {e}. Offline, point "
            f"ner.data_dir at a CoNLL-2003 directory, or use ner.source=synthetic."
        ) from e
    names = ds["train"].features["ner_tags"].feature.names
    return {
        split: [(list(r["tokens"]), [names[t] for t in r["ner_tags"]]) for r in ds[name] if r["tokens"]]
        for split, name in (("train", "train"), ("validation", "validation"))
    }


def data_root(data: DataBlock) -> Path | None:
    """The CoNLL-2003 directory the sentences are read from (the synthetic task is generated into the
    cache first); None for the hub."""
    return data.root(SyntheticNer, "CoNLL-2003 directory")


def load(data: DataBlock, max_train: int | None = None) -> tuple[dict[str, list[Sentence]], dict[str, str] | None]:
    """Train and dev sentences (the first ``max_train_examples`` / ``max_eval_examples`` when set, or
    ``max_train`` when it keeps fewer; the tags from ``ner.tag_column``: :func:`read_conll`) and the sha256
    of the files they were read from (None from the hub)."""
    max_train = min((x for x in (max_train, data.max_train_examples) if x), default=None)
    max_eval, tag_column = data.max_eval_examples, data.options.get("tag_column")
    root = data_root(data)
    if root is None:
        splits, digests = read_hub(), None
    else:
        files = split_files(root)
        splits = {split: read_conll(path, split != "train", tag_column) for split, path in files.items()}
        digests = {path.name: file_digest(path) for path in files.values()}
    splits["train"] = splits["train"][:max_train] if max_train else splits["train"]
    splits["validation"] = splits["validation"][:max_eval] if max_eval else splits["validation"]
    return splits, digests


# --- the synthetic task -----------------------------------------------------------------------------------
TYPES = ("PER", "LOC", "ORG", "MISC")
# (train, dev) sentences at scale 1
SIZES = (2000, 400)


@dataclass(frozen=True)
class SyntheticNer(SyntheticSet):
    """Entities in the synthetic language: every noun, with its adjective when it has one, is an
    entity whose type is fixed by its topic (topic mod 4: PER, LOC, ORG, MISC); determiners, number
    particles, verbs, stage words and prepositions are outside entities. A tagger must know which
    topic a noun belongs to, which pretraining on the synthetic corpus teaches; with
    ``unseen_words``, the dev sentences use only nouns no training sentence uses. Written in the
    release's layout (IOB1 tags, -DOCSTART- lines)."""

    folder: ClassVar[str] = "ner-synthetic"
    version: ClassVar[int] = 1

    scale: float = 1.0
    unseen_words: float = 0.0

    def sentences(self, split: str) -> list[Sentence]:

        language = SyntheticLanguage(seed=self.language_seed, num_topics=self.num_topics)
        held = split_words(language, self.unseen_words, self.seed) if self.unseen_words else None
        rng = random.Random(f"ner-{self.seed}-{split}")
        w = World(language, rng, held, words=("unseen" if split == "validation" else "seen") if held else "all")
        n = max(1, round(SIZES[split == "validation"] * self.scale))
        out = []
        for _ in range(n):
            t = w.topic()
            c = w.clause(t)
            words, tags = [], []
            entity = f"I-{TYPES[t % len(TYPES)]}"
            for word in c.words():
                words.append(word)
                tags.append(
                    entity if word in (c.subj, c.obj, c.subj_adj, c.obj_adj) or (c.prep and word == c.prep[1]) else "O"
                )
            words[0] = words[0][:1].upper() + words[0][1:]
            out.append((words + ["."], tags + ["O"]))
        return out

    def generate(self, into: Path) -> None:
        """``train.txt`` and ``dev.txt`` in CoNLL-2003's layout, and ``settings.json``."""
        for split, name in (("train", "train.txt"), ("validation", "dev.txt")):
            lines = ["-DOCSTART- -X- O O", ""]
            for words, tags in self.sentences(split):
                lines += [f"{word} X O {tag}" for word, tag in zip(words, tags)] + [""]
            (into / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        settings = ("seed", "scale", "language_seed", "num_topics", "unseen_words")
        (into / "settings.json").write_text(json.dumps({k: getattr(self, k) for k in settings}))


__all__ = [
    "ConllDataError",
    "Sentence",
    "SyntheticNer",
    "TYPES",
    "chunks",
    "data_root",
    "load",
    "read_conll",
    "read_hub",
    "read_local",
    "scores",
    "split_files",
    "to_iob2",
]

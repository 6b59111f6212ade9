"""Extractive question answering (SQuAD v1.1, Rajpurkar et al. 2016) as an evaluation: a span head (a
start and an end logit per token) fine-tuned with the encoder on question + context, scored by exact
match and F1 after SQuAD's normalisation (``conf/task/squad.yaml``).

- **Data**: the official JSON format (``{"data": [{"title", "paragraphs": [{"context", "qas": [{"id",
  "question", "answers": [{"text", "answer_start"}]}]}]}]}``), from a local folder (``squad.data_dir``:
  a ``train*.json`` and a ``dev*.json``), the Hugging Face hub (``rajpurkar/squad``), or a set generated
  in the synthetic language (``squad.source=synthetic``: questions about who does what to whom in a
  short text, written in the same format and read back the same way). Every answer must be where its
  ``answer_start`` says, or the file is refused.
- **Windows**: ``[CLS] question [SEP] context [SEP]``, the question cut to ``max_query_length`` tokens
  and a context longer than what is left split into windows that share ``doc_stride`` tokens.
  Answers are mapped from characters to tokens through the tokenizer's offsets; a training window
  that does not hold the whole answer points at ``[CLS]`` (as ``transformers``' recipe does).
- **Predictions**: over every window of a question, the ``n_best`` highest start and end logits are
  paired (start <= end, at most ``max_answer_length`` tokens, both in the context), the best sum wins,
  and its characters are the answer: ``predictions.json`` in the fine-tuning run's directory, in the
  official format (question id -> answer text).
- **Metrics** (:func:`exact_match`, :func:`f1`, :func:`scores`): SQuAD v1.1's evaluation script's
  definitions: lower case, ASCII punctuation and the articles a/an/the removed, whitespace collapsed;
  the maximum over a question's answers, the mean over questions (a question without a prediction
  scores 0). Its trivial baseline, an answer that is never right, scores 0.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import random
import re
import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from tokenizers import Tokenizer
from torch import nn

from pretrainlab import atomic
from pretrainlab.config import ConfigError
from pretrainlab.data.hashing import file_digest
from pretrainlab.data.hub import go_offline, hub_offline, hub_reachable
from pretrainlab.data.synthetic import NOUN_NUMBER, VERB_AGREEMENT, SyntheticLanguage
from pretrainlab.data.world import World
from pretrainlab.evaluation.base import FineTuned, RunContext
from pretrainlab.evaluation.data import DataBlock, SyntheticSet
from pretrainlab.evaluation.finetuning import Fitting, Job, Trainable
from pretrainlab.model.encoder import Encoder
from pretrainlab.optim import OptimConfig
from pretrainlab.runtime.settings import check, integer, optional_integer
from pretrainlab.runtime.signals import worker_init
from pretrainlab.tokens import SpecialTokens

log = logging.getLogger("pretrainlab")

HUB_DATASET = "rajpurkar/squad"
PREDICTIONS = "predictions.json"


class SquadDataError(ValueError):
    """A question-answering file that is not in SQuAD's format, or an answer not where it says."""


@dataclass(frozen=True)
class Example:
    id: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]  # (text, answer_start) of each gold answer


# --- the metric: SQuAD v1.1's ----------------------------------------------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize(text: str) -> str:
    """Lower case, ASCII punctuation removed, the articles a/an/the removed, whitespace collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize(prediction) == normalize(gold))


def f1(prediction: str, gold: str) -> float:
    """Token F1 between the normalised prediction and answer (0 when they share no token)."""
    p, g = normalize(prediction).split(), normalize(gold).split()
    same = sum((collections.Counter(p) & collections.Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def scores(predictions: dict[str, str], examples: list[Example]) -> dict[str, float]:
    """``exact_match`` and ``f1`` (fractions): each question's best over its answers, averaged over
    ``examples`` (a question without a prediction scores 0)."""
    em = f = 0.0
    for e in examples:
        if e.id not in predictions:
            continue
        golds = [text for text, _ in e.answers]
        em += max(exact_match(predictions[e.id], g) for g in golds)
        f += max(f1(predictions[e.id], g) for g in golds)
    n = max(1, len(examples))
    return {"exact_match": em / n, "f1": f / n}


# --- the data -----------------------------------------------------------------------------------------------
def _position(value: object, question: object, where: str) -> int:
    """An ``answer_start``: a whole number of characters (``true`` is not one, though Python's int() reads it as 1)."""
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())):
        raise SquadDataError(
            f"{where}: question {question}: answer_start {value!r} is not a character position (a whole number >= 0)."
        )
    return int(value)


def parse(data: dict, where: str) -> list[Example]:
    """The questions of a SQuAD-format document, each answer checked against its context."""
    try:
        articles = data["data"]
        out = []
        for article in articles:
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                for qa in paragraph["qas"]:
                    answers = tuple(
                        (str(a["text"]), _position(a["answer_start"], qa.get("id"), where)) for a in qa["answers"]
                    )
                    out.append(Example(str(qa["id"]), str(qa["question"]), context, answers))
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, SquadDataError):
            raise
        raise SquadDataError(f"{where} is not in SQuAD's format ({type(e).__name__}: {e}).") from None
    if not out:
        raise SquadDataError(f"{where} holds no questions.")
    return checked(out, where)


def checked(examples: list[Example], where: str) -> list[Example]:
    """``examples``, each a real question with real answers, or the source refused naming the question: a
    question id twice (predictions.json keeps one answer per id), no answer (SQuAD v1.1 has one or
    more), an empty question, an empty answer or context (every empty prediction would match it), or an
    answer that is not at its ``answer_start`` in the context (a negative one included, which Python's
    slicing would wrap)."""
    seen: set[str] = set()
    for e in examples:
        if e.id in seen:
            raise SquadDataError(
                f"{where}: question id {e.id!r} appears twice; predictions.json answers each id once, so one of "
                f"them would go unscored. Give every question its own id."
            )
        seen.add(e.id)
        if not e.answers:
            raise SquadDataError(f"{where}: question {e.id} has no answer (SQuAD v1.1 has one or more).")
        if not e.context.strip():
            raise SquadDataError(f"{where}: question {e.id} has an empty context: there is nothing to extract from.")
        if not e.question.strip():
            raise SquadDataError(
                f"{where}: question {e.id} is empty: the model would be scored on finding an answer to nothing. "
                f"Give its question, or remove it."
            )
        for text, start in e.answers:
            if not text.strip():
                raise SquadDataError(
                    f"{where}: question {e.id} has an empty answer, which an empty prediction would match. "
                    f"Remove the answer or the question."
                )
            if start < 0 or e.context[start : start + len(text)] != text:
                raise SquadDataError(
                    f"{where}: question {e.id}: the answer {text!r} is not at character {start} of its context "
                    f"(there: {e.context[max(0, start) : max(0, start) + len(text)]!r}). Repair the file."
                )
    return examples


def read_file(path: Path) -> list[Example]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise SquadDataError(f"{path} cannot be read as SQuAD's JSON ({e}).") from None
    return parse(data, str(path))


def split_files(root: Path) -> dict[str, Path]:
    """The training and dev files of a SQuAD folder: one ``train*.json`` and one ``dev*.json``."""
    found = {}
    for split, pattern in (("train", "train*.json"), ("validation", "dev*.json")):
        files = sorted(root.glob(pattern))
        if len(files) != 1:
            raise FileNotFoundError(
                f"squad.data_dir={root}: {len(files)} files match {pattern} ({', '.join(f.name for f in files) or 'none'}); "
                f"it must hold one training file (train-v1.1.json) and one dev file (dev-v1.1.json)."
            )
        found[split] = files[0]
    return found


def read_hub(dataset: str = HUB_DATASET) -> dict[str, list[Example]]:
    if not hub_offline() and not hub_reachable():
        log.info("the Hugging Face hub is not reachable: looking for %s in the datasets cache only", dataset)
        go_offline()
    from datasets import load_dataset

    try:
        out = {}
        for split in ("train", "validation"):
            rows = load_dataset(dataset, split=split)
            out[split] = [
                Example(
                    str(r["id"]),
                    r["question"],
                    r["context"],
                    tuple(zip(r["answers"]["text"], map(int, r["answers"]["answer_start"]))),
                )
                for r in rows
            ]
            checked(out[split], f"{dataset} ({split})")
    except SquadDataError:
        raise
    except Exception as e:  # noqa: BLE001 - offline, or no such dataset
        raise ConnectionError(
            f"could not load SQuAD from the Hugging Face hub ({dataset}): {e}. Offline, point squad.data_dir at a "
            f"folder with train-v1.1.json and dev-v1.1.json, or use squad.source=synthetic."
        ) from e
    return out


# --- questions in the synthetic language -------------------------------------------------------------------
SIZES = (2000, 400)  # (train, dev) questions at scale 1


@dataclass(frozen=True)
class SyntheticSquad(SyntheticSet):
    """Questions about a short text in the synthetic language: three to six sentences of one topic,
    and a question about one of them, "What does the <subject> <verb>?" (its object is the answer) or
    "Who <verb> <object>?" (its subject is). Within a text no subject and verb (or verb and object)
    come twice, so every question has one answer, which only reading the text finds."""

    folder: ClassVar[str] = "squad-synthetic"
    version: ClassVar[int] = 1

    scale: float = 1.0

    def examples(self, split: str) -> list[dict]:

        rng = random.Random(f"squad-{self.seed}-{split}")
        w = World(SyntheticLanguage(seed=self.language_seed, num_topics=self.num_topics), rng)
        n = max(1, round(SIZES[split == "validation"] * self.scale))
        articles = []
        for i in range(n):
            t = w.topic()
            clauses: list = []
            while len(clauses) < rng.randint(3, 6):
                c = w.clause(t)
                if all((c.subj, c.verb) != (o.subj, o.verb) and (c.verb, c.obj) != (o.verb, o.obj) for o in clauses):
                    clauses.append(c)
            words = [c.words() for c in clauses]
            sentences = [" ".join(ws) + "." for ws in words]
            sentences = [s[0].upper() + s[1:] for s in sentences]
            k = rng.randrange(len(clauses))
            c, ws = clauses[k], words[k]
            first = 1 if c.stage else 0  # the subject's noun phrase starts after the stage word
            subj_len = 3 + (1 if c.subj_adj else 0)  # determiner, adjective, noun, number
            obj_start = first + subj_len + 2  # after the verb and its agreement particle
            obj_len = 3 + (1 if c.obj_adj else 0)
            subject = " ".join(x for x in ["the", c.subj_adj, c.subj, NOUN_NUMBER[c.subj_pl]] if x)
            if rng.random() < 0.5:
                question = f"What does {subject} {c.verb} {VERB_AGREEMENT[c.subj_pl]}?"
                span = (obj_start, obj_start + obj_len)
            else:
                obj = " ".join(ws[obj_start : obj_start + obj_len])
                question = f"Who {c.verb} {VERB_AGREEMENT[c.subj_pl]} {obj}?"
                span = (first, first + subj_len)
            before = " ".join(sentences[:k])
            offset = len(before) + (1 if before else 0)  # the sentence's first character in the context
            start = offset + len(" ".join(ws[: span[0]])) + (1 if span[0] else 0)
            context = " ".join(sentences)
            answer = sentences[k][start - offset : start - offset + len(" ".join(ws[span[0] : span[1]]))]
            qa = {"id": f"{split}-{i}", "question": question, "answers": [{"text": answer, "answer_start": start}]}
            articles.append({"title": f"text {i}", "paragraphs": [{"context": context, "qas": [qa]}]})
        return articles

    def generate(self, into: Path) -> None:
        """``train-v1.1.json`` and ``dev-v1.1.json``."""
        for split, name in (("train", "train-v1.1.json"), ("validation", "dev-v1.1.json")):
            data = {"version": "1.1", "data": self.examples(split)}
            (into / name).write_text(json.dumps(data), encoding="utf-8")


def data_root(data: DataBlock) -> Path | None:
    """The folder the questions are read from (the synthetic set generated into the cache first); None
    for the hub."""
    return data.root(SyntheticSquad, "folder with train-v1.1.json and dev-v1.1.json")


def load(data: DataBlock) -> tuple[dict[str, list[Example]], dict[str, str] | None]:
    """Training and dev questions (the first ``max_train_examples`` / ``max_eval_examples``) and their
    files' sha256."""
    max_train, max_eval = data.max_train_examples, data.max_eval_examples
    root = data_root(data)
    if root is None:
        splits, digests = read_hub(), None
    else:
        files = split_files(root)
        splits = {split: read_file(path) for split, path in files.items()}
        digests = {path.name: file_digest(path) for path in files.values()}
    splits["train"] = splits["train"][:max_train] if max_train else splits["train"]
    splits["validation"] = splits["validation"][:max_eval] if max_eval else splits["validation"]
    return splits, digests


# --- windows -------------------------------------------------------------------------------------------------
@dataclass
class ContextWindows:
    """Every window of every question: ``ids`` (``[CLS] question [SEP] context [SEP]``), ``types``
    (segment ids), ``offsets`` (per token, its characters in the context; (-1, -1) outside it),
    ``example`` (the question it is of), ``start``/``end`` (the answer's tokens; 0, ``[CLS]``, when the
    window does not hold it)."""

    ids: list[np.ndarray]
    types: list[np.ndarray]
    offsets: list[np.ndarray]
    example: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


def windows(
    examples: list[Example],
    tokenizer: Tokenizer,
    tokens: SpecialTokens,
    max_seq_len: int,
    doc_stride: int,
    max_query_length: int,
) -> ContextWindows:
    """Cut every question's context into windows (see the module docstring); the first answer is the
    training label."""
    questions = tokenizer.encode_batch([e.question for e in examples], add_special_tokens=False)
    contexts = tokenizer.encode_batch([e.context for e in examples], add_special_tokens=False)
    ids, types, offsets, example, starts, ends = [], [], [], [], [], []
    for i, (e, q, c) in enumerate(zip(examples, questions, contexts)):
        query = q.ids[:max_query_length]
        room = max_seq_len - len(query) - 3
        if room <= doc_stride:
            raise ConfigError(
                f"task.max_seq_len={max_seq_len} leaves {room} context tokens beside a {len(query)}-token question, not "
                f"more than task.doc_stride={doc_stride}: raise max_seq_len or lower doc_stride and max_query_length."
            )
        text, answer_start = e.answers[0]
        answer_end = answer_start + len(text)  # one past the answer's last character
        spans = np.asarray(c.offsets, dtype=np.int64).reshape(-1, 2)
        head = [tokens.cls_id, *query, tokens.sep_id]
        start = 0
        while True:
            stop = min(start + room, len(c.ids))
            ids.append(np.asarray([*head, *c.ids[start:stop], tokens.sep_id], dtype=np.int64))
            types.append(np.asarray([0] * len(head) + [1] * (stop - start + 1), dtype=np.int64))
            window = np.full((len(ids[-1]), 2), -1, dtype=np.int64)
            window[len(head) : len(head) + stop - start] = spans[start:stop]
            offsets.append(window)
            example.append(i)
            inside = np.nonzero((spans[start:stop, 0] < answer_end) & (spans[start:stop, 1] > answer_start))[0]
            first_char = spans[start, 0] if stop > start else 0
            last_char = spans[stop - 1, 1] if stop > start else 0
            if len(inside) and first_char <= answer_start and last_char >= answer_end:
                starts.append(len(head) + int(inside[0]))
                ends.append(len(head) + int(inside[-1]))
            else:
                starts.append(0)
                ends.append(0)
            if stop >= len(c.ids):
                break
            start = stop - doc_stride
    return ContextWindows(ids, types, offsets, np.asarray(example), np.asarray(starts), np.asarray(ends))


class WindowsDataset(torch.utils.data.Dataset):
    def __init__(self, w: ContextWindows):
        self.w = w

    def __len__(self) -> int:
        return len(self.w)

    def __getitem__(self, i: int):
        return i, self.w.ids[i], self.w.types[i], self.w.start[i], self.w.end[i]


def collate(items: list, pad_id: int, multiple: int = 1) -> dict[str, torch.Tensor]:
    n = -(-max(len(x[1]) for x in items) // multiple) * multiple
    ids = torch.full((len(items), n), pad_id, dtype=torch.long)
    types = torch.zeros((len(items), n), dtype=torch.long)
    for row, (_, x, t, _, _) in enumerate(items):
        ids[row, : len(x)] = torch.from_numpy(x)
        types[row, : len(t)] = torch.from_numpy(t)
    return {
        "input_ids": ids,
        "token_type_ids": types,
        "attention_mask": ids != pad_id,
        "labels": torch.as_tensor([[x[3], x[4]] for x in items], dtype=torch.long),
        "index": torch.as_tensor([x[0] for x in items], dtype=torch.long),
    }


def best_answers(
    examples: list[Example],
    w: ContextWindows,
    start_logits: dict[int, np.ndarray],
    end_logits: dict[int, np.ndarray],
    n_best: int,
    max_answer_length: int,
) -> dict[str, str]:
    """Each question's answer: its windows' best span (see the module docstring); "" when none is valid."""
    best: dict[int, tuple[float, str]] = {}
    for k in sorted(start_logits):
        i = int(w.example[k])
        spans = w.offsets[k]
        s_logits, e_logits = start_logits[k][: len(spans)], end_logits[k][: len(spans)]
        for s in np.argsort(s_logits)[::-1][:n_best]:
            if spans[s, 0] < 0:
                continue
            for e in np.argsort(e_logits)[::-1][:n_best]:
                if spans[e, 0] < 0 or e < s or e - s + 1 > max_answer_length:
                    continue
                score = float(s_logits[s] + e_logits[e])
                if i not in best or score > best[i][0]:
                    best[i] = (score, examples[i].context[spans[s, 0] : spans[e, 1]])
    return {e.id: best[i][1] if i in best else "" for i, e in enumerate(examples)}


# --- the head ----------------------------------------------------------------------------------------------
class SpanHead(Trainable):
    """A start and an end logit per token (a linear layer on the encoder's states), trained with the
    mean of the two cross-entropies; the dev questions' answers and their metrics after every epoch."""

    def __init__(
        self,
        encoder: Encoder,
        optim: OptimConfig,
        total_steps: int,
        dev: list[Example],
        dev_windows: ContextWindows,
        n_best: int,
        max_answer_length: int,
        compile: dict | None = None,
    ):
        super().__init__(encoder, optim, total_steps, compile)
        self.dev, self.dev_windows = dev, dev_windows
        self.n_best, self.max_answer_length = n_best, max_answer_length
        self.span = nn.Linear(encoder.config.hidden_size, 2)
        nn.init.normal_(self.span.weight, std=encoder.config.initializer_range)
        nn.init.zeros_(self.span.bias)
        self.predictions: dict[str, str] = {}

    def logits(self, batch: dict) -> torch.Tensor:
        out = self.encoder(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        logits = self.span(out.hidden_states).float()  # (batch, seq, 2)
        return logits.masked_fill(~batch["attention_mask"][..., None], torch.finfo(torch.float32).min)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return (F.cross_entropy(logits[..., 0], labels[:, 0]) + F.cross_entropy(logits[..., 1], labels[:, 1])) / 2

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._outputs.setdefault(0, []).append((batch["index"], self(batch)))

    def evaluate(self, outputs: dict[int, list]) -> dict[str, float]:
        index = torch.cat([o[0] for o in outputs[0]])
        width = max(o[1].shape[1] for o in outputs[0])
        logits = torch.cat([F.pad(o[1], (0, 0, 0, width - o[1].shape[1])) for o in outputs[0]])
        if self.trainer.world_size > 1:  # every rank scores the whole dev set
            index, logits = self.gather_padded(index, logits)
        starts = {int(i): row[:, 0] for i, row in zip(index.cpu().numpy(), logits.cpu().numpy())}
        ends = {int(i): row[:, 1] for i, row in zip(index.cpu().numpy(), logits.cpu().numpy())}
        self.predictions = best_answers(self.dev, self.dev_windows, starts, ends, self.n_best, self.max_answer_length)
        return scores(self.predictions, self.dev)


class SquadTask(FineTuned):
    """``task=squad``: SQuAD v1.1 (``squad.data_dir``, the hub, or ``squad.source=synthetic``)."""

    data_block = "squad"
    rank = 30

    def __init__(
        self,
        name: str,
        doc_stride: int = 128,
        max_query_length: int = 64,
        max_answer_length: int = 30,
        n_best: int = 20,
        **recipe,
    ):
        super().__init__(name, **recipe)
        self.doc_stride, self.max_query_length = doc_stride, max_query_length
        self.max_answer_length, self.n_best = max_answer_length, n_best

    @property
    def display(self) -> str:
        return "SQuAD"

    @property
    def metrics(self) -> tuple[str, ...]:
        return ("exact_match", "f1")

    @property
    def headline(self) -> str:
        return "f1"

    def metric_label(self, metric: str) -> str:
        return {"exact_match": "EM", "f1": "F1"}[metric]

    def check(self) -> None:
        rules = {
            "task.doc_stride": integer(1),
            "task.max_query_length": integer(1),
            "task.max_answer_length": integer(1),
            "task.n_best": integer(1),
            "squad.max_train_examples": optional_integer(1),
            "squad.max_eval_examples": optional_integer(1),
        }
        settings = {
            "task": {k: getattr(self, k) for k in ("doc_stride", "max_query_length", "max_answer_length", "n_best")},
            "squad": {
                "max_train_examples": self.data.max_train_examples,
                "max_eval_examples": self.data.max_eval_examples,
            },
        }
        check(OmegaConf.create(settings), rules, "conf/task/squad.yaml or conf/finetune.yaml (squad:)")
        if self.max_query_length + 3 + self.doc_stride >= self.max_seq_len:
            raise ConfigError(
                f"task.max_seq_len={self.max_seq_len} leaves no context beside task.max_query_length="
                f"{self.max_query_length} and task.doc_stride={self.doc_stride}: raise max_seq_len or lower them."
            )

    def data_files(self) -> list[Path] | None:
        root = data_root(self.data)
        return None if root is None else list(split_files(root).values())

    def evaluate(self, run: RunContext, model, fitting: Fitting) -> dict:
        t0 = time.time()
        splits, digests = load(self.data)
        cut = functools.partial(
            windows,
            tokenizer=model.tokenizer,
            tokens=model.tokens,
            max_seq_len=self.max_seq_len,
            doc_stride=self.doc_stride,
            max_query_length=self.max_query_length,
        )
        train, dev = cut(splits["train"]), cut(splits["validation"])
        log.info(
            "squad: %d training questions in %d windows (%d without their answer), %d dev questions in %d windows; "
            "loaded in %.1fs",
            len(splits["train"]),
            len(train),
            int((train.start == 0).sum()),
            len(splits["validation"]),
            len(dev),
            time.time() - t0,
        )
        devices = fitting.devices
        pad = model.tokens.pad_id
        multiple = 8 if devices.compile else 1
        batches = functools.partial(collate, pad_id=pad, multiple=multiple)
        train_loader = torch.utils.data.DataLoader(
            WindowsDataset(train),
            batch_size=devices.micro_batch,
            shuffle=True,
            generator=torch.Generator().manual_seed(run.seed),
            num_workers=run.num_workers,
            worker_init_fn=worker_init,
            collate_fn=batches,
        )
        dev_loader = torch.utils.data.DataLoader(
            WindowsDataset(dev),
            batch_size=devices.micro_batch * 2,
            sampler=sorted(range(len(dev)), key=lambda i: len(dev.ids[i])),
            num_workers=run.num_workers,
            worker_init_fn=worker_init,
            collate_fn=batches,
        )
        steps_per_epoch, total = fitting.steps(len(train))
        module = SpanHead(
            model.encoder,
            fitting.optim,
            total,
            splits["validation"],
            dev,
            self.n_best,
            self.max_answer_length,
            compile=devices.compile,
        )
        fields = fitting.fit(
            Job(
                module,
                train_loader,
                [dev_loader],
                steps_per_epoch,
                {"validation": len(splits["validation"])},
                {
                    "train_examples": len(splits["train"]),
                    "windows": {"train": len(train), "validation": len(dev)},
                    "no_skill": {"exact_match": 0.0, "f1": 0.0},
                    "data": {"source": self.data.source, "files": digests},
                },
            )
        )
        if fitting.primary:
            atomic.write_json(fitting.script.dir / PREDICTIONS, module.predictions)
            fields["predictions"] = str(fitting.script.dir / PREDICTIONS)
        return fields


__all__ = [
    "Example",
    "SpanHead",
    "SquadDataError",
    "SquadTask",
    "SyntheticSquad",
    "ContextWindows",
    "best_answers",
    "exact_match",
    "f1",
    "load",
    "normalize",
    "parse",
    "scores",
    "windows",
]

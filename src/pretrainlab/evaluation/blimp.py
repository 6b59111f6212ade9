"""Zero-shot minimal pairs (BLiMP, Warstadt et al., 2020).

A minimal pair is an acceptable sentence and an unacceptable one that differ in one point of grammar.
Nothing is trained: the pretraining objective scores both sentences the way its pretraining defines a
likelihood (``Objective.sentence_scores``: pseudo-log-likelihood for masked LMs, the discriminator's
"every token is original" for ELECTRA), and the pair counts as right when the acceptable sentence
scores higher (strictly: a tie is wrong, as the paper's definition; ties are counted).

Data: the hub (``nyu-mll/blimp``, one config per paradigm), a local folder of the 67
``<paradigm>.jsonl`` files as the authors release them, or minimal pairs generated in the synthetic
language (:func:`synthetic_pairs`, written in the same layout and read back the same way).

Accuracy is reported over all pairs, per field (morphology, syntax, semantics, syntax_semantics; the
release spells one paradigm's field ``syntax/semantics``: it is counted with syntax_semantics), per
phenomenon (the release's ``linguistics_term``: 13 values, where the paper counts the two s-selection
paradigms under argument structure) and per paradigm. Each pair's outcome is kept (``items``), so
that encoders are compared on the same pairs.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from tokenizers import Tokenizer

from pretrainlab import uncertainty
from pretrainlab.config import ConfigError
from pretrainlab.data.hashing import file_digest
from pretrainlab.data.hub import go_offline, hub_offline, hub_reachable
from pretrainlab.data.synthetic import NOUN_NUMBER, VERB_AGREEMENT, SyntheticLanguage
from pretrainlab.data.world import World, render
from pretrainlab.evaluation.base import Evaluation, RunContext, Section
from pretrainlab.evaluation.data import DataBlock, SyntheticSet
from pretrainlab.export.native import load_objective
from pretrainlab.tokens import SpecialTokens

log = logging.getLogger("pretrainlab")

HUB_DATASET = "nyu-mll/blimp"
FIELDS = ("sentence_good", "sentence_bad", "field", "linguistics_term", "UID", "pairID")


class BlimpDataError(ValueError):
    """A minimal-pairs file that does not have BLiMP's layout."""


@dataclass(frozen=True)
class Pair:
    paradigm: str  # the release's UID (one file per paradigm)
    field: str
    phenomenon: str  # the release's linguistics_term
    pair_id: int
    good: str
    bad: str


def _pair(row: object, where: str) -> Pair:
    if not isinstance(row, dict):
        raise BlimpDataError(
            f"{where}: a JSON {type(row).__name__}, not an object with {', '.join(FIELDS)}; repair or remove the line."
        )
    missing = [k for k in FIELDS if k not in row]
    if missing:
        raise BlimpDataError(f"{where}: no {', '.join(missing)} (a BLiMP line has {', '.join(FIELDS)}).")
    for key in ("sentence_good", "sentence_bad"):
        value = row[key]
        if not isinstance(value, str) or not value.strip():
            raise BlimpDataError(
                f"{where}: {key} is {value!r}, not a sentence: an empty or missing sentence would be scored as one "
                f"(and win or lose every time). Repair or remove the line."
            )
    try:
        pair_id = int(row["pairID"])
    except (TypeError, ValueError):
        raise BlimpDataError(f"{where}: pairID {row['pairID']!r} is not a number.") from None
    field = str(row["field"]).replace("/", "_")  # principle_A_case_2 spells it syntax/semantics
    return Pair(
        str(row["UID"]),
        field,
        str(row["linguistics_term"]),
        pair_id,
        str(row["sentence_good"]),
        str(row["sentence_bad"]),
    )


def read_local(data_dir: str | Path) -> list[Pair]:
    """Every ``*.jsonl`` file of ``data_dir`` (one paradigm each), read completely or not at all: a
    file that is not UTF-8, a line that is not a pair, an empty file or a pair that comes twice in its
    file (the same pairID, or the same two sentences) is refused, naming the file and the line."""
    root = Path(os.path.expanduser(str(data_dir)))
    files = sorted(root.glob("*.jsonl")) if root.is_dir() else []
    if not files:
        raise FileNotFoundError(
            f"blimp.data_dir={data_dir}: no .jsonl files there. Point it at a folder of BLiMP's "
            f"paradigm files (<paradigm>.jsonl, as in the release's data/ folder)."
        )
    pairs: list[Pair] = []
    for f in files:
        data = f.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            where = data.count(b"\n", 0, e.start) + 1
            raise BlimpDataError(
                f"{f} is not UTF-8: byte 0x{data[e.start]:02x} at offset {e.start} (line {where}) cannot be decoded. "
                f"Fetch the file again, or re-encode it (iconv -t utf-8)."
            ) from None
        seen_ids: dict[int, int] = {}
        seen_pairs: dict[tuple[str, str], int] = {}
        before = len(pairs)
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise BlimpDataError(
                    f"{f}, line {n}: not a JSON object ({e}); repair the file (or fetch it again)."
                ) from None
            pair = _pair(row, f"{f}, line {n}")
            first = seen_ids.get(pair.pair_id) or seen_pairs.get((pair.good, pair.bad))
            if first is not None:
                what = f"pairID {pair.pair_id}" if pair.pair_id in seen_ids else "the same two sentences"
                raise BlimpDataError(
                    f"{f}, line {n}: {what} as line {first}: a pair counted twice would weigh twice in the "
                    f"accuracy. Remove the repeated line."
                )
            seen_ids[pair.pair_id] = seen_pairs[(pair.good, pair.bad)] = n
            pairs.append(pair)
        if len(pairs) == before:
            raise BlimpDataError(
                f"{f} holds no pairs: an empty paradigm would be left out of the scores without a word. Fetch it "
                f"again, or remove it from blimp.data_dir."
            )
    return pairs


def read_hub(dataset: str = HUB_DATASET) -> list[Pair]:
    """All paradigms of ``dataset`` on the Hugging Face hub (one config each)."""
    if not hub_offline() and not hub_reachable():
        log.info("the Hugging Face hub is not reachable: looking for %s in the datasets cache only", dataset)
        go_offline()
    from datasets import get_dataset_config_names, load_dataset

    try:
        names = get_dataset_config_names(dataset)
        pairs = [
            _pair(row, f"{dataset}/{name}")
            for name in sorted(names)
            for row in load_dataset(dataset, name, split="train")
        ]
    except Exception as e:  # noqa: BLE001 - offline, or no such dataset
        raise ConnectionError(
            f"could not load BLiMP from the Hugging Face hub ({dataset}): {e}. Offline, point "
            f"blimp.data_dir at a folder of the 67 paradigm files, or use blimp.source=synthetic."
        ) from e
    return pairs


# --- minimal pairs in the synthetic language ------------------------------------------------------------
# paradigm -> (field, phenomenon)
SYNTHETIC_PARADIGMS = {
    "subject_verb_agreement": ("morphology", "subject_verb_agreement"),
    "determiner_noun_agreement": ("morphology", "determiner_noun_agreement"),
    "verb_object_order": ("syntax", "word_order"),
    "verb_as_argument": ("syntax", "argument_structure"),
    "selectional_preference": ("semantics", "selectional_preference"),
}


@dataclass(frozen=True)
class SyntheticPairs(SyntheticSet):
    """Minimal pairs in the synthetic language (``pretrainlab.data.synthetic``), one file per paradigm:

    - subject_verb_agreement: the verb's particle disagrees with its subject (``ta``/``ti``);
    - determiner_noun_agreement: the object's particle disagrees with its determiner (``a ... ki``);
    - verb_object_order: the object before the verb;
    - verb_as_argument: a verb in the object's place;
    - selectional_preference: the verb's favourite object against a noun of another topic (both
      grammatical; only co-occurrence in pretraining tells them apart).

    Both sentences of a pair have the same number of words."""

    folder: ClassVar[str] = "blimp-synthetic"
    version: ClassVar[int] = 2  # 2: a pair drawn twice is kept once

    pairs: int = 1000

    def paradigms(self) -> dict[str, list[dict]]:
        """Every paradigm's pairs, as BLiMP's files hold them."""
        rng = random.Random(f"blimp-{self.seed}")
        w = World(SyntheticLanguage(seed=self.language_seed, num_topics=self.num_topics), rng)
        out: dict[str, list[dict]] = {name: [] for name in SYNTHETIC_PARADIGMS}
        for name, (field, phenomenon) in SYNTHETIC_PARADIGMS.items():
            seen: set[tuple[str, str]] = set()  # a pair drawn twice is kept once: each counts once in the accuracy
            draws = 0
            while len(out[name]) < self.pairs:
                draws += 1
                if draws > 50 * self.pairs:
                    raise ValueError(
                        f"synthetic BLiMP: the language has too few distinct {name} pairs for {self.pairs} "
                        f"({len(out[name])} found in {draws - 1} draws); lower blimp.synthetic.pairs"
                    )
                t = w.topic()
                c = replace(w.clause(t, prep=False), stage=None)
                good = c.words()
                if name == "subject_verb_agreement":
                    bad = c.words(verb_agreement=False)
                elif name == "determiner_noun_agreement":  # the object's particle only
                    bad = list(good)
                    bad[len(good) - 1] = NOUN_NUMBER[not c.obj_pl]
                elif name == "verb_object_order":
                    k = good.index(c.verb)
                    bad = good[:k] + good[k + 2 :] + [c.verb, VERB_AGREEMENT[c.subj_pl]]
                elif name == "verb_as_argument":
                    bad = list(good)
                    bad[len(good) - 2] = w.verb(t, avoid=c.verb)
                else:
                    preferred = w.lex.prefs.get(c.verb) or []
                    others = [n for u, topic in enumerate(w.lex.topics) if u != t for n in topic["nouns"]]
                    if not preferred or not others:
                        continue
                    good = replace(c, obj=rng.choice(preferred)).words()
                    bad = replace(c, obj=rng.choice(others)).words()
                if good == bad or (render(good), render(bad)) in seen:
                    continue
                seen.add((render(good), render(bad)))
                out[name].append(
                    {
                        "sentence_good": render(good),
                        "sentence_bad": render(bad),
                        "field": field,
                        "linguistics_term": phenomenon,
                        "UID": name,
                        "pairID": str(len(out[name])),
                    }
                )
        return out

    def generate(self, into: Path) -> None:
        """The pairs as ``<paradigm>.jsonl`` files."""
        for name, rows in self.paradigms().items():
            (into / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def data_root(data: DataBlock) -> Path | None:
    """The local folder the pairs are read from (the synthetic ones are generated into the cache
    first); None for the hub."""
    return data.root(SyntheticPairs, "folder of the paradigm .jsonl files")


def load_pairs(data: DataBlock) -> tuple[list[Pair], dict[str, str] | None]:
    """The pairs (the first ``blimp.max_pairs`` of each paradigm when set) and the sha256 of the files
    they were read from (None from the hub)."""
    max_pairs = data.options.get("max_pairs")
    if max_pairs is not None and (isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or max_pairs < 1):
        raise BlimpDataError(f"blimp.max_pairs={max_pairs!r}: null (every pair) or a number of pairs of at least 1.")
    root = data_root(data)
    pairs = read_hub() if root is None else read_local(root)
    digests = None if root is None else {f.name: file_digest(f) for f in sorted(root.glob("*.jsonl"))}
    if max_pairs is not None:
        kept, count = [], {}  # type: list[Pair], dict[str, int]
        for p in pairs:
            count[p.paradigm] = count.get(p.paradigm, 0) + 1
            if count[p.paradigm] <= max_pairs:
                kept.append(p)
        pairs = kept
    return pairs, digests


# --- scoring --------------------------------------------------------------------------------------------
def encode(texts: list[str], tokenizer: Tokenizer, tokens: SpecialTokens, max_seq_len: int) -> list[np.ndarray]:
    """``[CLS] text [SEP]`` as token ids, as the encoder saw single segments in pretraining."""
    out = []
    for text, e in zip(texts, tokenizer.encode_batch(texts, add_special_tokens=False)):
        ids = np.asarray([tokens.cls_id, *e.ids, tokens.sep_id], dtype=np.int64)
        if len(ids) > max_seq_len:
            raise ValueError(
                f"the sentence {text[:60]!r} is {len(ids)} tokens long, more than task.max_seq_len="
                f"{max_seq_len}: raise it (up to the encoder's positions)."
            )
        out.append(ids)
    return out


def score(objective, encoder, sequences: list[np.ndarray], max_tokens: int, progress: bool = True) -> np.ndarray:
    """``objective.sentence_scores`` of every sequence, in chunks of sequences of similar length
    (a progress bar over sentences)."""
    from tqdm.auto import tqdm

    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    scores = np.empty(len(sequences), dtype=np.float64)
    chunk = 4096
    with tqdm(total=len(sequences), desc="scoring sentences", unit="sent", disable=not progress) as bar:
        for start in range(0, len(order), chunk):
            idx = order[start : start + chunk]
            scores[idx] = objective.sentence_scores(encoder, [sequences[i] for i in idx], max_tokens)
            bar.update(len(idx))
    return scores


def breakdown(pairs: list[Pair], correct: np.ndarray) -> dict[str, dict[str, dict]]:
    """Accuracy and pair count per field, phenomenon and paradigm."""
    out: dict[str, dict[str, dict]] = {}
    for level, key in (
        ("field", lambda p: p.field),
        ("phenomenon", lambda p: p.phenomenon),
        ("paradigm", lambda p: p.paradigm),
    ):
        groups: dict[str, list[int]] = {}
        for i, p in enumerate(pairs):
            groups.setdefault(key(p), []).append(i)
        out[level] = {
            name: {"accuracy": float(correct[idx].mean()), "pairs": len(idx)} for name, idx in sorted(groups.items())
        }
    return out


def evaluate(
    objective,
    encoder,
    tokenizer: Tokenizer,
    tokens: SpecialTokens,
    pairs: list[Pair],
    max_seq_len: int,
    max_tokens: int = 8192,
    progress: bool = True,
) -> dict:
    """Score every pair; the metrics, the breakdown and each pair's outcome (``items``: per
    paradigm, a string of 0/1 in the order of its pairs; ``paradigms``: each paradigm's field and
    phenomenon)."""
    t0 = time.perf_counter()
    if hasattr(objective, "eval"):
        objective.eval()
    encoder.eval()
    good = encode([p.good for p in pairs], tokenizer, tokens, max_seq_len)
    bad = encode([p.bad for p in pairs], tokenizer, tokens, max_seq_len)
    with torch.no_grad():
        scores = score(objective, encoder, good + bad, max_tokens, progress)
    g, b = scores[: len(pairs)], scores[len(pairs) :]
    correct = g > b
    items: dict[str, list[str]] = {}
    for p, c in zip(pairs, correct):
        items.setdefault(p.paradigm, []).append("1" if c else "0")
    seconds = time.perf_counter() - t0
    groups = {p.paradigm: [p.field, p.phenomenon] for p in pairs}
    return {
        "metrics": {"accuracy": float(correct.mean())},
        "breakdown": breakdown(pairs, correct),
        "items": {k: "".join(v) for k, v in items.items()},
        "paradigms": groups,
        "pairs": len(pairs),
        "ties": int((g == b).sum()),
        "sentences_per_s": round(2 * len(pairs) / seconds, 1),
        "scoring_s": round(seconds, 2),
    }


LEVELS = ("field", "phenomenon", "paradigm")


def blimp_table(results: list[dict], rows: dict[str, str], encoder_id, level: float = uncertainty.LEVEL) -> dict:
    """{level: {group: {row: {"accuracy", "ci", "pairs"}}}} over the BLiMP results (one per encoder);
    ``rows`` maps an encoder id to its row, ``encoder_id(result)`` gives a result's encoder id."""
    by_row: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        if r["task"] == "blimp" and r.get("items"):
            by_row[rows[encoder_id(r)]].append(r)
    if not by_row:
        return {}
    rng = np.random.default_rng(0)
    out: dict = {lv: defaultdict(dict) for lv in LEVELS}
    for row, rs in sorted(by_row.items()):
        paradigms = rs[0].get("paradigms") or {}
        groups: dict[str, dict[str, list[str]]] = {lv: defaultdict(list) for lv in LEVELS}
        for uid in sorted(rs[0]["items"]):
            field, phenomenon = paradigms.get(uid, ["?", "?"])
            for lv, name in zip(LEVELS, (field, phenomenon, uid)):
                groups[lv][name].append(uid)
        for lv in LEVELS:
            for name, uids in groups[lv].items():
                outcomes = {
                    i: np.frombuffer("".join(r["items"][u] for u in uids).encode(), dtype=np.uint8) - 48
                    for i, r in enumerate(rs)
                }
                s = uncertainty.summarize_items(outcomes, level, samples=1000, rng=rng)
                out[lv][name][row] = {"accuracy": s.mean, "ci": s.ci, "pairs": len(next(iter(outcomes.values())))}
    return {lv: dict(groups) for lv, groups in out.items()}


def blimp_markdown(table: dict, levels: tuple[str, ...] = LEVELS) -> str:
    """One table per level: groups down, rows across, accuracy (interval)."""
    if not table:
        return ""
    rows = sorted({row for groups in table.values() for g in groups.values() for row in g})
    parts = []
    for lv in levels:
        groups = table[lv]
        lines = [
            f"BLiMP by {lv} (accuracy x 100, 95% interval over pairs)",
            "",
            f"| {lv} | pairs | " + " | ".join(rows) + " |",
            "|" + "---|" * (len(rows) + 2),
        ]
        for name, by_row in sorted(groups.items()):
            cells = []
            for row in rows:
                c = by_row.get(row)
                cells.append(
                    "–"
                    if c is None
                    else f"{c['accuracy']:.1f}" + (f" ({c['ci'][0]:.1f}, {c['ci'][1]:.1f})" if c["ci"] else "")
                )
            pairs = next(iter(by_row.values()))["pairs"]
            lines.append(f"| {name} | {pairs} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


class Blimp(Evaluation):
    """``task=blimp``: every minimal pair scored by the objective the encoder was pretrained with
    (``max_tokens``: tokens through the encoder at once)."""

    fine_tuned = False
    seeded = False  # deterministic: scored once per encoder
    data_block = "blimp"
    rank = 80

    def __init__(self, name: str, max_seq_len: int = 128, max_tokens: int = 8192, data: DataBlock | None = None):
        super().__init__(name, max_seq_len, data)
        self.max_tokens = max_tokens

    @property
    def display(self) -> str:
        return "BLiMP"

    @property
    def metrics(self) -> tuple[str, ...]:
        return ("accuracy",)

    def data_files(self) -> list[Path] | None:
        root = data_root(self.data)
        return None if root is None else sorted(root.glob("*.jsonl"))

    def evaluate(self, run: RunContext, model, fitting) -> dict:
        """Every pair scored with the objective ``model`` (a ``export.pretrained.Pretrained``) was pretrained
        with, rebuilt from its export with its weights (``init=scratch``: freshly initialised, seeded)."""
        if run.pretrained.startswith("hf:"):
            raise ConfigError(
                f"task=blimp scores sentences with the pretraining objective's own heads, and "
                f"pretrained={run.pretrained} is imported without them: evaluate a pretrainlab encoder."
            )
        torch.manual_seed(run.seed)  # the scratch baseline's heads
        objective = load_objective(run.pretrained, model.encoder, model.tokens, weights=run.init != "scratch")
        pairs, digests = load_pairs(self.data)
        device = run.inference_device()
        encoder = model.encoder.to(device)
        objective.to(device)
        log.info(
            "blimp: %d pairs in %d paradigms, scored by %s on %s",
            len(pairs),
            len({p.paradigm for p in pairs}),
            type(objective).__name__,
            device,
        )
        with run.inference_autocast(device):
            out = evaluate(
                objective,
                encoder,
                model.tokenizer,
                model.tokens,
                pairs,
                self.max_seq_len,
                self.max_tokens,
                progress=run.progress,
            )
        log.info("blimp: %.1f sentences/s (%.0fs)", out["sentences_per_s"], out["scoring_s"])
        return {
            **out,
            "eval_examples": {"pairs": len(pairs)},
            "data": {"source": self.data.source, "files": digests},
            "no_skill": {"accuracy": 0.5},
        }

    def contradictions(self, result: dict) -> list[str]:
        items = "".join((result.get("items") or {}).values())
        if not items:
            return []
        scored = items.count("1") / len(items)
        accuracy = result["metrics"].get("accuracy")
        if accuracy is not None and abs(float(accuracy) - scored) > 1e-9:
            return [f"accuracy {accuracy!r} where its {len(items)} pairs' outcomes give {scored!r}"]
        return []

    @classmethod
    def sections(cls, results, rows, encoder_id, level) -> list[Section]:
        table = blimp_table(results, rows, encoder_id, level)
        if not table:
            return []
        summary = blimp_markdown(table, ("field",)) + "\n\n(by phenomenon and paradigm: blimp.md)"
        return [Section("blimp", table, blimp_markdown(table), summary)]


__all__ = [
    "Blimp",
    "BlimpDataError",
    "Pair",
    "SYNTHETIC_PARADIGMS",
    "SyntheticPairs",
    "blimp_markdown",
    "blimp_table",
    "breakdown",
    "data_root",
    "encode",
    "evaluate",
    "load_pairs",
    "read_hub",
    "read_local",
    "score",
]

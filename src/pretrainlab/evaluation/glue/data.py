"""GLUE data: read a task from the Hugging Face hub, a local GLUE directory or the synthetic
suite, and encode it as ``[CLS] A [SEP] (B [SEP])`` with segment ids for the fine-tuned encoder."""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from pretrainlab.data.hub import go_offline, hub_offline, hub_reachable
from pretrainlab.evaluation.data import DataBlock
from pretrainlab.evaluation.glue.synthetic import SyntheticGlue
from pretrainlab.evaluation.glue.tasks import TaskSpec
from pretrainlab.runtime.signals import worker_init
from pretrainlab.tokens import SpecialTokens

log = logging.getLogger("pretrainlab")

HUB_DATASET = "nyu-mll/glue"


@dataclass
class GlueSplit:
    text_a: list[str]
    text_b: list[str] | None
    labels: np.ndarray  # int64 class ids, or float32 scores (STS-B)

    def __len__(self) -> int:
        return len(self.text_a)

    def head(self, n: int | None) -> GlueSplit:
        if n is None or n >= len(self):
            return self
        return GlueSplit(self.text_a[:n], None if self.text_b is None else self.text_b[:n], self.labels[:n])


class GlueDataError(ValueError):
    """A GLUE file that does not have the layout its task needs."""


def _label_value(spec: TaskSpec, raw: str, where: str) -> float | int:
    raw = raw.strip()
    if spec.labels is None:
        try:
            return float(raw)
        except ValueError:
            raise GlueDataError(f"{where}: score {raw!r} is not a number.") from None
    try:
        return spec.labels.index(raw)
    except ValueError:
        raise GlueDataError(f"{where}: label {raw!r} is not one of {list(spec.labels)}.") from None


def read_tsv(spec: TaskSpec, path: str | Path, complete: bool = False) -> GlueSplit:
    """One GLUE TSV file, as ``download_glue_data.py`` writes it (no quoting: quotes are text).

    Every line must have as many columns as the header (CoLA, which has none: four). A line with
    too few or too many (a tab inside a sentence would shift every column after it) is skipped with
    a warning in a training file (QQP's has a few), and fails the read when ``complete`` (evaluation
    files: a score on part of a dev set would be compared with scores on all of it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"GLUE task {spec.name}: no file {path}. glue.data_dir must be a directory in the layout of "
            f"download_glue_data.py (<data_dir>/{spec.directory}/train.tsv, dev.tsv, ...)."
        )
    # utf-8-sig drops MRPC's byte-order mark; the last line may lack its newline (CoLA's dev)
    with open(path, encoding="utf-8-sig", newline="") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line.rstrip("\r") for line in lines]
    columns = [c for c in (spec.text_a, spec.text_b, spec.label) if c is not None]
    start = 0
    width = max(i for i, _ in columns if i >= 0) + 1  # the columns a line must have
    if spec.header:
        header = lines[0].split("\t") if lines else []
        width = len(header)
        for index, name in columns:
            if name is not None and (len(header) <= abs(index) or header[index].strip() != name):
                raise GlueDataError(
                    f"{path}: expected column {name!r} at position {index} of the header, found "
                    f"{header!r}. Is this the {spec.directory} file of a GLUE directory?"
                )
        start = 1
    text_a, text_b, labels, skipped = [], [], [], []
    for n, line in enumerate(lines[start:], start=start + 1):
        fields = line.split("\t")
        if len(fields) != width:
            if complete:
                extra = (
                    " (a tab inside a sentence? every column after it would be shifted)" if len(fields) > width else ""
                )
                raise GlueDataError(
                    f"{path}, line {n}: {len(fields)} column(s), {spec.directory} has {width}{extra}. An "
                    f"evaluation file is read completely or not at all; repair the file (or fetch it again)."
                )
            skipped.append(n)  # QQP's train file has a few broken lines
            continue
        text_a.append(fields[spec.text_a[0]])
        if spec.text_b is not None:
            text_b.append(fields[spec.text_b[0]])
        labels.append(_label_value(spec, fields[spec.label[0]], f"{path}, line {n}"))
    if skipped:
        log.warning(
            "%s: skipped %d line(s) without the file's %d columns (lines %s)",
            path,
            len(skipped),
            width,
            ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else ""),
        )
    if not text_a:
        raise GlueDataError(f"{path} has no examples.")
    dtype = np.float32 if spec.is_regression else np.int64
    return GlueSplit(text_a, text_b if spec.text_b is not None else None, np.asarray(labels, dtype=dtype))


def read_local(spec: TaskSpec, data_dir: str | Path) -> dict[str, GlueSplit]:
    root = Path(os.path.expanduser(str(data_dir))) / spec.directory
    if not root.is_dir():
        raise FileNotFoundError(
            f"GLUE task {spec.name}: no directory {root}. glue.data_dir must be a GLUE directory in the layout of "
            f"download_glue_data.py, containing {spec.directory}/."
        )
    splits = {"train": read_tsv(spec, root / "train.tsv")}
    for split, (filename, _) in spec.eval_splits.items():
        splits[split] = read_tsv(spec, root / filename, complete=True)
    return splits


def read_hub(spec: TaskSpec, dataset: str = HUB_DATASET) -> dict[str, GlueSplit]:
    """A task from the Hugging Face hub (``nyu-mll/glue``); needs network or the datasets cache.
    When the hub does not answer, the cache alone is tried, at once."""
    if not hub_offline() and not hub_reachable():
        log.info(
            "the Hugging Face hub is not reachable: looking for %s/%s in the datasets cache only", dataset, spec.name
        )
        go_offline()
    from datasets import load_dataset

    try:
        ds = load_dataset(dataset, spec.name)
    except Exception as e:  # offline, or no such dataset
        raise ConnectionError(
            f"could not load GLUE task {spec.name} from the Hugging Face hub ({dataset}): {e}. Offline, point "
            f"glue.data_dir at a local GLUE directory (download_glue_data.py layout), or use glue.source=synthetic."
        ) from e
    out = {}
    for split in ["train", *spec.eval_splits]:
        d = ds[split]
        labels = np.asarray(d["label"], dtype=np.float32 if spec.is_regression else np.int64)
        b = list(d[spec.hub_columns[1]]) if spec.is_pair else None
        out[split] = GlueSplit(list(d[spec.hub_columns[0]]), b, labels)
    return out


LAYOUT = "GLUE directory"


def glue_root(data: DataBlock) -> Path | None:
    """The GLUE directory a local or synthetic source reads (the synthetic suite is generated into the
    cache first); None for the hub."""
    return data.root(SyntheticGlue, LAYOUT)


def task_files(spec: TaskSpec, root: Path) -> list[Path]:
    """The files of ``spec`` (``TaskSpec.files``) that ``root`` holds."""
    return [root / spec.directory / n for n in spec.files if (root / spec.directory / n).is_file()]


def load_task(spec: TaskSpec, data: DataBlock) -> dict[str, GlueSplit]:
    """Train and eval splits of ``spec`` from ``data``'s source: ``auto`` (local if ``data_dir`` is set,
    else the hub), ``hub``, ``local`` or ``synthetic`` (generated into the cache, then read back as a
    local directory)."""
    root = glue_root(data)
    return read_hub(spec) if root is None else read_local(spec, root)


# --- encoding ---------------------------------------------------------------------------------------


@dataclass
class EncodedSplit:
    ids: list[np.ndarray]  # [CLS] A [SEP] (B [SEP]) per example
    types: list[np.ndarray]  # segment ids
    labels: np.ndarray
    truncated: int  # how many examples lost tokens to max_seq_len

    def __len__(self) -> int:
        return len(self.ids)


def encode(split: GlueSplit, tokenizer: Tokenizer, tokens: SpecialTokens, max_seq_len: int) -> EncodedSplit:
    """Tokenize and assemble; pairs are truncated longest-first to fit ``max_seq_len``."""
    a = [e.ids for e in tokenizer.encode_batch(split.text_a, add_special_tokens=False)]
    b = [e.ids for e in tokenizer.encode_batch(split.text_b, add_special_tokens=False)] if split.text_b else None
    cls, sep = tokens.cls_id, tokens.sep_id
    ids, types, truncated = [], [], 0
    for i, x in enumerate(a):
        y = b[i] if b is not None else None
        budget = max_seq_len - (3 if y is not None else 2)
        if budget < 2:
            raise ValueError(f"max_seq_len={max_seq_len} is too short to hold an example.")
        if len(x) + (len(y) if y is not None else 0) > budget:
            truncated += 1
            if y is None:
                x = x[:budget]
            else:
                while len(x) + len(y) > budget:  # longest first
                    if len(x) >= len(y):
                        x = x[:-1]
                    else:
                        y = y[:-1]
        seq = [cls, *x, sep] + ([*y, sep] if y is not None else [])
        t = np.zeros(len(seq), dtype=np.int64)
        if y is not None:
            t[len(x) + 2 :] = 1
        ids.append(np.asarray(seq, dtype=np.int64))
        types.append(t)
    return EncodedSplit(ids, types, split.labels, truncated)


class EncodedDataset(torch.utils.data.Dataset):
    def __init__(self, split: EncodedSplit):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray, np.ndarray, float | int]:
        return i, self.split.ids[i], self.split.types[i], self.split.labels[i]


class LengthGroupedSampler(torch.utils.data.Sampler):
    """Training order in which every run of ``batch_size`` examples has similar lengths, so a batch
    padded to its longest computes little padding (GLUE's training sets in random batches of 32
    are 36-67% padding; grouped, 2-5%).

    Each epoch: a random permutation (from ``generator``) is cut into groups of ``group_batches``
    batches, each group is sorted by length, the result is cut into batches, and the full batches
    are shuffled (a smaller last one stays last). Every example is drawn once per epoch; which examples meet in a batch is random
    within a group of similar length. ``batch_size`` is the global batch: under DDP, Lightning's
    wrapper hands rank r the positions r, r + world, ..., so each rank's micro-batch comes from one
    global batch's group."""

    def __init__(self, lengths, batch_size: int, generator: torch.Generator, group_batches: int = 50):
        self.lengths = torch.as_tensor(np.asarray(lengths), dtype=torch.long)
        self.batch_size, self.generator, self.group = batch_size, generator, group_batches * batch_size

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        n = len(self.lengths)
        perm = torch.randperm(n, generator=self.generator)
        groups = [g[torch.argsort(self.lengths[g], stable=True)] for g in perm.split(self.group)]
        batches = torch.cat(groups).split(self.batch_size)
        full = n // self.batch_size  # a smaller last batch stays last: the loader cuts this order into batches
        order = torch.cat([torch.randperm(full, generator=self.generator), torch.arange(full, len(batches))])
        return iter(torch.cat([batches[i] for i in order]).tolist())


def collate(items: list, pad_id: int, multiple: int = 1) -> dict[str, torch.Tensor]:
    """Pad to the longest example of the batch, rounded up to a ``multiple`` (8 under torch.compile:
    fewer distinct shapes to compile for; eagerly, every padded position is wasted work, a quarter
    of CoLA's tokens at 8)."""
    n = max(len(x[1]) for x in items)
    n = (n + multiple - 1) // multiple * multiple
    ids = torch.full((len(items), n), pad_id, dtype=torch.long)
    types = torch.zeros((len(items), n), dtype=torch.long)
    mask = torch.zeros((len(items), n), dtype=torch.bool)
    for row, (_, x, t, _) in enumerate(items):
        ids[row, : len(x)] = torch.from_numpy(x)
        types[row, : len(t)] = torch.from_numpy(t)
        mask[row, : len(x)] = True
    labels = torch.as_tensor(np.asarray([x[3] for x in items]))
    index = torch.as_tensor([x[0] for x in items], dtype=torch.long)
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": labels, "index": index}


def eval_loader(
    split: EncodedSplit, batch_size: int, pad_id: int, num_workers: int = 0, multiple: int = 1
) -> torch.utils.data.DataLoader:
    """A dev set's batches, its examples in order of length: each batch is padded to its longest,
    so little padding is computed. Predictions are matched to examples by index, so the order
    changes no metric."""
    return torch.utils.data.DataLoader(
        EncodedDataset(split),
        batch_size=batch_size,
        sampler=sorted(range(len(split)), key=lambda i: len(split.ids[i])),
        collate_fn=functools.partial(collate, pad_id=pad_id, multiple=multiple),
        num_workers=num_workers,
        worker_init_fn=worker_init,
    )

"""Frozen-feature probes: what each layer of an encoder holds, without training the encoder.

The encoder runs once over the task's sentences and every layer's output is kept (the embeddings,
projected to the hidden size, then each layer): for named entities the features of each word's first
sub-word, for a sentence task the mean of its tokens' features. They are cached per encoder (the hash
of its weights), task, data and settings. Linear classifiers (probes) are then fitted to

- each layer alone (``layer_0`` ... ``layer_L``): where the information sits;
- the last four layers concatenated (``last4``; all of them when there are fewer): BERT's Table 7
  feature-based NER, 96.1 dev F1 against 96.4 fine-tuned; the task's score;
- a learned weighted sum of all layers (``mix``: ELMo's scalar mix, Peters et al. 2018, softmax weights
  and a scale, fitted with the probe).

Features are standardised with the training set's mean and sd (per layer and dimension), probes are
trained with AdamW on shuffled mini-batches (seeded), and scored on the dev set: entity F1
(``ner``) or accuracy. Probes have few parameters and see features that do not change, so their
scores vary little from seed to seed: the signal a small study can afford.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pretrainlab import atomic, figures
from pretrainlab.data.hashing import fingerprint
from pretrainlab.evaluation import conll
from pretrainlab.evaluation.base import RunContext, Section, Trained, get
from pretrainlab.evaluation.glue.data import encode, glue_root, load_task, task_files
from pretrainlab.evaluation.glue.metrics import accuracy
from pretrainlab.evaluation.glue.tasks import get_task
from pretrainlab.evaluation.tagging import collate_words, encode_words, label_set
from pretrainlab.model.encoder import Encoder

log = logging.getLogger("pretrainlab")

FEATURES_VERSION = 1
FEATURE_BATCH = 64  # sentences through the encoder at once
MIX_LR_SCALE = 30.0  # the scalar mix's weights and scale learn this much faster than the linear layer


# --- features ---------------------------------------------------------------------------------------------
@torch.no_grad()
def word_features(encoder: Encoder, encoded, pad_id: int, batch_size: int, device: torch.device) -> np.ndarray:
    """(words, layers + 1, hidden) float16: every layer's output at the first sub-word of each word
    of ``encoded`` (``tagging.EncodedWords``), words in sentence order."""
    n_words = sum(encoded.words)
    start_of = np.concatenate([[0], np.cumsum(encoded.words)[:-1]])
    out = None
    order = sorted(range(len(encoded)), key=lambda i: len(encoded.ids[i]))
    for k in range(0, len(order), batch_size):
        idx = order[k : k + batch_size]
        batch = collate_words([(i, encoded.ids[i], encoded.labels[i]) for i in idx], pad_id=pad_id)
        layers = encoder(
            batch["input_ids"].to(device), None, batch["attention_mask"].to(device), all_layers=True
        ).layers
        stacked = torch.stack(layers, dim=2).float().cpu()  # (batch, seq, layers, hidden)
        if out is None:
            out = np.zeros((n_words, stacked.shape[2], stacked.shape[3]), dtype=np.float16)
        for row, i in enumerate(idx):
            first = start_of[encoded.sentence[i]] + encoded.offset[i]
            out[first : first + len(encoded.firsts[i])] = stacked[row, encoded.firsts[i]].numpy()
    if out is None:
        raise ValueError("no sentences to extract features from")
    return out


@torch.no_grad()
def sentence_features(
    encoder: Encoder, ids: list[np.ndarray], special: set[int], batch_size: int, device: torch.device
) -> np.ndarray:
    """(sentences, layers + 1, hidden) float16: the mean of every layer's output over each
    sentence's tokens ([CLS], [SEP] and padding left out)."""
    out = None
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    special_ids = torch.tensor(sorted(special))
    for k in range(0, len(order), batch_size):
        idx = order[k : k + batch_size]
        width = max(len(ids[i]) for i in idx)
        x = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            x[row, : len(ids[i])] = torch.from_numpy(np.asarray(ids[i]))
        real = torch.zeros_like(x, dtype=torch.bool)
        for row, i in enumerate(idx):
            real[row, : len(ids[i])] = True
        layers = encoder(x.to(device), None, real.to(device), all_layers=True).layers
        keep = (real & ~torch.isin(x, special_ids)).float()
        keep = torch.where(keep.sum(1, keepdim=True) > 0, keep, real.float())  # a sentence of specials only
        stacked = torch.stack(layers, dim=1).float().cpu()  # (batch, layers, seq, hidden)
        mean = (stacked * keep[:, None, :, None]).sum(2) / keep.sum(1)[:, None, None]
        if out is None:
            out = np.zeros((len(ids), mean.shape[1], mean.shape[2]), dtype=np.float16)
        out[idx] = mean.numpy()
    if out is None:
        raise ValueError("no sentences to extract features from")
    return out


def cached(cache_dir: str | Path, key: dict, compute) -> dict[str, np.ndarray]:
    """``compute()`` (a dict of arrays), stored once in ``<cache_dir>/probe-features/<hash of key>.npz``."""
    path = (
        Path(os.path.expanduser(str(cache_dir)))
        / "probe-features"
        / f"{fingerprint({**key, 'v': FEATURES_VERSION})}.npz"
    )
    if path.is_file():
        with np.load(path) as f:
            return {k: f[k] for k in f.files}
    arrays = compute()
    atomic.write_with(path, lambda f: np.savez(f, **arrays))
    return arrays


# --- probes -----------------------------------------------------------------------------------------------
class Probe(nn.Module):
    """A linear classifier on features (batch, layers, hidden): of one layer, of several
    concatenated, or of their scalar mix (softmax weights over layers, times a scale)."""

    def __init__(self, layers: list[int], hidden: int, classes: int, mix: bool = False):
        super().__init__()
        self.layers, self.mix = layers, mix
        self.weights = nn.Parameter(torch.zeros(len(layers))) if mix else None
        self.scale = nn.Parameter(torch.ones(())) if mix else None
        self.linear = nn.Linear(hidden if mix else hidden * len(layers), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, self.layers]
        if self.weights is not None and self.scale is not None:  # mix
            x = self.scale * (torch.softmax(self.weights, 0)[None, :, None] * x).sum(1)
        else:
            x = x.flatten(1)
        return self.linear(x)


def fit_probe(
    probe: Probe,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    lr: float,
    batch_size: int,
    weight_decay: float,
    seed: int,
) -> Probe:
    """Fit one probe: AdamW on shuffled mini-batches (the order seeded by ``seed``), the learning rate
    decaying linearly to 0 over the run."""
    return fit_probes({"probe": probe}, x, y, epochs, lr, batch_size, weight_decay, seed)["probe"]


def fit_probes(
    probes: dict[str, Probe],
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    lr: float,
    batch_size: int,
    weight_decay: float,
    seed: int,
) -> dict[str, Probe]:
    """Fit several probes on the same features at once: each as ``fit_probe`` fits it alone (its own
    initial weights, the same seeded batch order, its own loss, AdamW state and schedule), in one step
    for all of them. The single-layer probes' linear layers are stacked into one batched matmul, and
    one backward pass and one optimizer step serve every probe, so a step launches a few dozen kernels
    instead of a few dozen per probe: on a GPU shared by an evaluation per encoder, the probes of one
    seed took 40 s fitted one by one. The fitted weights are written back into ``probes``.

    The scalar mix's two scalars get a larger step (``MIX_LR_SCALE``): with the linear layer's, they
    barely leave the uniform mix in the few epochs a probe trains, and a mix that stays an average is
    worse than its best layer."""
    names = list(probes)
    single = [n for n in names if len(probes[n].layers) == 1 and not probes[n].mix]
    rest = [n for n in names if n not in single]
    weight = nn.Parameter(torch.stack([probes[n].linear.weight.detach() for n in single])) if single else None
    bias = nn.Parameter(torch.stack([probes[n].linear.bias.detach() for n in single])) if single else None
    layers = [probes[n].layers[0] for n in single]
    every_layer = layers == list(range(x.shape[1]))  # layer_0 ... layer_L in order: no gather needed
    index = torch.tensor(layers, device=x.device)
    linear = [p for p in (weight, bias) if p is not None] + [p for n in rest for p in probes[n].linear.parameters()]
    scalars = [p for n in rest for p in (probes[n].weights, probes[n].scale) if p is not None]
    groups = [{"params": linear}] + (
        [{"params": scalars, "lr": lr * MIX_LR_SCALE, "weight_decay": 0.0}] if scalars else []
    )
    opt = torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
    steps = epochs * -(-len(x) // batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / max(1, steps))
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).to(x.device).split(batch_size):
            xb = x[idx]
            logits = [probes[n](xb) for n in rest]
            if weight is not None and bias is not None:
                xs = xb if every_layer else xb[:, index]
                logits.insert(0, torch.einsum("blh,lch->blc", xs, weight) + bias)
            joined = torch.cat([z if z.dim() == 3 else z[:, None] for z in logits], 1)  # (batch, probes, classes)
            # the sum of each probe's mean loss: each probe's gradient is the one it gets alone
            loss = F.cross_entropy(joined.flatten(0, 1), y[idx].repeat_interleave(len(names))) * len(names)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            schedule.step()
    with torch.no_grad():
        for k, n in enumerate(single):
            assert weight is not None and bias is not None  # stacked whenever there is a single-layer probe
            probes[n].linear.weight.copy_(weight[k])
            probes[n].linear.bias.copy_(bias[k])
    return probes


@torch.no_grad()
def predict(probe: Probe, x: torch.Tensor, batch_size: int = 8192) -> np.ndarray:
    return torch.cat([probe(x[k : k + batch_size]).argmax(-1) for k in range(0, len(x), batch_size)]).cpu().numpy()


def probe_all(
    train_x: np.ndarray,
    train_y: np.ndarray,
    dev_x: np.ndarray,
    classes: int,
    score,
    recipe,
    seed: int,
    device: torch.device | str = "cpu",
) -> dict:
    """Fit the probes of every layer, the last four and the scalar mix on ``device`` (where the
    features were computed: fitted on one CPU thread, they took half of an encoder's evaluation in a
    GPU slot) with ``recipe``'s ``epochs``, ``lr``, ``batch_size`` and ``weight_decay``;
    ``score(predictions)`` of each on the dev features. Returns {"probes": {name: score},
    "mix_weights": [...]}."""
    mean = train_x.astype(np.float32).mean(0, keepdims=True)
    sd = train_x.astype(np.float32).std(0, keepdims=True) + 1e-6
    xt = torch.from_numpy((train_x.astype(np.float32) - mean) / sd).to(device)
    xd = torch.from_numpy((dev_x.astype(np.float32) - mean) / sd).to(device)
    y = torch.from_numpy(train_y.astype(np.int64)).to(device)
    n_layers, hidden = xt.shape[1], xt.shape[2]
    configs = {f"layer_{i}": ([i], False) for i in range(n_layers)}
    configs["last4"] = (list(range(max(0, n_layers - 4), n_layers)), False)
    configs["mix"] = (list(range(n_layers)), True)
    made = {}
    for name, (layers, mix) in configs.items():
        torch.manual_seed(seed)  # each probe's initial weights as if it were fitted alone
        made[name] = Probe(layers, hidden, classes, mix).to(device)
    fitted = fit_probes(made, xt, y, recipe.epochs, recipe.lr, recipe.batch_size, recipe.weight_decay, seed)
    out: dict = {"probes": {}}
    for name, probe in fitted.items():
        out["probes"][name] = score(predict(probe, xd))
        if probe.mix:
            assert probe.weights is not None
            out["mix_weights"] = [round(float(w), 4) for w in torch.softmax(probe.weights.detach().cpu(), 0)]
    return out


# --- the tasks --------------------------------------------------------------------------------------------
@dataclass
class Probed:
    """What a probe task reads for its probes: its labels, how a dev prediction is scored, and the
    features to compute (``compute()``: every layer's, for the train and dev splits)."""

    compute: Callable[[], dict[str, np.ndarray]]
    train_y: np.ndarray
    classes: int
    score: Callable[[np.ndarray], float]
    digests: dict[str, str] | None
    train_examples: int
    eval_examples: int


# --- its place in a comparison ----------------------------------------------------------------------------
def probe_table(results: list[dict], rows: dict[str, str], encoder_id) -> dict:
    """{task: {row: {"probes": {name: mean score x 100}, "mix_weights": [...], "runs": n}}}."""
    acc: dict = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.get("probes"):
            acc[r["task"]][rows[encoder_id(r)]].append(r)
    out: dict = {}
    for task, by_row in sorted(acc.items()):
        out[task] = {}
        for row, rs in sorted(by_row.items()):
            names = list(rs[0]["probes"])
            weights = [r["mix_weights"] for r in rs if r.get("mix_weights")]
            out[task][row] = {
                "probes": {n: 100.0 * float(np.mean([r["probes"][n] for r in rs])) for n in names},
                "mix_weights": [float(w) for w in np.mean(weights, axis=0)] if weights else None,
                "runs": len(rs),
            }
    return out


def probe_markdown(table: dict) -> str:
    """Per probe task: rows down, probes across (each layer, the last four, the scalar mix)."""
    parts = []
    for task, by_row in table.items():
        names = list(next(iter(by_row.values()))["probes"])
        lines = [
            f"{get(task).display}: frozen-feature probes (dev score x 100, mean over encoders and seeds; "
            f"layer 0 = embeddings; the task's score is last4)",
            "",
            "| encoder | " + " | ".join(n.replace("layer_", "L") for n in names) + " | mix weights |",
            "|" + "---|" * (len(names) + 2),
        ]
        for row, t in by_row.items():
            weights = " ".join(f"{w:.2f}" for w in t["mix_weights"]) if t["mix_weights"] else "–"
            lines.append(f"| {row} | " + " | ".join(f"{t['probes'][n]:.1f}" for n in names) + f" | {weights} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def plot_probes(table: dict, path: Path) -> Path:
    """One panel per probe task: each row's score by layer (a line), the last four and the mix as markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(table), figsize=(6.0 * len(table), 4.2), squeeze=False)
    for ax, (task, by_row) in zip(axes[0], table.items()):
        for row, t in by_row.items():
            layers = [(int(n.split("_")[1]), v) for n, v in t["probes"].items() if n.startswith("layer_")]
            x, y = zip(*sorted(layers))
            (line,) = ax.plot(x, y, marker="o", label=row)
            top = max(x) + 1
            ax.scatter([top], [t["probes"]["last4"]], marker="s", color=line.get_color())
            ax.scatter([top + 1], [t["probes"]["mix"]], marker="^", color=line.get_color())
        ticks = sorted({int(n.split("_")[1]) for t in by_row.values() for n in t["probes"] if n.startswith("layer_")})
        ax.set_xticks([*ticks, ticks[-1] + 1, ticks[-1] + 2], [*map(str, ticks), "last4", "mix"])
        ax.set_xlabel("layer (0 = embeddings)")
        ax.set_ylabel("dev score (x 100)")
        ax.set_title(f"{get(task).display}: linear probes on frozen features")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return figures.save(fig, path)


class Probing(Trained):
    """Linear probes on the frozen encoder's layers (see the module docstring): the features are
    computed once and cached, the probes fitted with the recipe (``lr``, ``batch_size`` in examples,
    ``epochs``, ``weight_decay``) on the first ``max_train_examples`` training examples. The score is the
    last four layers'. A probe task says what it reads (:meth:`probed`)."""

    fine_tuned = False
    rank = 90
    metric: ClassVar[str]

    def __init__(self, name: str, max_train_examples: int | None = None, **recipe: Any):
        super().__init__(name, **recipe)
        self.max_train_examples = max_train_examples

    @property
    def metrics(self) -> tuple[str, ...]:
        return (self.metric,)

    @property
    def group(self) -> str:
        return "probes"

    def probed(self, run: RunContext, model, encoder: Encoder, device: torch.device) -> Probed:
        raise NotImplementedError

    def evaluate(self, run: RunContext, model, fitting) -> dict:
        """Features (cached), probes, the results' fields."""
        t0 = time.time()
        device = run.inference_device()
        encoder = model.encoder.to(device).eval()
        identity = {  # everything the features depend on: the weights, the tokenizer (the same weights read other
            # ids with another one), the task, its data and settings
            "encoder": model.source.get("encoder_id"),
            "tokenizer": fingerprint({"tokenizer": model.tokenizer.to_str()}),
            "init": run.init,
            "seed": run.seed if run.init == "scratch" else None,
            "task": self.name,
            "max_seq_len": self.max_seq_len,
            "max_train": self.max_train_examples,
        }
        probed = self.probed(run, model, encoder, device)
        features = cached(self.data.cache_dir, {**identity, "data": probed.digests or self.data.source}, probed.compute)
        t1 = time.time()
        out = probe_all(
            features["train"],
            probed.train_y,
            features["validation"],
            probed.classes,
            probed.score,
            self,
            run.seed,
            device,
        )
        log.info(
            "%s: features %s in %.1fs, %d probes fitted in %.1fs; %s",
            self.name,
            "x".join(map(str, features["train"].shape)),
            t1 - t0,
            len(out["probes"]),
            time.time() - t1,
            ", ".join(f"{k} {v:.3f}" for k, v in out["probes"].items()),
        )
        return {
            "metrics": {self.metric: out["probes"]["last4"]},
            **out,
            "train_examples": probed.train_examples,
            "eval_examples": {"validation": probed.eval_examples},
            "data": {"source": self.data.source, "files": probed.digests},
        }

    def contradictions(self, result: dict) -> list[str]:
        last4 = (result.get("probes") or {}).get("last4")
        if last4 is None:
            return []
        return [
            f"{k} {v!r} where its probe of the last four layers scored {last4!r}"
            for k, v in result["metrics"].items()
            if abs(float(v) - float(last4)) > 1e-9
        ]

    @classmethod
    def sections(cls, results, rows, encoder_id, level) -> list[Section]:
        table = probe_table(results, rows, encoder_id)
        if not table:
            return []
        markdown = probe_markdown(table)
        return [Section("probes", table, markdown, markdown, lambda path: plot_probes(table, path))]


class NerProbe(Probing):
    """``task=probe_ner``: CoNLL-2003's entities (``ner:``), from each word's first sub-word's features;
    entity F1."""

    data_block = "ner"
    metric = "f1"

    @property
    def display(self) -> str:
        return "NER probe"

    def data_files(self) -> list[Path] | None:
        root = conll.data_root(self.data)
        return None if root is None else list(conll.split_files(root).values())

    def probed(self, run: RunContext, model, encoder: Encoder, device: torch.device) -> Probed:
        splits, digests = conll.load(self.data, self.max_train_examples)
        labels = label_set(splits["train"])
        label_ids = {label: i for i, label in enumerate(labels)}
        train_y = np.asarray([label_ids[t] for _, tags in splits["train"] for t in conll.to_iob2(tags)])
        gold = [tags for _, tags in splits["validation"]]

        def compute() -> dict[str, np.ndarray]:
            with run.inference_autocast(device):
                return {
                    split: word_features(
                        encoder,
                        encode_words(splits[split], model.tokenizer, model.tokens, self.max_seq_len),
                        model.tokens.pad_id,
                        FEATURE_BATCH,
                        device,
                    )
                    for split in ("train", "validation")
                }

        def score(pred: np.ndarray) -> float:
            tags, k = [], 0
            for words, _ in splits["validation"]:
                tags.append([labels[int(p)] for p in pred[k : k + len(words)]])
                k += len(words)
            return conll.scores(gold, tags)["f1"]

        return Probed(compute, train_y, len(labels), score, digests, len(splits["train"]), len(gold))


class SentenceProbe(Probing):
    """``task=probe_<glue task>`` (``probe_sst2``): a GLUE task's sentences (``glue:``), from the mean of
    each layer's token features; accuracy."""

    data_block = "glue"
    metric = "accuracy"

    def __init__(self, name: str, **recipe):
        super().__init__(name, **recipe)
        self.spec = get_task(name.removeprefix("probe_"))

    @property
    def display(self) -> str:
        return f"{self.spec.directory} probe"

    def data_files(self) -> list[Path] | None:
        root = glue_root(self.data)
        return None if root is None else task_files(self.spec, root)

    def file_key(self, path: Path) -> str:
        return f"{path.parent.name}/{path.name}"

    def probed(self, run: RunContext, model, encoder: Encoder, device: torch.device) -> Probed:
        splits = load_task(self.spec, self.data)
        train = splits["train"].head(self.max_train_examples)
        dev = splits["validation"].head(self.data.max_eval_examples)
        dev_y = np.asarray(dev.labels)
        special = set(model.tokens.special_ids)

        def compute() -> dict[str, np.ndarray]:
            with run.inference_autocast(device):
                return {
                    name: sentence_features(
                        encoder,
                        encode(split, model.tokenizer, model.tokens, self.max_seq_len).ids,
                        special,
                        FEATURE_BATCH,
                        device,
                    )
                    for name, split in (("train", train), ("validation", dev))
                }

        def score(pred: np.ndarray) -> float:
            return accuracy(pred, dev_y)

        return Probed(
            compute, np.asarray(train.labels), self.spec.num_labels, score, self.digests(), len(train), len(dev)
        )


__all__ = [
    "NerProbe",
    "Probe",
    "Probed",
    "Probing",
    "SentenceProbe",
    "cached",
    "fit_probe",
    "fit_probes",
    "plot_probes",
    "predict",
    "probe_markdown",
    "probe_table",
    "probe_all",
    "sentence_features",
    "word_features",
]

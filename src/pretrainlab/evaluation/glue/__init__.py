"""GLUE's tasks as evaluations: a classifier on the pooled ``[CLS]`` output, fine-tuned with the
encoder (``conf/task/<task>.yaml``: ``_target_: pretrainlab.evaluation.glue.GlueTask``).

The tasks' files, columns and metrics are this package's modules: ``tasks.py`` (what each task is),
``data.py`` (readers of the hub, a local ``download_glue_data.py`` directory or the synthetic suite, and
the encoding), ``metrics.py`` and ``synthetic.py`` (the offline suite). Classification trains with
cross-entropy, STS-B (one output) with mean squared error. The dev sets are scored after every epoch
with the task's metrics over the *whole* dev set (predictions gathered across ranks and de-duplicated
by example index). A result's trivial baseline (``no_skill``) is the majority class (the training
mean for STS-B) scored the same way.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pretrainlab.evaluation.base import FineTuned, RunContext
from pretrainlab.evaluation.finetuning import Fitting, Job, Trainable
from pretrainlab.evaluation.glue.data import (
    EncodedDataset,
    EncodedSplit,
    LengthGroupedSampler,
    collate,
    encode,
    eval_loader,
    glue_root,
    load_task,
    task_files,
)
from pretrainlab.evaluation.glue.metrics import compute, no_skill
from pretrainlab.evaluation.glue.tasks import TASKS, TaskSpec, get_task
from pretrainlab.model.encoder import Encoder, EncoderCall, EncoderOutput
from pretrainlab.optim import OptimConfig
from pretrainlab.runtime.signals import worker_init

log = logging.getLogger("pretrainlab")


class Classifier(Trainable):
    """A classifier on the pooled ``[CLS]`` output for one GLUE task."""

    def __init__(
        self,
        encoder: Encoder,
        spec: TaskSpec,
        optim: OptimConfig,
        total_steps: int,
        classifier_dropout: float = 0.1,
        eval_splits: list[str] | None = None,
        compile: dict | None = None,
    ):
        super().__init__(encoder, optim, total_steps, compile)
        h = encoder.config.hidden_size
        # encoders exported without a pooler (add_pooler=false) get a fresh one: dense + tanh on [CLS]
        self.pooler = None if encoder.pooler is not None else nn.Linear(h, h)
        self.dropout = nn.Dropout(classifier_dropout)
        self.classifier = nn.Linear(h, spec.num_labels)
        for layer in [self.classifier] + ([self.pooler] if self.pooler is not None else []):
            nn.init.normal_(layer.weight, std=encoder.config.initializer_range)
            nn.init.zeros_(layer.bias)
        self.spec = spec
        self.eval_splits = eval_splits or list(spec.eval_splits)

    def logits(self, batch: dict) -> torch.Tensor:
        return self.head(self.encoder_call(batch)(self.encoder))

    def encoder_call(self, batch: dict) -> EncoderCall:
        """The encoder call a batch's logits start from (several runs' calls are made as one in
        ``evaluation.fused``)."""
        return EncoderCall(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])

    def head(self, out: EncoderOutput) -> torch.Tensor:
        """The logits from the encoder's output: the pooled ``[CLS]``, dropout, the classifier."""
        pooled = out.pooled if self.pooler is None else torch.tanh(self.pooler(out.hidden_states[:, 0]))
        logits = self.classifier(self.dropout(pooled)).float()
        return logits.squeeze(-1) if self.spec.is_regression else logits

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.spec.is_regression:
            return F.mse_loss(logits, labels.float())
        return F.cross_entropy(logits, labels)

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.record(batch, self(batch), dataloader_idx)

    def record(self, batch: dict, logits: torch.Tensor, dataloader_idx: int = 0) -> None:
        """Keep a dev batch's predictions for :meth:`evaluate`."""
        pred = logits if self.spec.is_regression else logits.argmax(-1)
        self._outputs.setdefault(dataloader_idx, []).append(
            (batch["index"], pred.detach().float(), batch["labels"].float())
        )

    def evaluate(self, outputs: dict[int, list]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for i, split in enumerate(self.eval_splits):
            outs = outputs.get(i, [])
            if not outs:
                continue
            index = torch.cat([o[0] for o in outs])
            pred = torch.cat([o[1] for o in outs])
            label = torch.cat([o[2] for o in outs])
            if self.world_size() > 1:  # every rank scores the whole dev set
                index, pred, label = (self._all_gather(x).flatten(0, 1) for x in (index, pred, label))
            _, first = np.unique(index.cpu().numpy(), return_index=True)  # a distributed sampler repeats a few
            predicted, gold = pred.cpu().numpy()[first], label.cpu().numpy()[first]
            if not self.spec.is_regression:
                predicted, gold = predicted.astype(np.int64), gold.astype(np.int64)
            suffix = self.spec.eval_splits[split][1]
            for name, value in compute(list(self.spec.metrics), predicted, gold).items():
                metrics[f"{name}{suffix}"] = value
        return metrics


def glue_examples(task: GlueTask, model) -> tuple[EncodedSplit, dict[str, EncodedSplit]]:
    """``task``'s training examples and each of its dev splits (by name), read and tokenized as
    fine-tuning trains and evaluates on them: ``glue.max_train_examples`` / ``max_eval_examples``,
    ``task.max_seq_len``, ``model``'s tokenizer and special tokens."""
    data = task.data
    splits = load_task(task.spec, data)

    def encoded(name: str, limit: int | None) -> EncodedSplit:
        return encode(splits[name].head(limit), model.tokenizer, model.tokens, task.max_seq_len)

    return encoded("train", data.max_train_examples), {
        name: encoded(name, data.max_eval_examples) for name in task.spec.eval_splits
    }


class GlueTask(FineTuned):
    """One of GLUE's nine tasks (``name``: cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli)."""

    family = "glue"
    data_block = "glue"
    rank = 0
    fusable = True

    def __init__(self, name: str, **recipe):
        super().__init__(name, **recipe)
        self.spec = get_task(name)

    @property
    def display(self) -> str:
        return self.spec.directory

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(self.spec.metric_names())

    @property
    def group(self) -> str:
        return "glue"

    @property
    def in_glue_score(self) -> bool:  # type: ignore[override]
        return self.name != "wnli"  # WNLI is left out, as BERT left it out

    def order(self) -> tuple:
        return (self.rank, list(TASKS).index(self.name))

    def data_files(self) -> list[Path] | None:
        root = glue_root(self.data)
        if root is None:
            return None
        files = task_files(self.spec, root)
        if files and len(files) < len(self.spec.files):  # none at all: the caller names the folder
            missing = [n for n in self.spec.files if root / self.spec.directory / n not in files]
            raise FileNotFoundError(
                f"{root / self.spec.directory} lacks {', '.join(missing)}: {self.spec.name} reads "
                f"{', '.join(self.spec.files)} (GLUE's download_glue_data.py layout)"
            )
        return files

    def file_key(self, path: Path) -> str:
        return f"{path.parent.name}/{path.name}"

    def evaluate(self, run: RunContext, model, fitting: Fitting) -> dict:
        return fitting.fit(self.job(run, model, fitting))

    def job(self, run: RunContext, model, fitting: Fitting) -> Job:
        """The fine-tuning of ``model`` on this task, ready to train: its classifier (initialised from
        the global seed), its data loaders (shuffled by ``run.seed``) and the fields its results add."""
        spec = self.spec
        t0 = time.time()
        digests = self.digests()
        encoded_train, evals = glue_examples(self, model)
        eval_names, encoded_eval = list(evals), list(evals.values())
        log.info(
            "%s: %d train, %s dev examples (%d truncated to %d tokens), loaded in %.1fs",
            spec.name,
            len(encoded_train),
            "/".join(str(len(e)) for e in encoded_eval),
            encoded_train.truncated,
            self.max_seq_len,
            time.time() - t0,
        )
        devices = fitting.devices
        pad = model.tokens.pad_id
        gen = torch.Generator().manual_seed(run.seed)
        multiple = 8 if devices.compile else 1  # compiled: lengths in steps of 8, fewer shapes to compile for
        order = (
            dict(sampler=LengthGroupedSampler([len(x) for x in encoded_train.ids], self.batch_size, gen))
            if self.data.options.get("group_by_length")
            else dict(shuffle=True, generator=gen)
        )
        train_loader = torch.utils.data.DataLoader(
            EncodedDataset(encoded_train),
            batch_size=devices.micro_batch,
            drop_last=False,
            collate_fn=functools.partial(collate, pad_id=pad, multiple=multiple),
            num_workers=run.num_workers,
            worker_init_fn=worker_init,
            **order,
        )
        eval_loaders = [eval_loader(e, devices.micro_batch * 2, pad, run.num_workers, multiple) for e in encoded_eval]
        steps_per_epoch, total = fitting.steps(len(encoded_train))
        module = Classifier(
            model.encoder,
            spec,
            fitting.optim,
            total,
            self.classifier_dropout,
            eval_names,
            compile=devices.compile,
        )
        return Job(
            module,
            train_loader,
            eval_loaders,
            steps_per_epoch,
            {s: len(e) for s, e in zip(eval_names, encoded_eval)},
            {
                "train_examples": len(encoded_train),
                "no_skill": {
                    f"{m}{suffix}": v
                    for (_, suffix), e in zip(spec.eval_splits.values(), encoded_eval)
                    for m, v in no_skill(list(spec.metrics), encoded_train.labels, e.labels, spec.is_regression).items()
                },
                "data": {"source": self.data.source, "files": digests},
            },
        )


__all__ = ["Classifier", "GlueTask", "glue_examples"]

"""Fine-tuning runs of one task trained at once, as one batched model (``fuse_seeds`` in a suite,
``fuse_finetuning`` in a study).

A GLUE fine-tuning of a ``model=mini`` encoder is a few hundred steps of 32 sequences: on a GPU each
step is a few hundred kernels too small to fill it, and the time goes to launching them. The runs of
one task (its fine-tuning seeds, on one encoder or on several of one shape) can instead train as one
model: their encoders stacked (``model.stacked.StackedEncoder``: every linear layer one batched
matmul), each run's head on its own rows, each run stepped by its own AdamW, clipped to its own
gradient norm (``pretraining.fused.GroupAdamW``). Each run keeps everything that makes it that run:

    its data       its own loaders, shuffled by its own seed, as the run alone shuffles them; a step
                   takes one batch of every run, padded to the longest (padded keys are masked out)
    its head       the classifier the run alone builds, initialised from its own seed
    its dropout    the classifier's dropout draws from the run's own random stream (the global
                   generators' states, swapped in around the run's part of the step and around its dev
                   loaders' iterators, which draw a seed there), so its masks are the run alone's
    its results    its own results file, run directory and logger (the metrics it logged, replayed
                   into its own W&B or CSV run after the group has trained)

so that each run's losses, dev metrics and results are those of the run alone, up to float rounding
(``tests/test_fused.py``). What cannot be made so is refused by :func:`refusal` (the caller then trains
the runs one by one and says why): dropout inside the encoder (its masks would be drawn over the
group's padded batch, not the run's), several processes (DDP), ``torch.compile``, float16.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pretrainlab.evaluation.finetuning import Fitting, Job
from pretrainlab.model.encoder import Encoder
from pretrainlab.model.stacked import StackedEncoder
from pretrainlab.optim import lr_lambda
from pretrainlab.pretraining.fused import GroupAdamW

log = logging.getLogger("pretrainlab")


def refusal(fittings: Sequence[Fitting], encoders: Sequence[Encoder]) -> str | None:
    """Why these runs cannot be trained as one (None: they can)."""
    if len(fittings) < 2:
        return "there is only one run"
    first = fittings[0]
    for f in fittings:
        if f.devices.world > 1:
            return f"the runs train on {f.devices.world} processes (DDP): a fused group trains in one"
        if f.devices.compile is not None:
            return "the runs are compiled (compile=true): a fused group trains eagerly; set compile=false"
        if f.precision not in ("32-true", "32", "bf16-mixed"):
            return f"trainer.precision={f.precision}: a fused group trains in 32-true or bf16-mixed"
        if f.devices.accumulate != 1:
            return "the runs accumulate gradients (device_batch_size): a fused group steps every batch"
        if (f.on_cuda, f.precision) != (first.on_cuda, first.precision):
            return "the runs train on different devices or precisions"
        if (f.recipe.epochs, f.recipe.batch_size) != (first.recipe.epochs, first.recipe.batch_size):
            return "the runs have different epochs or batch sizes"
        o, p = f.optim, first.optim
        if (o.weight_decay, o.betas, o.eps, o.grad_clip, o.warmup, o.min_lr_ratio) != (
            p.weight_decay,
            p.betas,
            p.eps,
            p.grad_clip,
            p.warmup,
            p.min_lr_ratio,
        ):
            return "the runs' optimizer settings differ beyond the learning rate"
    for encoder in encoders:
        c = encoder.config
        if c.hidden_dropout or c.attention_dropout:
            return (
                f"the encoder has dropout (model.hidden_dropout={c.hidden_dropout}, attention_dropout="
                f"{c.attention_dropout}): its masks in a fused group would not be the run alone's"
            )
        if c.share_layers or encoder.embeddings is None:
            return "the encoder shares its layers (ALBERT's) or borrows its embeddings"
        if c.to_dict() != encoders[0].config.to_dict():
            return "the encoders have different shapes"
    return None


class Streams:
    """Each run's random stream: the global generators' states, swapped in for the run's draws."""

    def __init__(self, runs: int, cuda: bool):
        self.cuda = cuda
        self.states: list[tuple[torch.Tensor, torch.Tensor | None]] = [self._now() for _ in range(runs)]

    def _now(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return torch.get_rng_state(), torch.cuda.get_rng_state() if self.cuda else None

    def _set(self, state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1])

    def capture(self, m: int) -> None:
        """Run ``m``'s stream continues from the global generators' state now."""
        self.states[m] = self._now()

    @contextlib.contextmanager
    def of(self, m: int) -> Iterator[None]:
        outside = self._now()
        self._set(self.states[m])
        try:
            yield
        finally:
            self.states[m] = self._now()
            self._set(outside)


def _heads(jobs: Sequence[Job]) -> nn.ModuleList:
    """Every run's trained parameters outside its encoder (its pooler, its classifier), one entry per
    run, as :class:`GroupAdamW` reads a group's objectives."""
    return nn.ModuleList(
        nn.ParameterList(
            [p for name, p in job.module.named_parameters() if not name.startswith("encoder.") and p.requires_grad]
        )
        for job in jobs
    )


@dataclass
class _Group:
    """What :class:`GroupAdamW` reads of a group: the stacked encoder and each run's head parameters."""

    stacked: StackedEncoder
    objectives: nn.ModuleList

    @property
    def runs(self) -> int:
        return self.stacked.runs


def _pad(batches: list[dict]) -> list[dict]:
    """Every batch as long as the longest (padding masked out, as a batch's own padding is)."""
    n = max(b["input_ids"].shape[1] for b in batches)
    out = []
    for b in batches:
        extra = n - b["input_ids"].shape[1]
        if extra:
            b = dict(b)
            for key in ("input_ids", "token_type_ids", "attention_mask"):
                x = b[key]
                b[key] = torch.cat([x, x.new_zeros(x.shape[0], extra)], dim=1)
        out.append(b)
    return out


def _fusable(job: Job) -> Any:
    """The job's module, which names its encoder call and its head (``evaluation.glue.Classifier``)."""
    return job.module


def _to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


@dataclass
class Trained:
    """What one run of a fused group brings back: its results' shared fields (``Fitting.outcome``) and
    the metrics it logged, by step, for its logger."""

    fields: dict
    logged: list[tuple[int, dict]]


def fit_fused(fittings: Sequence[Fitting], jobs: Sequence[Job], streams: Streams) -> list[Trained]:
    """Train ``jobs`` (one per run, each built as the run alone builds it) as one model for their
    recipe's epochs, evaluating every run's dev sets after each; each run's outcome. ``streams``: each
    run's random stream, captured where the run alone would start training."""
    first = fittings[0]
    runs = len(jobs)
    device = torch.device("cuda") if first.on_cuda else torch.device("cpu")
    bf16 = first.precision == "bf16-mixed"
    epochs = int(first.recipe.epochs)
    per_epoch = {job.steps_per_epoch for job in jobs}
    if len(per_epoch) != 1:
        raise ValueError(f"the runs of a fused group take different numbers of steps per epoch: {sorted(per_epoch)}")
    steps_per_epoch = per_epoch.pop()
    total = steps_per_epoch * epochs
    for job in jobs:
        job.module.to(device)
    stacked = StackedEncoder([job.module.encoder for job in jobs]).to(device)
    group = _Group(stacked, _heads(jobs))
    optim = first.optim
    opt = GroupAdamW(group, optim)  # type: ignore[arg-type]
    warmup = optim.warmup_steps(total)
    base = [f.optim.lr for f in fittings]
    interval = min(first.log_every, steps_per_epoch)
    logged: list[list[tuple[int, dict]]] = [[] for _ in range(runs)]
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    )  # Lightning's bf16-mixed: the forward under autocast, the backward and the step outside
    progress = None
    if first.progress_bar:
        from tqdm.auto import tqdm

        progress = tqdm(total=total, desc=f"{first.name}: {runs} runs fused", unit="step")
    for job in jobs:
        job.module.nonfinite.start(0)
    step = 0
    for epoch in range(epochs):
        stacked.train()
        for job in jobs:
            job.module.train()
        loaders = []
        for m, job in enumerate(jobs):
            with streams.of(m):  # (shuffled by a generator of its own; a sampler without one draws here)
                loaders.append(iter(job.train_loader))
        for _ in range(steps_per_epoch):
            batches = _pad([_to(next(it), device) for it in loaders])
            with autocast:
                outs = stacked([_fusable(job).encoder_call(b) for job, b in zip(jobs, batches, strict=True)])
            losses = []
            for m, (job, batch, out) in enumerate(zip(jobs, batches, outs, strict=True)):
                with streams.of(m), autocast:
                    losses.append(job.module.loss(_fusable(job).head(out), batch["labels"]))
            torch.stack(losses).sum().backward()
            lrs = [lr * lr_lambda(step, warmup, total, optim.min_lr_ratio) for lr in base]
            opt.step(lrs)
            opt.zero_grad()
            for job, loss in zip(jobs, losses, strict=True):
                job.module.nonfinite.record(loss)
                job.module.nonfinite.advance()
            step += 1
            if step % interval == 0:
                values = torch.stack([loss.detach().float() for loss in losses]).tolist()
                for m, job in enumerate(jobs):
                    job.module._check_finite()
                    logged[m].append((step - 1, {"train/loss": values[m], "train/lr": lrs[m], "epoch": epoch}))
                if progress is not None:
                    progress.set_postfix(loss=f"{sum(values) / runs:.4f}")
            if progress is not None:
                progress.update()
        _evaluate(jobs, stacked, streams, device, autocast)
        for m, job in enumerate(jobs):
            metrics = job.module.evaluate(job.module._outputs) if job.module._outputs else {}
            if metrics:
                job.module.history.append({"epoch": epoch + 1, "step": step, "metrics": metrics})
                # at the step Lightning logs a run's validation at: its last training step's
                logged[m].append((step - 1, {f"val/{k}": v for k, v in metrics.items()} | {"epoch": epoch}))
    if progress is not None:
        progress.close()
    return [
        Trained(fitting.outcome(job, step), rows) for fitting, job, rows in zip(fittings, jobs, logged, strict=True)
    ]


@torch.no_grad()
def _evaluate(jobs: Sequence[Job], stacked: StackedEncoder, streams: Streams, device, autocast) -> None:
    """Every run's dev sets through the group at once; each run's predictions kept for its evaluate."""
    stacked.eval()
    iterators = []
    for m, job in enumerate(jobs):
        job.module.eval()
        job.module._check_finite()
        job.module._outputs = {}
        with streams.of(m):  # a loader's iterator draws its seed from the global generator: the run's stream
            iterators.append([iter(loader) for loader in job.eval_loaders])
    for d in range(len(jobs[0].eval_loaders)):
        for raw in zip(*(its[d] for its in iterators), strict=True):
            batches = _pad([_to(b, device) for b in raw])
            with autocast:
                outs = stacked([_fusable(job).encoder_call(b) for job, b in zip(jobs, batches, strict=True)])
                for job, batch, out in zip(jobs, batches, outs, strict=True):
                    _fusable(job).record(batch, _fusable(job).head(out), d)


def fusable_steps(jobs: Sequence[Job]) -> bool:
    """Whether every run takes the same steps per epoch on batches of the same sizes (one task, one
    training set size)."""
    sizes = {(job.steps_per_epoch, len(job.train_loader.dataset)) for job in jobs}  # type: ignore[arg-type]
    evals = {tuple(len(loader.dataset) for loader in job.eval_loaders) for job in jobs}  # type: ignore[arg-type]
    return len(sizes) == 1 and len(evals) == 1


__all__ = ["Streams", "Trained", "fit_fused", "fusable_steps", "refusal"]

"""Fine-tune a pretrained encoder on a GLUE task with Hugging Face transformers and with pretrainlab,
on the same examples with the same settings: an independent check of a fine-tuning result.

    python experiments/glue_reference.py <run | encoder dir> task=stsb glue.data_dir=<glue_data dir> \\
        glue.max_train_examples=2000 task.lr=2e-4 task.epochs=3 task.batch_size=32 --seeds 0,1,2
    python experiments/glue_reference.py <run> task=sst2 ... --reinit-pooler   # is it in the pooler?

The arguments after the encoder are finetune.py's overrides (conf/finetune.yaml), so both sides read
one composed config. pretrainlab's side is finetune.py's own run (``pretrainlab.evaluation.run``).
The reference is the encoder exported in transformers' format (``pretrainlab.export.hf``) and loaded
as ``AutoModelForSequenceClassification`` (``BertForSequenceClassification`` for a BERT export):
transformers' pooler, dropout, classifier head and loss (mean squared error for STS-B, cross-entropy
otherwise), trained by a plain loop: AdamW with weight decay on matrices only, the task's learning
rate, warm-up and linear decay (``transformers.get_linear_schedule_with_warmup``), gradient clipping,
the task's epochs and batch size, shuffled by the seed, in fp32. Both sides see the same tokenized
examples (pretrainlab's GLUE reader and tokenizer; the exported tokenizer encodes text the same way,
``tests/test_hf.py``) and are scored after the last epoch by ``pretrainlab.evaluation.glue.metrics`` (checked
against scikit-learn and scipy in ``tests/test_glue.py``).

``--reinit-pooler`` re-initialises the reference's pooler (transformers' initialisation) before
fine-tuning: a result that stays is in the encoder's layers, not in what pretraining put in the
pooler. Prints one row per seed and side; ``--out`` keeps both sides' runs and ``results.csv``.
"""

from __future__ import annotations

import csv
import logging
import math
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate

from pretrainlab.evaluation.base import get, of
from pretrainlab.evaluation.glue import GlueTask, glue_examples
from pretrainlab.evaluation.glue.data import EncodedDataset, EncodedSplit, collate
from pretrainlab.evaluation.glue.metrics import compute
from pretrainlab.evaluation.glue.tasks import TaskSpec, get_task
from pretrainlab.evaluation.run import run
from pretrainlab.export.hf import export_hf
from pretrainlab.export.pretrained import load_pretrained
from pretrainlab.optim import OptimConfig
from pretrainlab.runtime.hydra import compose
from pretrainlab.tools.cli import output_dir, reference_parser


def reinitialise_pooler(hf, name: str = "this model") -> None:
    """Draw the pooler's weights afresh as transformers initialises a linear layer (normal with the
    config's ``initializer_range``, zero bias). transformers' own ``_init_weights`` would leave a module
    it loaded from a checkpoint as it is."""
    pooler = getattr(hf.base_model, "pooler", None)
    layers = [m for m in pooler.modules() if isinstance(m, torch.nn.Linear)] if pooler is not None else []
    if not layers:
        raise SystemExit(f"--reinit-pooler: {name} has no pooler.")
    with torch.no_grad():
        for layer in layers:
            layer.weight.normal_(0.0, hf.config.initializer_range)
            if layer.bias is not None:
                layer.bias.zero_()


@dataclass
class TaskInputs:
    """A task's tokenized examples, as pretrainlab's fine-tuning builds them: read once, used by every seed."""

    spec: TaskSpec
    train: EncodedSplit
    evals: dict[str, EncodedSplit]
    pad_id: int


def task_inputs(cfg) -> TaskInputs:
    model = load_pretrained(cfg.pretrained)  # the tokenizer and special tokens, for the same inputs
    task = of(cfg)
    if not isinstance(task, GlueTask):
        raise SystemExit(f"task={task.name}: the reference fine-tunes GLUE's tasks (conf/task/*.yaml with GlueTask).")
    train, evals = glue_examples(task, model)
    return TaskInputs(task.spec, train, evals, model.tokens.pad_id)


def reference_metrics(
    cfg, inputs: TaskInputs, hf_dir: Path, seed: int, reinit_pooler: bool = False
) -> dict[str, float]:
    """transformers' sequence classifier on ``hf_dir`` fine-tuned on ``inputs`` as ``cfg`` says (the
    settings of ``cfg.optim`` and ``cfg.task``, the weight-decay groups and warm-up steps of
    ``OptimConfig``); its dev metrics after the last epoch, named as pretrainlab's results name them."""
    import transformers

    spec, train = inputs.spec, inputs.train
    torch.manual_seed(seed)
    config = transformers.AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    dropout_key = "classifier_dropout_prob" if config.model_type == "albert" else "classifier_dropout"
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        hf_dir, num_labels=spec.num_labels, local_files_only=True, **{dropout_key: cfg.task.classifier_dropout}
    )
    if reinit_pooler:
        reinitialise_pooler(hf, f"the {config.model_type} export in {hf_dir}")

    batch_size, epochs = int(cfg.task.batch_size), int(cfg.task.epochs)
    loader = torch.utils.data.DataLoader(
        EncodedDataset(train),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=partial(collate, pad_id=inputs.pad_id),
    )
    optim: OptimConfig = instantiate(cfg.optim)
    params = [p for p in hf.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(optim.param_groups(hf), lr=optim.lr, betas=optim.betas, eps=optim.eps)
    total = math.ceil(len(train) / batch_size) * epochs
    schedule = transformers.get_linear_schedule_with_warmup(opt, optim.warmup_steps(total), total)
    clip = optim.grad_clip
    hf.train()
    for _ in range(epochs):
        for batch in loader:
            labels = batch["labels"].float() if spec.is_regression else batch["labels"].long()
            out = hf(
                input_ids=batch["input_ids"],
                token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"].long(),
                labels=labels,
            )
            out.loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(params, float(clip))
            opt.step()
            schedule.step()
            opt.zero_grad(set_to_none=True)

    hf.eval()
    metrics: dict[str, float] = {}
    for name, split in inputs.evals.items():
        predictions = []
        eval_loader = torch.utils.data.DataLoader(
            EncodedDataset(split), batch_size=2 * batch_size, collate_fn=partial(collate, pad_id=inputs.pad_id)
        )
        with torch.no_grad():
            for batch in eval_loader:
                logits = hf(
                    input_ids=batch["input_ids"],
                    token_type_ids=batch["token_type_ids"],
                    attention_mask=batch["attention_mask"].long(),
                ).logits
                predictions.append(logits[:, 0] if spec.is_regression else logits.argmax(-1))
        pred = torch.cat(predictions).numpy()
        suffix = spec.eval_splits[name][1]
        metrics.update(
            {f"{k}{suffix}": v for k, v in compute(list(spec.metrics), pred, np.asarray(split.labels)).items()}
        )
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = reference_parser(__doc__, "task=stsb glue.data_dir=glue_data", "glue")
    parser.add_argument("--reinit-pooler", action="store_true", help="re-initialise the reference's pooler first")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    out = output_dir(parser, args.out, "glue")
    cfg, choices = compose("finetune", [f"pretrained={args.pretrained}", "logger=csv", *args.overrides])
    spec = get_task(cfg.task.name)
    if spec.name not in {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"}:
        raise SystemExit(f"task={spec.name}: the reference fine-tunes GLUE tasks only.")
    pretrained = str(cfg.pretrained)
    hf_dir = Path(pretrained[3:]) if pretrained.startswith("hf:") else export_hf(pretrained, out / "hf")

    inputs = task_inputs(cfg)
    rows = []
    for seed in args.seeds:
        cfg.seed = seed
        sides = {}
        if not args.reference_only:
            sides["pretrainlab"] = run(cfg, out / f"pretrainlab-seed{seed}", choices=choices)["metrics"]
        sides["transformers" + (" (pooler re-initialised)" if args.reinit_pooler else "")] = reference_metrics(
            cfg, inputs, hf_dir, seed, args.reinit_pooler
        )
        for side, metrics in sides.items():
            rows.append({"side": side, "seed": seed, **metrics, "score": get(spec.name).score(metrics)})

    names = [k for k in rows[0] if k not in ("side", "seed")]
    print(f"\n{spec.name}: {args.pretrained}\n")
    print("| side | seed | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for r in rows:
        print(f"| {r['side']} | {r['seed']} | " + " | ".join(f"{r[k]:.4f}" for k in names) + " |")
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"\nboth sides' runs and results.csv: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

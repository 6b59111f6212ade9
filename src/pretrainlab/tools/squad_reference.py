"""Fine-tune a pretrained encoder on SQuAD v1.1 with Hugging Face transformers' question-answering recipe
and with pretrainlab, on the same questions with the same settings: an independent check of ``task=squad``.

    python experiments/squad_reference.py <run | encoder dir> squad.data_dir=<folder with train*.json, dev*.json> \\
        task.epochs=2 task.lr=1e-4 --seeds 0 --out <new dir>

The arguments after the encoder are finetune.py's overrides (conf/finetune.yaml, conf/task/squad.yaml),
so both sides read one composed config. pretrainlab's side is finetune.py's own run
(``pretrainlab.evaluation.run``). The reference is what transformers' ``run_qa`` example does, written
out: the encoder exported in transformers' format (``pretrainlab.export.hf``) and loaded as
``AutoModelForQuestionAnswering``; the windows cut by the fast tokenizer itself (``truncation="only_second"``,
``stride`` = ``task.doc_stride``, ``return_overflowing_tokens``, offsets), a window without the whole answer
labelled at ``[CLS]``; the mean of the start and end cross-entropies; AdamW with weight decay on matrices
only, the task's learning rate, warm-up and linear decay, gradient clipping, the task's epochs and batch
size, shuffled by the seed, in fp32; predictions from the ``n_best`` start and end logits of every window
(start <= end, at most ``max_answer_length`` tokens, both in the context). Both sides are scored by SQuAD
v1.1's exact match and F1 (``pretrainlab.evaluation.squad.scores``, checked against the definition in
``tests/test_squad.py``), and both write ``predictions.json`` in the official format, which the official
evaluation script reads as it is. Prints one row per seed and side; ``--out`` keeps both sides' runs,
predictions and ``results.csv``.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate

from pretrainlab.compare.measurements import write_table_report
from pretrainlab.evaluation import squad
from pretrainlab.evaluation.base import of
from pretrainlab.evaluation.run import run
from pretrainlab.export.hf import export_hf
from pretrainlab.optim import OptimConfig
from pretrainlab.runtime.hydra import compose
from pretrainlab.tools.cli import output_dir, reference_parser


def features(tokenizer, examples: list[squad.Example], cfg, train: bool) -> dict:
    """transformers' windows of ``examples`` (``run_qa``'s preparation): input ids, attention masks,
    token types, the example of each window, and either the answer's start and end tokens (``train``)
    or each token's characters in the context (None outside it)."""
    task = cfg.task
    enc = tokenizer(
        [e.question.lstrip() for e in examples],
        [e.context for e in examples],
        truncation="only_second",
        max_length=int(task.max_seq_len),
        stride=int(task.doc_stride),
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        return_token_type_ids=True,
        padding="max_length",
    )
    sample = enc.pop("overflow_to_sample_mapping")
    out: dict = {k: torch.tensor(enc[k]) for k in ("input_ids", "attention_mask", "token_type_ids")}
    out["example"] = np.asarray(sample)
    offsets = enc["offset_mapping"]
    if train:
        starts, ends = [], []
        for i, spans in enumerate(offsets):
            ids = enc["input_ids"][i]
            cls = ids.index(tokenizer.cls_token_id)
            seq = enc.sequence_ids(i)
            text, start_char = examples[sample[i]].answers[0]
            end_char = start_char + len(text)
            first = seq.index(1)
            last = len(seq) - 1 - seq[::-1].index(1)
            if not (spans[first][0] <= start_char and spans[last][1] >= end_char):
                starts.append(cls)
                ends.append(cls)
                continue
            while first < len(spans) and seq[first] == 1 and spans[first][0] <= start_char:
                first += 1
            while seq[last] == 1 and spans[last][1] >= end_char:
                last -= 1
            starts.append(first - 1)
            ends.append(last + 1)
        out["start_positions"], out["end_positions"] = torch.tensor(starts), torch.tensor(ends)
    else:
        out["offsets"] = [
            [span if enc.sequence_ids(i)[k] == 1 else None for k, span in enumerate(spans)]
            for i, spans in enumerate(offsets)
        ]
    return out


def postprocess(examples: list[squad.Example], feats: dict, starts: np.ndarray, ends: np.ndarray, cfg) -> dict:
    """``run_qa``'s post-processing: each question's best span over its windows (``n_best`` starts and
    ends paired, start <= end, at most ``max_answer_length`` tokens, in the context)."""
    n_best, longest = int(cfg.task.n_best), int(cfg.task.max_answer_length)
    best: dict[int, tuple[float, str]] = {}
    for k, i in enumerate(feats["example"]):
        spans = feats["offsets"][k]
        for s in np.argsort(starts[k])[-1 : -n_best - 1 : -1]:
            for e in np.argsort(ends[k])[-1 : -n_best - 1 : -1]:
                if spans[s] is None or spans[e] is None or e < s or e - s + 1 > longest:
                    continue
                score = float(starts[k][s] + ends[k][e])
                if i not in best or score > best[i][0]:
                    best[i] = (score, examples[i].context[spans[s][0] : spans[e][1]])
    return {e.id: best[i][1] if i in best else "" for i, e in enumerate(examples)}


def reference(cfg, splits: dict, hf_dir: Path, seed: int) -> tuple[dict, dict]:
    """transformers' question-answering model on ``hf_dir`` fine-tuned as ``cfg`` says; (its dev metrics
    after the last epoch, its predictions)."""
    import transformers

    torch.manual_seed(seed)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(hf_dir / "tokenizer.json"),
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        mask_token="[MASK]",
    )
    hf = transformers.AutoModelForQuestionAnswering.from_pretrained(hf_dir, local_files_only=True)
    train = features(tokenizer, splits["train"], cfg, train=True)
    batch_size, epochs = int(cfg.task.batch_size), int(cfg.task.epochs)
    keys = ("input_ids", "attention_mask", "token_type_ids", "start_positions", "end_positions")
    data = torch.utils.data.TensorDataset(*(train[k] for k in keys))
    loader = torch.utils.data.DataLoader(
        data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    optim: OptimConfig = instantiate(cfg.optim)
    params = [p for p in hf.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(optim.param_groups(hf), lr=optim.lr, betas=optim.betas, eps=optim.eps)
    total = math.ceil(len(data) / batch_size) * epochs
    schedule = transformers.get_linear_schedule_with_warmup(opt, optim.warmup_steps(total), total)
    hf.train()
    for _ in range(epochs):
        for batch in loader:
            out = hf(**dict(zip(keys, batch)))  # the mean of the start and end cross-entropies
            out.loss.backward()
            if optim.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, float(optim.grad_clip))
            opt.step()
            schedule.step()
            opt.zero_grad(set_to_none=True)
    hf.eval()
    dev = features(tokenizer, splits["validation"], cfg, train=False)
    starts, ends = [], []
    with torch.no_grad():
        for k in range(0, len(dev["input_ids"]), 2 * batch_size):
            out = hf(
                **{key: dev[key][k : k + 2 * batch_size] for key in ("input_ids", "attention_mask", "token_type_ids")}
            )
            starts.append(out.start_logits.numpy())
            ends.append(out.end_logits.numpy())
    predictions = postprocess(splits["validation"], dev, np.concatenate(starts), np.concatenate(ends), cfg)
    return squad.scores(predictions, splits["validation"]), predictions


def summary(rows: list[dict]) -> tuple[dict[str, dict], dict[str, float]]:
    """Each side's mean and sample standard deviation over seeds, and transformers' mean minus ours,
    for exact match and F1 (both sides measured on the same seeds). Empty when there is one seed."""
    if len({r["seed"] for r in rows}) < 2:
        return {}, {}
    means: dict[str, dict] = {}
    for side in dict.fromkeys(r["side"] for r in rows):
        mine = [r for r in rows if r["side"] == side]
        m: dict = {"n": len(mine), "seconds": float(np.mean([r["seconds"] for r in mine]))}
        for key in ("exact_match", "f1"):
            values = [r[key] for r in mine]
            m[key], m[f"{key}_sd"] = float(np.mean(values)), float(np.std(values, ddof=1))
        means[side] = m
    if set(means) != {"pretrainlab", "transformers"}:
        return means, {}
    gap = {k: means["transformers"][k] - means["pretrainlab"][k] for k in ("exact_match", "f1")}
    return means, gap


def main(argv: list[str] | None = None) -> int:
    parser = reference_parser(__doc__, "squad.data_dir=../shared/data/squad", "squad")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    out = output_dir(parser, args.out, "squad")
    cfg, choices = compose("finetune", [f"pretrained={args.pretrained}", "task=squad", "logger=csv", *args.overrides])
    pretrained = str(cfg.pretrained)
    hf_dir = Path(pretrained[3:]) if pretrained.startswith("hf:") else export_hf(pretrained, out / "hf")
    splits, _ = squad.load(of(cfg).data)
    rows = []
    for seed in args.seeds:
        cfg.seed = seed
        sides: dict[str, tuple[dict, float]] = {}
        if not args.reference_only:
            t0 = time.time()
            sides["pretrainlab"] = (
                run(cfg, out / f"pretrainlab-seed{seed}", choices=choices)["metrics"],
                time.time() - t0,
            )
        t0 = time.time()
        metrics, predictions = reference(cfg, splits, hf_dir, seed)
        (out / f"transformers-seed{seed}").mkdir()
        (out / f"transformers-seed{seed}" / squad.PREDICTIONS).write_text(json.dumps(predictions))
        sides["transformers"] = (metrics, time.time() - t0)
        for side, (m, seconds) in sides.items():
            rows.append({"side": side, "seed": seed, **{k: 100 * v for k, v in m.items()}, "seconds": round(seconds)})

    print(
        f"\nsquad: {args.pretrained}, {len(splits['train'])} training and {len(splits['validation'])} dev questions\n"
    )
    print("| side | seed | exact match | F1 | seconds |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['side']} | {r['seed']} | {r['exact_match']:.2f} | {r['f1']:.2f} | {r['seconds']} |")
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    names = {"pretrainlab": "`finetune.py task=squad`", "transformers": "transformers' `run_qa` recipe"}
    table = [[names[r["side"]], r["seed"], f"{r['exact_match']:.2f}", f"{r['f1']:.2f}", r["seconds"]] for r in rows]
    means, gap = summary(rows)
    for side, m in means.items():
        table.append(
            [
                names[side],
                f"mean of {m['n']} (sd)",
                f"{m['exact_match']:.2f} ({m['exact_match_sd']:.2f})",
                f"{m['f1']:.2f} ({m['f1_sd']:.2f})",
                round(m["seconds"]),
            ]
        )
    about = (
        f"The same exported encoder ({args.pretrained}) fine-tuned by both sides on {len(splits['train'])} "
        f"training questions and scored on {len(splits['validation'])} dev questions; windows of "
        f"{cfg.task.max_seq_len} tokens with a stride of {cfg.task.doc_stride}, lr {cfg.task.lr}, "
        f"{cfg.task.epochs} epochs at batch {cfg.task.batch_size}."
    )
    if gap:
        about += (
            f" transformers minus pretrainlab, mean over seeds {', '.join(map(str, args.seeds))}: "
            f"exact match {gap['exact_match']:+.2f}, F1 {gap['f1']:+.2f}."
        )
        print(f"\n{about}")
    write_table_report(
        out / "report",
        "SQuAD v1.1: pretrainlab against transformers' question-answering recipe",
        ["side", "seed", "exact match", "F1", "seconds"],
        table,
        about=about,
    )
    print(f"\nboth sides' runs, predictions.json, results.csv and report/: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

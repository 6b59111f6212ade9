"""Intrinsic checks of pretraining runs, at no fine-tuning cost.

- What each run learned: every head's held-out score beside its trivial baseline
  (``objectives.learning``), in ``learning.md``; a study warns about, and its comparison opens with,
  every run still at its baseline.
- Each run's own held-out metrics (``val/*``: MLM accuracy and loss, the pair task's accuracy,
  ELECTRA's replaced-token detection), recomputed from its last checkpoint on the documents every
  run of the study holds out (``split_seed``), so that the runs are read side by side.
- ALBERT's cross-check (Lan et al., 2020, Table 5): the pair head of a run trained with next-sentence
  prediction scored on sentence-order pairs, and the other way round. Both tasks label a coherent,
  in-order pair 0 (NSP: 1 = B from another document; SOP: 1 = A and B swapped), so a head trained on
  one task is scored on the other's pairs without relabelling. An NSP head that only learnt topic
  shift sits near 50% on SOP; an SOP head, which must model coherence, transfers to NSP.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import cast

import torch
from omegaconf import DictConfig, OmegaConf

from pretrainlab import atomic, figures
from pretrainlab.data.datamodule import PretrainDataModule
from pretrainlab.data.sentence_pairs import SentencePairs
from pretrainlab.model.encoder import Encoder
from pretrainlab.objectives import learning
from pretrainlab.objectives.learning import ABOVE, AT, PAST, HeadCheck
from pretrainlab.pretraining.assembly import build_model
from pretrainlab.pretraining.learning_log import FILE, heads, read_rows
from pretrainlab.pretraining.run import build_data
from pretrainlab.runtime.checkpoints import read
from pretrainlab.runtime.settings import uses_cuda
from pretrainlab.studies.arms import arm_of

log = logging.getLogger("pretrainlab")

PAIR_TASKS = ("nsp", "sop")


@torch.no_grad()
def evaluate(
    run_dir: str | Path,
    pair_task: str | None = None,
    batch_size: int = 64,
    max_batches: int | None = None,
    device: str | torch.device | None = None,
) -> dict[str, float]:
    """The held-out metrics of the run in ``run_dir`` (its ``config.yaml`` and ``checkpoints/last.ckpt``),
    averaged over the validation examples. ``pair_task`` (``nsp``/``sop``, for a run with a pair head):
    build the validation pairs of that task instead of the run's own. ``device``: where to compute
    (default: the GPU for a run that trained on one, else the CPU; float32 either way)."""
    run_dir = Path(run_dir)
    cfg = cast(DictConfig, OmegaConf.load(run_dir / "config.yaml"))
    device = torch.device(device if device is not None else "cuda" if uses_cuda(cfg) else "cpu")
    checkpoint = read(run_dir / "checkpoints" / "last.ckpt")
    data, tokens = build_data(cfg)
    model = build_model(cfg, tokens)
    encoder, objective = Encoder(model.encoder_config), model.objective
    state = checkpoint["state_dict"]  # compile wraps a function, not the modules: the keys are plain
    encoder.load_state_dict({k[len("encoder.") :]: v for k, v in state.items() if k.startswith("encoder.")})
    objective.load_state_dict({k[len("objective.") :]: v for k, v in state.items() if k.startswith("objective.")})
    encoder.to(device).eval(), objective.to(device).eval()

    builder = objective.example_builder(cfg.max_seq_len)
    if pair_task is not None:
        if not isinstance(builder, SentencePairs):
            raise ValueError(
                f"{run_dir}: objective {objective.name} has no sentence-pair head to score on "
                f"{pair_task.upper()} pairs."
            )
        builder = dataclasses.replace(builder, task=pair_task)
    datamodule = PretrainDataModule(
        data, builder, objective.collator(None), batch_size, cfg.seed, num_workers=0, val_batch_size=batch_size
    )
    datamodule.val_store = data.examples(builder, "val")
    if pair_task is None and not data.corpus.streaming:  # the learning checks' unigram baselines
        objective.token_counts = data.examples(builder, "train").token_counts(tokens.vocab_size)
    sums: dict[str, float] = {}
    tally = None
    count = 0
    for i, batch in enumerate(datamodule.val_dataloader()):
        if max_batches is not None and i >= max_batches:
            break
        batch = {k: v.to(device) for k, v in batch.items() if k != "global_tokens"}
        out = objective(encoder, batch)
        n = batch["input_ids"].shape[0]
        for name, value in {"loss": out.loss, **out.metrics}.items():
            sums[name] = sums.get(name, 0.0) + float(value) * n
        count += n
        if pair_task is None:
            tally = learning.add(tally, learning.held_out_tally(objective, encoder, batch))
    result: dict = {name: total / count for name, total in sums.items()} | {"examples": count}
    if pair_task is None:
        metrics, checks = learning.judge(objective, learning.to_host(tally or {}))
        result["learning"] = {"objective": objective.name, "metrics": metrics, "checks": [c.to_dict() for c in checks]}
    return result


def held_out(run: Path, recorded: bool = False) -> dict | None:
    """The run's own held-out evaluation (``evaluate``), computed once per checkpoint and kept in
    ``<run>/intrinsic.json``; None (with a warning) for a run without ``checkpoints/last.ckpt``.
    ``recorded``: read what ``intrinsic.json`` holds and compute nothing (a run brought back without
    its weights: ``pretrainlab.slot``); None (with a warning) when it holds no such evaluation. A recorded
    evaluation made by earlier baselines (from ``learning.RECORDED_SINCE``) is kept as it was judged: its
    weights are gone, so it cannot be judged again, and its report says which rules judged it."""
    checkpoint = run / "checkpoints" / "last.ckpt"
    if recorded:
        cached = run / "intrinsic.json"
        row = json.loads(cached.read_text()) if cached.is_file() else {}
        if "learning" in row.get("own", {}) and row.get("baselines", 0) >= learning.RECORDED_SINCE:
            return row
        log.warning("%s has no held-out evaluation of its last checkpoint (intrinsic.json): left out", run)
        return None
    if not checkpoint.is_file():
        log.warning("%s has no checkpoints/last.ckpt: left out of the held-out checks", run)
        return None
    cached, stamp = run / "intrinsic.json", checkpoint.stat().st_mtime_ns
    row = json.loads(cached.read_text()) if cached.is_file() else {}
    if (
        row.get("checkpoint_mtime_ns") != stamp
        or "learning" not in row.get("own", {})
        or row.get("baselines") != learning.BASELINE_VERSION
    ):
        row = {"checkpoint_mtime_ns": stamp, "baselines": learning.BASELINE_VERSION, "own": evaluate(run)}
        atomic.write_json(cached, row)
    return row


def learning_report(runs: list[Path], out_dir: Path, recorded: bool = False) -> dict[str, dict]:
    """What each run's heads learned beside their trivial baselines, on the held-out documents
    (``objectives.learning``): ``learning.json`` and ``learning.md`` in ``out_dir``, and a warning for
    every head still at its baseline. Returns {run name: {"objective", "metrics", "checks"}}.
    ``recorded``: from each run's ``intrinsic.json`` only (:func:`held_out`)."""
    rows = {  # each with the version of the baselines that judged it (learning_markdown says their rules)
        run.name: {**row["own"]["learning"], "baselines": row["baselines"]}
        for run in runs
        if (row := held_out(run, recorded)) is not None
    }
    for name, row in rows.items():
        for check in row["checks"]:
            if check["status"] == AT:
                log.warning("%s: %s", name, HeadCheck(**check).line())
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic.write_json(out_dir / "learning.json", rows)
    atomic.write_text(out_dir / "learning.md", learning_markdown(rows) + "\n")
    return rows


def heads_with(rows: dict[str, dict], status: str) -> dict[str, list[HeadCheck]]:
    """The runs with a head whose verdict is ``status`` (``learning.AT``, ``ABOVE``, ``PAST``), and those heads."""
    flagged = {name: [HeadCheck(**c) for c in row["checks"] if c["status"] == status] for name, row in rows.items()}
    return {name: checks for name, checks in flagged.items() if checks}


def at_baseline(rows: dict[str, dict]) -> dict[str, list[HeadCheck]]:
    """The runs with a head still at its trivial baseline, and those heads."""
    return heads_with(rows, AT)


def learning_markdown(rows: dict[str, dict]) -> str:
    lines = [
        "What each run learned: every head on the held-out documents beside its trivial baseline",
        "",
        "| run | head | held out | trivial baseline | verdict | details |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in sorted(rows.items()):
        if not row["checks"]:
            lines.append(f"| {name} | – | – | – | objective {row['objective']} defines no learning check | |")
        for c in row["checks"]:
            verdict = f"**{c['status']}**" if c["status"] == AT else c["status"]
            lines.append(
                f"| {name} | {c['head']} | {c['value']:.3f} | {c['baseline']:.3f} ({c['baseline_name']}) | "
                f"{verdict} | {c['detail']} |"
            )
        states = learning.states_line(row.get("metrics") or {})
        if states:
            verdict = "**collapsed**" if learning.collapsed(row["metrics"]) else "not collapsed"
            lines.append(f"| {name} | encoder | | | {verdict} | {states} |")
    lines += [
        "",
        "Masked LMs: accuracy at [MASK] positions beside always answering the most frequent token of the "
        "same positions (past baseline: at least twice it, with a loss below the token frequencies'); "
        + _detection_rule(rows)
        + "; NSP/SOP: accuracy beside the majority label (past: 5 points over it, "
        "z >= 3). Encoder: the mean cosine between the final hidden states of held-out tokens (collapsed "
        f"at {learning.COLLAPSED} or more: every token looks alike, a broken run rather than a slow one). A comparison of encoders "
        "at their baseline measures nothing of their objectives yet.",
    ]
    return "\n".join(lines)


def _detection_rule(rows: dict[str, dict]) -> str:
    """How the rows' replaced-token detection was judged: beside the token alone as well (baselines from
    ``learning.TOKEN_ALONE_SINCE``), or, in a report made before, beside always answering "original" only."""

    def version(row: dict) -> int:  # a published learning.json made before rows carried it: by its checks
        beside = any(c.get("baseline_name") == "the token alone" for c in row["checks"])
        return int(row.get("baselines") or (learning.TOKEN_ALONE_SINCE if beside else learning.TOKEN_ALONE_SINCE - 1))

    beside_token = bool(rows) and all(version(row) >= learning.TOKEN_ALONE_SINCE for row in rows.values())
    if beside_token:
        return (
            'replaced-token detection: AUC beside always answering "original" (0.5) and beside a detector that sees '
            "each token alone, not its context (past: AUC >= 0.75 and 0.05 over the token alone's, with a tenth of "
            "the replacements found; at baseline: under 2% found, or within 0.01 of the token alone)"
        )
    return (
        'replaced-token detection: AUC beside always answering "original" (0.5; past: AUC >= 0.75 with a tenth of '
        "the replacements found; at baseline: under 2% found)"
    )


def learning_curves(runs: list[Path], out_dir: Path) -> dict[str, dict]:
    """Each run's learning curve from its ``learning.csv`` (one row per validation): every head's
    held-out score divided by its trivial baseline against pretraining FLOPs, in
    ``learning-curves.png``, and the first validation at which each head was past its baseline, in
    ``learning-curves.md``. Returns {run: {head: {"past_at": {step, tokens, flops} | None, "points": n}}}."""

    found: dict[str, dict] = {}
    curves: dict[tuple[str, str], list[tuple[float, float, bool]]] = {}
    for run in runs:
        rows = read_rows(run / FILE)
        for head in heads(rows[0] if rows else {}):
            points = [
                (
                    float(r["flops"]),
                    float(r[f"value:{head}"]) / float(r[f"baseline:{head}"]),
                    r[f"status:{head}"] == PAST,
                )
                for r in rows
                if r.get(f"status:{head}")
            ]
            past = next((r for r in rows if r.get(f"status:{head}") == PAST), None)
            found.setdefault(run.name, {})[head] = {
                "points": len(points),
                "last": rows[-1].get(f"status:{head}"),
                "past_at": None if past is None else {k: float(past[k]) for k in ("step", "tokens", "flops")},
            }
            curves[(run.name, head)] = points
    if not found:
        return {}
    lines = [
        "When each head left its trivial baseline: the first validation at which it was past it",
        "",
        "| run | head | past its baseline at step | tokens | FLOPs | at the last validation | validations |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, by_head in sorted(found.items()):
        for head, f in by_head.items():
            at = f["past_at"]
            where = f"{at['step']:.0f} | {at['tokens']:.3g} | {at['flops']:.3g}" if at else "not yet | – | –"
            lines.append(f"| {name} | {head} | {where} | {f['last']} | {f['points']} |")
    atomic.write_text(out_dir / "learning-curves.md", "\n".join(lines) + "\n")
    _plot_learning(curves, out_dir / "learning-curves.png")
    return found


def _plot_learning(curves: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    # One colour per objective (a run's name without its "-s<seed>"), one line style per head: the
    # seeds of an objective share a colour and a legend entry instead of cycling through the palette.
    group = {run: arm_of(run) for run, _ in curves}
    colours = {g: f"C{i % 10}" for i, g in enumerate(sorted(set(group.values())))}
    styles: dict[str, str] = {}
    labelled = set()
    for (run, head), points in sorted(curves.items()):
        if not points:
            continue
        style = styles.setdefault(head, ["-", "--", ":", "-."][len(styles) % 4])
        label = None if (group[run], head) in labelled else f"{group[run]}: {head}"
        labelled.add((group[run], head))
        colour = colours[group[run]]
        x, y, past = zip(*points)
        ax.plot(x, y, color=colour, linestyle=style, label=label)
        ax.scatter([a for a, p in zip(x, past) if p], [b for b, p in zip(y, past) if p], color=colour, s=18)
        ax.scatter(
            [a for a, p in zip(x, past) if not p],
            [b for b, p in zip(y, past) if not p],
            s=18,
            facecolors="none",
            edgecolors=colour,
        )
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="trivial baseline")
    ax.set_xscale("log")
    ax.set_xlabel("pretraining FLOPs")
    ax.set_ylabel("held-out score / trivial baseline")
    ax.set_title("What each head learned (filled: past its baseline)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return figures.save(fig, path)


def learning_preface(rows: dict[str, dict]) -> str:
    """The warning that heads a study's comparison when any run is still at its trivial baseline, or has a
    head that is learning but not yet past it ('' if every head is past its baseline)."""
    flagged, learning_still = at_baseline(rows), heads_with(rows, ABOVE)
    lines: list[str] = []
    if flagged:
        lines += [
            f"**Not yet learned: {len(flagged)} of {len(rows)} pretraining runs have a head still at its trivial "
            "baseline on held-out text.** What the table below says of them measures token frequencies at most, "
            "not their objectives (learning.md):",
            "",
        ]
        for name, checks in sorted(flagged.items()):
            metrics = rows[name].get("metrics") or {}
            states = f"; {learning.states_line(metrics)}" if learning.collapsed(metrics) else ""
            lines.append(f"- {name}: " + "; ".join(c.line() for c in checks) + states)
    if learning_still:
        lines += [
            *([""] if lines else []),
            f"**Still learning: {len(learning_still)} of {len(rows)} pretraining runs have a head above its trivial "
            "baseline but not yet past it.** The table below compares encoders that have not all learned their "
            "objectives: it says where each has got to at this budget, not which objective is better (learning.md):",
            "",
        ]
        lines += [
            f"- {name}: " + "; ".join(c.line() for c in checks) for name, checks in sorted(learning_still.items())
        ]
    return "\n".join(lines)


def intrinsic_row(run: Path, recorded: bool = False) -> dict | None:
    """The run's held-out metrics (:func:`held_out`) with, for a run with a pair head, the NSP/SOP
    cross-check: computed once per checkpoint, kept in ``<run>/intrinsic.json`` (``recorded``: read
    from there only)."""
    row = held_out(run, recorded)
    if row is None:
        return None
    pair = next((t for t in PAIR_TASKS if f"{t}_acc" in row["own"]), None)
    if pair is not None and "cross" not in row and not recorded:
        other = PAIR_TASKS[1 - PAIR_TASKS.index(pair)]
        row["cross"] = {"head": pair, "pairs": other, "acc": evaluate(run, other)[f"{pair}_acc"]}
        atomic.write_json(run / "intrinsic.json", row)
    return row


def intrinsic_report(runs: list[Path], out_dir: Path, recorded: bool = False) -> dict:
    """Held-out metrics of every run and the NSP/SOP cross-check, as ``intrinsic.json`` and
    ``intrinsic.md`` in ``out_dir``; a run evaluated before (same checkpoint) is read back from
    ``<run>/intrinsic.json`` (``recorded``: every run is)."""
    rows = {}
    for run in runs:
        row = intrinsic_row(run, recorded)
        if row is None:
            continue
        rows[run.name] = row
    report = {"runs": rows}
    atomic.write_json(out_dir / "intrinsic.json", report)
    atomic.write_text(out_dir / "intrinsic.md", intrinsic_markdown(report) + "\n")
    return report


def intrinsic_markdown(report: dict) -> str:
    rows = report["runs"]
    metrics = sorted(
        {m for r in rows.values() for m in r["own"] if m not in ("examples", "learning")},
        key=lambda m: (not m.startswith("mlm"), m),
    )
    lines = [
        "| run | " + " | ".join(metrics) + " | pair head on the other task's pairs |",
        "|" + "---|" * (len(metrics) + 2),
    ]
    for name, r in sorted(rows.items()):
        cells = [("–" if m not in r["own"] else f"{r['own'][m]:.3f}") for m in metrics]
        cross = r.get("cross")
        cells.append(
            f"{cross['head'].upper()} head on {cross['pairs'].upper()} pairs: {100 * cross['acc']:.1f}%"
            if cross
            else "–"
        )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Held-out documents (the same for every run), recomputed from each run's last checkpoint. "
        "Accuracies are fractions; the cross-check scores a pair head on the other pair task "
        "(ALBERT, Table 5: NSP-trained 52.0 on SOP, SOP-trained 78.9 on NSP).",
    ]
    return "\n".join(lines)


__all__ = [
    "at_baseline",
    "evaluate",
    "held_out",
    "intrinsic_row",
    "intrinsic_markdown",
    "intrinsic_report",
    "learning_curves",
    "learning_markdown",
    "learning_preface",
    "learning_report",
]

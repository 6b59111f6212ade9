"""What the comparison adds for the evaluations beyond GLUE: BLiMP by field, phenomenon and paradigm,
and the probes' scores layer by layer.

    blimp_table   accuracy per row and group (field, phenomenon, paradigm) with a bootstrap interval
                  over the group's pairs (and over pretraining seeds), from each result's items
    probe_table   each probe's score (layer 0..L, last four, scalar mix) per row and task, the mean
                  over the row's encoders and seeds, with the mix's layer weights
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from pretrainlab import figures, stats
from pretrainlab.evaluation.tasks import display_name

LEVELS = ("field", "phenomenon", "paradigm")


def blimp_table(results: list[dict], rows: dict[str, str], encoder_id, level: float = stats.LEVEL) -> dict:
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
                s = stats.summarize_items(outcomes, level, samples=1000, rng=rng)
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
            f"{display_name(task)}: frozen-feature probes (dev score x 100, mean over encoders and seeds; "
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
        ax.set_title(f"{display_name(task)}: linear probes on frozen features")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return figures.save(fig, path)


__all__ = ["blimp_markdown", "blimp_table", "plot_probes", "probe_markdown", "probe_table"]

"""The comparison as figures: task scores per encoder with intervals, and GLUE against FLOPs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pretrainlab import figures, uncertainty
from pretrainlab.compare.tables import columns
from pretrainlab.evaluation.base import display_name, known


def plot(table: dict, path: Path) -> Path:
    """Grouped bars: task scores (and the GLUE score) per encoder, with confidence-interval error bars
    (± std when a row has no interval); scratch hatched and last; each task's no-skill level dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = columns(table)
    labels = table["labels"]
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(min(14.0, max(7.0, 0.3 * len(groups) * max(1, len(labels)) + 2.5)), 4.8))
    x = np.arange(len(groups))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, label in enumerate(labels):
        means, low, high = [], [], []
        for g in groups:
            c = table["glue"].get(label) if g == "glue" else table["cells"][label].get(g)
            if not c:
                means.append(np.nan)
                low.append(0.0)
                high.append(0.0)
                continue
            mean, sd = c["score"]
            ci = (c.get("summary") or {}).get("ci")
            means.append(mean)
            low.append(mean - ci[0] if ci else sd)
            high.append(ci[1] - mean if ci else sd)
        scratch = label.startswith("scratch")
        pos = x + (i - (len(labels) - 1) / 2) * width
        ax.bar(
            pos,
            means,
            width,
            yerr=[low, high],
            capsize=3,
            label=label,
            color="lightgray" if scratch else colors[i % len(colors)],
            edgecolor="dimgray" if scratch else "none",
            hatch="//" if scratch else None,
        )
        # a zero-height bar stays visible: a thick line of its colour at its value
        ax.hlines(
            means,
            pos - width / 2,
            pos + width / 2,
            colors="dimgray" if scratch else colors[i % len(colors)],
            linewidth=3,
            zorder=3,
        )
    labelled = False
    for j, g in enumerate(groups):
        levels = [table["cells"][lb][g].get("no_skill") for lb in labels if g in table["cells"][lb]] if known(g) else []
        levels = [v for v in levels if v is not None]
        if levels:  # the majority-class (constant) prediction: what a model that learnt nothing scores
            ax.hlines(
                float(np.mean(levels)),
                j - 0.45,
                j + 0.45,
                colors="black",
                linestyles="dashed",
                linewidth=1,
                label=None if labelled else "majority class / constant",  # type: ignore[arg-type]  # None: no entry
                zorder=4,
            )
            labelled = True
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x, [display_name(g) if known(g) else "GLUE" for g in groups])
    ax.set_ylabel("dev score (x 100)")
    interval = table.get("interval") or {"level": uncertainty.LEVEL}
    ax.set_title(f"GLUE dev scores: mean and {100 * interval['level']:g}% interval over seeds")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return figures.save(fig, path)


def plot_curve(lines: dict, path: Path, baselines: dict | None = None, name: str = "GLUE score") -> Path:
    """GLUE score against pretraining FLOPs (log scale), one line per row with its interval as a
    band; ``baselines`` ({label: score}, e.g. scratch) as horizontal dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.8))
    for label, points in sorted(lines.items()):
        x = [p["flops"] for p in points]
        y = [p["glue"] for p in points]
        (line,) = ax.plot(x, y, marker="o", label=label)
        bands = [(p["flops"], *p["ci"]) for p in points if p["ci"]]
        if bands:
            bx, lo, hi = zip(*bands)
            ax.fill_between(bx, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
    for label, value in (baselines or {}).items():
        ax.axhline(value, color="gray", linestyle="--", linewidth=1, label=f"{label} (no pretraining)")
    ax.set_xscale("log")
    ax.set_xlabel("pretraining FLOPs")
    ax.set_ylabel(f"{name} (dev, x 100)")
    ax.set_title(f"{name} against pretraining compute (bands: 95% intervals)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return figures.save(fig, path)


__all__ = ["plot", "plot_curve"]

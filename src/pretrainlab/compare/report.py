"""One comparison report directory: comparison.md, .csv, .png and .json; FLOPs curves of snapshots
(curve.png, curve.csv, and per task); and what each evaluation adds beyond its column (its
``sections``: BLiMP by field, phenomenon and paradigm, the probes layer by layer)."""

from __future__ import annotations

from pathlib import Path

from pretrainlab import atomic, uncertainty
from pretrainlab.compare.collect import encoder_of, is_final, row_labels
from pretrainlab.compare.plots import plot, plot_curve
from pretrainlab.compare.statistics import aggregate, curve
from pretrainlab.compare.tables import curve_csv, to_csv, to_markdown
from pretrainlab.evaluation.base import display_name, section_kinds


def write_report(
    results: list[dict],
    out_dir: str | Path,
    baseline: str | None = None,
    method: str = "t",
    level: float = uncertainty.LEVEL,
    preface: str = "",
    learning: dict | None = None,
) -> dict:
    """comparison.md, .csv, .png and .json in ``out_dir``; with snapshot results also curve.png and
    curve.csv (the table's ``curve``). ``preface``: what comparison.md says before its table (a
    study's warning about encoders that have not learned yet); ``learning``: the study's held-out
    checks of each run (``studies.intrinsic.learning_report``), kept in the table for W&B."""
    table = aggregate(results, baseline, method, level)  # refuses what cannot be compared before anything is written
    table["preface"], table["learning"] = preface, learning or {}
    table["curve"] = curve(results, method, level)
    table["curves"] = {
        t: c for t in table["tasks"] if t not in table["glue_tasks"] and (c := curve(results, method, level, t))
    }
    finals = [r for r in results if is_final(r)]
    rows = row_labels(finals)
    sections = []  # what each kind of evaluation adds beyond its column (BLiMP by paradigm, the probes by layer)
    for kind in section_kinds(table["tasks"]):
        sections += kind.sections(finals, rows, lambda r: encoder_of(r)["id"], level)
    for section in sections:
        table[section.key] = section.table
    table["sections"] = [section.summary for section in sections]
    out = Path(out_dir)
    atomic.write_text(out / "comparison.md", to_markdown(table) + "\n")
    atomic.write_text(out / "comparison.csv", to_csv(table))
    atomic.write_text(out / "comparison.json", atomic.json_text(table))
    plot(table, out / "comparison.png")
    if table["curve"]:
        scratch = {lb: g["score"][0] for lb, g in table["glue"].items() if lb.startswith("scratch")}
        plot_curve(table["curve"], out / "curve.png", scratch)
        atomic.write_text(out / "curve.csv", curve_csv(table["curve"]))
    for task, lines in table["curves"].items():
        scratch = {
            lb: c[task]["score"][0] for lb, c in table["cells"].items() if lb.startswith("scratch") and task in c
        }
        plot_curve(lines, out / f"curve-{task}.png", scratch, name=display_name(task))
        atomic.write_text(out / f"curve-{task}.csv", curve_csv(lines))
    for section in sections:
        atomic.write_text(out / f"{section.key}.md", section.markdown + "\n")
        if section.plot is not None:
            section.plot(out / f"{section.key}.png")
    return table


__all__ = ["write_report"]

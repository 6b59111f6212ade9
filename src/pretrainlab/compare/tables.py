"""The comparison as text: the Markdown table (with differences, the seeds a difference needs and
the conventions under it) and the CSV files of the table and of the FLOPs curves.
"""

from __future__ import annotations

import csv
import io

from pretrainlab import uncertainty
from pretrainlab.compare.statistics import DELTAS, score_range
from pretrainlab.evaluation.base import display_name, get, known


def column_range(table: dict, column: str) -> tuple[float, float]:
    """Where a column's scores lie: its evaluation's range; GLUE's, the mean of its tasks' ranges."""
    return score_range(table["glue_tasks"]) if column == "glue" else get(column).score_range


def _interval(ci, bounds: tuple[float, float] | None = None) -> str:
    """The interval as the comparison computed it (``statistics.bounded_summary`` cut it to its metric's
    range there): a rendering never changes a number, so that a report and what cites it say the same."""
    return "" if not ci else f" ({ci[0]:.1f}, {ci[1]:.1f})"


def _cut(summary: dict | None, bounds: tuple[float, float]) -> bool:
    return bool((summary or {}).get("cut"))


def _cell(
    summary: dict | None,
    ms: tuple[float, float],
    pretrain_sd: float | None,
    n: int | None,
    expected: int,
    items: bool = False,
    bounds: tuple[float, float] | None = None,
    within: bool = True,
) -> str:
    """mean ± sd [sd over pretraining seeds] (interval), and the number of runs when it is fewer than
    the row should have (``expected``); a single run is shown as what it is, without a spread. With
    one fine-tuning seed per encoder (not ``within``) there is no spread within an encoder to show:
    mean [sd over pretraining seeds] (interval). A zero-shot cell (``items``): the mean [sd over
    pretraining seeds] (interval over items)."""
    if items:
        return (
            f"{ms[0]:.1f}"
            + (f" [{pretrain_sd:.1f}]" if pretrain_sd is not None else "")
            + _interval(summary["ci"] if summary else None, bounds)
        )
    if n is None:  # a GLUE score with no fine-tuning seed in every task: no spread to show
        return f"{ms[0]:.1f} (mean of task means)"
    if n == 1:
        return f"{ms[0]:.1f} (n=1)"
    text = f"{ms[0]:.1f} ± {ms[1]:.1f}" if within or pretrain_sd is None else f"{ms[0]:.1f}"
    if pretrain_sd is not None:
        text += f" [{pretrain_sd:.1f}]"
    return text + _interval(summary["ci"] if summary else None, bounds) + (f" (n={n})" if n < expected else "")


def columns(table: dict) -> list[str]:
    """The table's columns in order: its tasks (in the evaluations' order), the GLUE score (``glue``)
    after the last task it averages."""
    tasks = list(table["tasks"])
    if not table["glue"] or not table["glue_tasks"]:
        return tasks
    after = max(tasks.index(t) for t in table["glue_tasks"]) + 1
    return [*tasks[:after], "glue", *tasks[after:]]


def _header(column: str) -> str:
    if column == "glue":
        return "GLUE"
    return f"{display_name(column)} ({'/'.join(get(column).metric_label(m) for m in get(column).metrics)})"


def to_markdown(table: dict) -> str:
    cols = columns(table)
    header = ["encoder"] + [_header(c) for c in cols]
    lines = [table["preface"], ""] if table.get("preface") else []  # a study's warning comes first
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    seeded_cells = [c for lb in table["labels"] for c in table["cells"][lb].values() if not c.get("items")]
    per_encoder = max((len(set(c["seeds"])) for c in seeded_cells), default=1)
    short = cut = False
    zero_shot: list[str] = []
    for label in table["labels"]:
        row = [label]
        encoders = max(1, len(table.get("encoders", {}).get(label, [])))
        for col in cols:
            bounds = column_range(table, col)
            if col == "glue":
                g = table["glue"].get(label)
                n = (g.get("summary") or {}).get("n") if g else None
                row.append(
                    _cell(
                        g.get("summary"),
                        g["score"],
                        g["pretrain_sd"],
                        n,
                        per_encoder * encoders,
                        bounds=bounds,
                        within=per_encoder > 1,
                    )
                    if g
                    else "–"
                )
                short |= bool(g) and (n is None or n < per_encoder * encoders)
                cut |= bool(g) and _cut(g.get("summary"), bounds)
                continue
            c = table["cells"][label].get(col)
            cut |= bool(c) and _cut(c.get("summary"), bounds)
            if c and c.get("items"):  # zero-shot: one run per encoder, the interval over items
                zero_shot += [] if col in zero_shot else [col]
                row.append(
                    _cell(c["summary"], c["score"], c["pretrain_sd"]["score"], None, 1, items=True, bounds=bounds)
                )
                continue
            expected = per_encoder * encoders
            row.append(
                _cell(
                    c.get("summary"),
                    c["score"],
                    c["pretrain_sd"]["score"],
                    len(c["seeds"]),
                    expected,
                    bounds=bounds,
                    within=per_encoder > 1,
                )
                if c
                else "–"
            )
            short |= bool(c) and len(c["seeds"]) < expected
        lines.append("| " + " | ".join(row) + " |")
    seeds = [per_encoder]
    per_row = sorted({len(v) for v in table.get("encoders", {}).values()})
    interval = table.get("interval") or {"level": uncertainty.LEVEL, "method": "t"}
    pct = f"{100 * interval['level']:g}%"
    how = {"t": "two-level t interval", "bootstrap": "hierarchical bootstrap"}[interval["method"]]
    pretrain = ""
    if any(n > 1 for n in per_row) and per_encoder > 1:
        pretrain = (
            f", over {'/'.join(map(str, per_row))} pretraining seed(s) per row: the mean of the encoders' "
            f"means ± the sd over fine-tuning seeds pooled within encoders [the sd over pretraining seeds]"
        )
    elif any(n > 1 for n in per_row):  # one fine-tuning seed per encoder: no spread within one to show
        pretrain = (
            f", over {'/'.join(map(str, per_row))} pretraining seed(s) per row, one fine-tuning seed each: the mean "
            f"of the encoders' scores [the sd over pretraining seeds]"
        )
    single = any(n == 1 for n in per_row)
    lines.append("")
    seeded = (
        (
            f"Task score x 100 on the dev set after the last fine-tuning epoch (a task's score is the mean of "
            f"its metrics), mean ± std over {'/'.join(map(str, seeds))} seed(s){pretrain}; "
            f"({pct} confidence interval, {how}"
            + ("; for a row with one pretraining seed it covers fine-tuning noise only" if single else "")
            + (
                f"). GLUE = mean task score over "
                f"{', '.join(display_name(t) for t in table['glue_tasks'])}; WNLI excluded as in BERT. "
                if table["glue_tasks"]
                else "). "
            )
        )
        if seeded_cells
        else ""
    )
    lines.append(
        seeded
        + (
            f"Zero-shot tasks ({', '.join(display_name(t) for t in zero_shot)}): score x 100, scored once per "
            f"encoder; the {pct} interval is a bootstrap over the items (and over pretraining seeds when there "
            f"are several). "
            if zero_shot
            else ""
        )
        + (
            "(n=k): a cell built from fewer runs than its row's encoders x seeds; its interval is wider and "
            "its mean noisier. "
            if short
            else ""
        )
        + (
            "Intervals are cut at the ends of their metric's range (0 to 100; -100 to 100 for MCC and "
            "correlations): a t interval about a mean near an end, from seeds that disagree, reaches past it."
            if cut
            else ""
        )
    )
    lines[-1] = lines[-1].rstrip()
    for summary in table.get("sections") or []:  # what evaluations add beyond their columns (BLiMP, probes)
        lines += ["", summary]
    if table.get("differences"):
        lines += ["", differences_markdown(table)]
    if table.get("seeds_needed"):
        lines += ["", seeds_markdown(table)]
    return "\n".join(lines)


def differences_markdown(table: dict) -> str:
    """Every row minus the baseline, per task and GLUE: difference (interval) and p-value; * marks
    an interval that excludes zero."""
    tasks = columns(table)
    base = table["baseline"]
    lines = [
        f"Difference against {base} (points; * = the interval excludes 0)",
        "",
        "| encoder | " + " | ".join(display_name(t) if known(t) else "GLUE" for t in tasks) + " |",
        "|" + "---|" * (len(tasks) + 1),
    ]
    tests = set()
    for label, diffs in table["differences"].items():
        row = [f"{label} − {base}"]
        for t in tasks:
            d = diffs.get(t)
            if not d:
                row.append("–")
                continue
            tests.add(d["test"])
            p = "" if d["p"] is None else f" p={d['p']:.2g}"
            row.append(f"{d['mean']:+.1f}{'*' if d['significant'] else ''}{_interval(d['ci'])}{p}")
        lines.append("| " + " | ".join(row) + " |")
    notes = []
    if any(t.startswith("paired t") for t in tests):
        notes.append(
            "matched pretraining and fine-tuning seeds where both rows have them; a paired t over seeds is "
            "conditional on the two encoders"
        )
    if any(t.startswith("McNemar") for t in tests):
        notes.append("McNemar's test compares two encoders on the same items, so it too is conditional on them")
    lines += ["", f"Tests: {', '.join(sorted(tests))}" + (f" ({'; '.join(notes)})." if notes else ".")]
    return "\n".join(lines)


def seeds_markdown(table: dict) -> str:
    """Runs per encoder needed to detect a difference, from the spreads measured here."""
    needed = table["seeds_needed"]
    lines = [
        "Runs per encoder to detect a difference of 1 / 2 / 5 points (two-sided 5% test, 80% power), from the "
        "sd of one run measured here (marked where only fine-tuning or probe seeds varied, not pretraining seeds)",
        "",
        "| task | sd of one run | 1 point | 2 points | 5 points |",
        "|---|---|---|---|---|",
    ]
    for t, n in needed.items():
        lines.append(
            f"| {display_name(t)} | {n['sd']:.1f}{'' if n['with_pretraining_sd'] else ' (one pretraining seed)'} | "
            + " | ".join(str(n["runs"][f"{d:g}"]) for d in DELTAS)
            + " |"
        )
    return "\n".join(lines)


def to_csv(table: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(
        ["encoder", "task", "metric", "mean", "std", "std_pretrain", "seeds", "encoders", "median", "ci_low", "ci_high"]
    )

    def num(v: float | None) -> str:
        return "" if v is None else f"{v:.4f}"

    def interval(summary: dict | None) -> list[str]:
        if not summary:
            return ["", "", ""]
        ci = summary["ci"] or (None, None)
        return [num(summary["median"]), num(ci[0]), num(ci[1])]

    for label in table["labels"]:
        n_enc = len(table.get("encoders", {}).get(label, [])) or ""
        for t in table["tasks"]:
            c = table["cells"][label].get(t)
            if not c:
                continue
            for m, (mean, std) in c["metrics"].items():
                w.writerow(
                    [
                        label,
                        t,
                        m,
                        f"{mean:.4f}",
                        f"{std:.4f}",
                        num(c["pretrain_sd"][m]),
                        len(c["seeds"]),
                        c["encoders"],
                        "",
                        "",
                        "",
                    ]
                )
            w.writerow(
                [
                    label,
                    t,
                    "score",
                    f"{c['score'][0]:.4f}",
                    f"{c['score'][1]:.4f}",
                    num(c["pretrain_sd"]["score"]),
                    len(c["seeds"]),
                    c["encoders"],
                    *interval(c.get("summary")),
                ]
            )
        if label in table["glue"]:
            g = table["glue"][label]
            w.writerow(
                [
                    label,
                    "glue",
                    "score",
                    f"{g['score'][0]:.4f}",
                    f"{g['score'][1]:.4f}",
                    num(g["pretrain_sd"]),
                    "",
                    n_enc,
                    *interval(g.get("summary")),
                ]
            )
    return out.getvalue()


def curve_csv(lines: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["encoder", "fraction", "flops", "glue", "ci_low", "ci_high", "encoders"])
    for label, points in sorted(lines.items()):
        for p in points:
            ci = p["ci"] or ("", "")
            w.writerow([label, p["fraction"], f"{p['flops']:.4g}", f"{p['glue']:.4f}", *ci, p["encoders"]])
    return out.getvalue()


__all__ = ["columns", "curve_csv", "differences_markdown", "seeds_markdown", "to_csv", "to_markdown"]

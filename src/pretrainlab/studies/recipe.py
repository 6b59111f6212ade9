"""The report of a study that pretrains only (``evals=[]``): when each head of each run left its trivial
baseline, for recipe questions ("does NSP hold BERT's masked LM back?", "does pre-LN move the escape
earlier?") that are answered by runs sharing everything but what is asked, read at the same validations
(``conf/ablation/bert_pair_loss.yaml`` and the other recipe presets).

In the study's ``report/``, beside ``learning.md`` and ``learning-curves.md``, as ``python tools/docs.py
publish`` takes it:

- ``report.json``/``report.md``: per run and head, the first validation from which the head stayed above
  and past its baseline (step and FLOPs), its last value beside the baseline, and the encoder's state at
  the end (mean cosine of its final hidden states over held-out tokens; for masked heads, the distinct
  answers at [MASK]): a run still at its baseline with distinct answers is starting slowly, one whose
  tokens all look alike has collapsed;
- ``curves.csv``: every validation of every run (step, tokens, FLOPs, each head's value, baseline and
  verdict).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from pretrainlab import atomic
from pretrainlab.compare.measurements import write_table_report
from pretrainlab.objectives.learning import ABOVE, PAST
from pretrainlab.pretraining.learning_log import FILE as LEARNING
from pretrainlab.pretraining.learning_log import heads, read_rows
from pretrainlab.runtime.provenance import typed_command

COLUMNS = [
    "arm",
    "overrides",
    "head",
    "above from (step, FLOPs)",
    "past from (step, FLOPs)",
    "last validation",
    "last value vs baseline",
    "verdict",
    "hidden cosine",
    "distinct answers",
]


def _number(text: Any) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def first(rows: list[dict[str, str]], head: str, statuses: tuple[str, ...]) -> dict[str, str] | None:
    """The first validation from which the head's verdict stays in ``statuses`` to the end
    (``learning-curves.md`` gives the first validation past it, even one it fell back from)."""
    found = None
    for row in rows:
        if row.get(f"status:{head}") in statuses:
            found = found or row
        else:
            found = None
    return found


def summary_rows(overrides: dict[str, list[str]], curves: dict[str, list[dict[str, str]]]) -> list[list[str]]:
    """One row per run and head: when it went above and past its baseline, where it ended. ``overrides``:
    each run's own (what makes its arm), ``curves``: each run's ``learning.csv`` rows."""

    def when(row: dict[str, str] | None) -> str:
        if row is None:
            return "-"
        return f"{int(row['step']):,} ({_number(row['flops']):.1e})"

    out = []
    for run, rows in curves.items():
        own = " ".join(overrides.get(run, []))
        if not rows:
            out.append([run, own, "(no validation yet)", "", "", "", "", "", "", ""])
            continue
        last = rows[-1]
        cosine = _number(last.get("hidden_cosine"))
        for head in heads(last):
            prefix = (last.get(f"metric:{head}") or "").removesuffix("_acc_at_mask")
            distinct = _number(last.get(f"{prefix}_distinct_answers"))
            out.append(
                [
                    run,
                    own,
                    head,
                    when(first(rows, head, (ABOVE, PAST))),
                    when(first(rows, head, (PAST,))),
                    f"{int(last['step']):,} ({_number(last['flops']):.1e})",
                    f"{_number(last[f'value:{head}']):.3f} vs {_number(last[f'baseline:{head}']):.3f}",
                    last[f"status:{head}"],
                    "-" if math.isnan(cosine) else f"{cosine:.2f}",
                    "-" if math.isnan(distinct) else f"{int(distinct):,}",
                ]
            )
    return out


def curves_csv(curves: dict[str, list[dict[str, str]]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["arm", "step", "tokens", "flops", "head", "value", "baseline", "status", "hidden_cosine"])
    for run, rows in curves.items():
        for row in rows:
            for head in heads(row):
                writer.writerow(
                    [
                        run,
                        row["step"],
                        row["tokens"],
                        row["flops"],
                        head,
                        row[f"value:{head}"],
                        row[f"baseline:{head}"],
                        row[f"status:{head}"],
                        row.get("hidden_cosine", ""),
                    ]
                )
    return out.getvalue()


def write_recipe_report(
    runs: list[Path], report: Path, overrides: dict[str, list[str]], common: list[str], about: str = ""
) -> Path:
    """``report.json``, ``report.md`` and ``curves.csv`` in ``report`` (module docstring), from the
    ``learning.csv`` of every run there is; ``common``: the settings every run shares (the study's
    ``pretrain``), ``about``: what the study asks, in a sentence or two."""
    curves = {run.name: read_rows(run / LEARNING) for run in runs if run.is_dir()}
    text = (
        f'{about} Common to every arm: `{typed_command(" ".join(common))}`. "Above/past from": the first validation '
        f"from which the head stayed above (past) its trivial baseline to the last one; hidden cosine: "
        f"the mean cosine between the encoder's final hidden states at held-out tokens (near 1: every "
        f"token looks alike); distinct answers: the different tokens a masked head answers at [MASK]."
    ).strip()
    write_table_report(
        report, "Recipe arms: when each head left its baseline", COLUMNS, summary_rows(overrides, curves), text
    )
    atomic.write_text(report / "curves.csv", curves_csv(curves))
    return report


__all__ = ["COLUMNS", "curves_csv", "first", "summary_rows", "write_recipe_report"]

"""``<run>/learning.csv``: each validation's learning checks, against tokens and FLOPs.

Every validation of a run scores its heads on held-out batches beside their trivial baselines
(``objectives.learning``); this callback keeps one row per validation, whatever the logger: the
step, tokens and FLOPs so far, every learning metric and each head's verdict. It is the run's
learning curve, read by studies (``studies.intrinsic.learning_curves``) to say when each head left
its baseline. A resumed run validates again from its checkpoint's step: rows from that step on are
replaced, so the file never holds two histories.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import lightning as L

from pretrainlab import atomic

FILE = "learning.csv"


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """The rows of a ``learning.csv`` (empty if there is none)."""
    path = Path(path)
    return list(csv.DictReader(io.StringIO(path.read_text()))) if path.is_file() else []


def heads(row: dict[str, str]) -> list[str]:
    """The heads a row judges (its ``status:<head>`` columns), in their order."""
    return [k.split(":", 1)[1] for k in row if k.startswith("status:")]


class LearningLog(L.Callback):
    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / FILE

    def on_validation_end(self, trainer: L.Trainer, pl_module) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero or not getattr(pl_module, "learning_row", None):
            return
        row = pl_module.learning_row
        rows = [r for r in read_rows(self.path) if int(r["step"]) < row["step"]] + [row]
        columns = list(dict.fromkeys(k for r in rows for k in r))
        out = io.StringIO()
        writer = csv.DictWriter(out, columns, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        atomic.write_text(self.path, out.getvalue())


__all__ = ["FILE", "LearningLog", "heads", "read_rows"]

"""Compare encoders: objective x task (GLUE, NER, BLiMP, probes), mean ± std over seeds, and a GLUE
score.

Conventions (also printed under every table):

- a task's **score** is the mean of its metrics x 100 (MRPC/QQP: F1 and accuracy; STS-B: Pearson and
  Spearman; MNLI: matched and mismatched accuracy; CoLA: Matthews correlation x 100);
- the **GLUE score** of an encoder is the mean of its task scores over the tasks every compared
  encoder has, leaving out WNLI as the BERT paper did (Devlin et al., 2019, Table 1);
- mean ± std are over seeds (std with ddof=1; 0 for a single seed), with a 95% confidence interval and,
  against a ``baseline`` row, paired differences and p-values (see ``pretrainlab.uncertainty``);
- results of encoder snapshots (``fraction`` < 1) are left out of the table and make :func:`curve`.

Inputs are results files (``experiments/suite.py`` and ``finetune.py`` write them) found under the
given directories, or the fine-tuning runs of a W&B project (``wandb:<entity>/<project>``).

One module per job:

    collect.py      read results files (and W&B runs) and check them against each other
    statistics.py   aggregate: means, sds, GLUE score, intervals, differences, seeds needed, curves
    tables.py       Markdown and CSV
    plots.py        figures
    report.py       write_report: all of the above into one report directory
    measurements.py a tool's measurements as a report (write_table_report), which the docs cite

Logging a comparison to W&B is ``pretrainlab.runtime.wandb_runs.log_comparison``.
"""

from pretrainlab.compare.collect import CompareError, as_final, collect, encoder_of, is_final, row_labels
from pretrainlab.compare.report import write_report
from pretrainlab.compare.statistics import aggregate, curve, item_outcomes
from pretrainlab.compare.tables import to_csv, to_markdown

__all__ = [
    "CompareError",
    "aggregate",
    "as_final",
    "collect",
    "curve",
    "encoder_of",
    "is_final",
    "item_outcomes",
    "row_labels",
    "to_csv",
    "to_markdown",
    "write_report",
]

"""The nine GLUE tasks: where their data lives (hub and local layout), what the columns mean and
how they are scored.

Local files follow the layout of GLUE's ``download_glue_data.py`` and are read exactly as they
come: CoLA has no header, MRPC starts with a byte-order mark, STS-B has ten columns, MNLI has two
dev sets. Columns are found by index and checked against the header's names, so a file with a
different layout fails with a message instead of training on the wrong column.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TaskSpec:
    name: str  # cola, sst2, ...
    directory: str  # CoLA, SST-2, ...: the task's name as GLUE writes it, and its local directory
    metrics: tuple[str, ...]  # keys of pretrainlab.evaluation.glue.metrics.METRICS
    labels: tuple[str, ...] | None  # label strings in label-id order; None: regression (STS-B)
    text_a: tuple[int, str | None]  # (column index, header name) in the local TSV
    text_b: tuple[int, str | None] | None
    label: tuple[int, str | None]  # index -1: the last column
    header: bool = True
    hub_columns: tuple[str, ...] = ("sentence",)
    # eval split name -> (local file, metric suffix); the hub uses the split names
    eval_splits: dict[str, tuple[str, str]] = field(default_factory=lambda: {"validation": ("dev.tsv", "")})

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    @property
    def is_pair(self) -> bool:
        return self.text_b is not None

    @property
    def files(self) -> list[str]:
        """The files it reads in its folder of a local GLUE directory: ``train.tsv`` and its dev splits'."""
        return ["train.tsv", *(filename for filename, _ in self.eval_splits.values())]

    def metric_names(self) -> list[str]:
        """Metric keys of this task's results: e.g. ``mcc``, ``f1`` + ``accuracy``, ``accuracy_m``."""
        return [f"{m}{suffix}" for _, suffix in self.eval_splits.values() for m in self.metrics]


_BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")

TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in [
        TaskSpec("cola", "CoLA", ("mcc",), _BINARY, text_a=(3, None), text_b=None, label=(1, None), header=False),
        TaskSpec("sst2", "SST-2", ("accuracy",), _BINARY, text_a=(0, "sentence"), text_b=None, label=(1, "label")),
        TaskSpec(
            "mrpc",
            "MRPC",
            ("f1", "accuracy"),
            _BINARY,
            text_a=(3, "#1 String"),
            text_b=(4, "#2 String"),
            label=(0, "Quality"),
            hub_columns=("sentence1", "sentence2"),
        ),
        TaskSpec(
            "qqp",
            "QQP",
            ("f1", "accuracy"),
            _BINARY,
            text_a=(3, "question1"),
            text_b=(4, "question2"),
            label=(5, "is_duplicate"),
            hub_columns=("question1", "question2"),
        ),
        TaskSpec(
            "stsb",
            "STS-B",
            ("pearson", "spearman"),
            None,
            text_a=(7, "sentence1"),
            text_b=(8, "sentence2"),
            label=(9, "score"),
            hub_columns=("sentence1", "sentence2"),
        ),
        TaskSpec(
            "mnli",
            "MNLI",
            ("accuracy",),
            ("entailment", "neutral", "contradiction"),
            text_a=(8, "sentence1"),
            text_b=(9, "sentence2"),
            label=(-1, "gold_label"),
            hub_columns=("premise", "hypothesis"),
            eval_splits={
                "validation_matched": ("dev_matched.tsv", "_m"),
                "validation_mismatched": ("dev_mismatched.tsv", "_mm"),
            },
        ),
        TaskSpec(
            "qnli",
            "QNLI",
            ("accuracy",),
            _NLI2,
            text_a=(1, "question"),
            text_b=(2, "sentence"),
            label=(3, "label"),
            hub_columns=("question", "sentence"),
        ),
        TaskSpec(
            "rte",
            "RTE",
            ("accuracy",),
            _NLI2,
            text_a=(1, "sentence1"),
            text_b=(2, "sentence2"),
            label=(3, "label"),
            hub_columns=("sentence1", "sentence2"),
        ),
        TaskSpec(
            "wnli",
            "WNLI",
            ("accuracy",),
            _BINARY,
            text_a=(1, "sentence1"),
            text_b=(2, "sentence2"),
            label=(3, "label"),
            hub_columns=("sentence1", "sentence2"),
        ),
    ]
}


def get_task(name: str) -> TaskSpec:
    key = name.lower().replace("-", "")
    if key not in TASKS:
        raise KeyError(f"unknown GLUE task {name!r}; the tasks are: {', '.join(TASKS)}.")
    return TASKS[key]

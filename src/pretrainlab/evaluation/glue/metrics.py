"""GLUE metrics, as the benchmark defines them (numpy only; tested against scikit-learn / scipy).

CoLA    Matthews correlation
MRPC    F1 (of the positive class) and accuracy       QQP  the same
STS-B   Pearson and Spearman correlation
others  accuracy (MNLI: on the matched and the mismatched dev sets)
"""

from __future__ import annotations

import numpy as np


def accuracy(pred: np.ndarray, label: np.ndarray) -> float:
    return float(np.mean(np.asarray(pred) == np.asarray(label)))


def f1(pred: np.ndarray, label: np.ndarray) -> float:
    """F1 of the positive class (label 1); 0 when there is no true positive."""
    pred, label = np.asarray(pred) == 1, np.asarray(label) == 1
    tp = float(np.sum(pred & label))
    denom = float(np.sum(pred) + np.sum(label))
    return 2.0 * tp / denom if tp > 0 else 0.0


def matthews_corrcoef(pred: np.ndarray, label: np.ndarray) -> float:
    """Binary Matthews correlation; 0 when a row or column of the confusion matrix is empty."""
    pred, label = np.asarray(pred) == 1, np.asarray(label) == 1
    tp = float(np.sum(pred & label))
    tn = float(np.sum(~pred & ~label))
    fp = float(np.sum(pred & ~label))
    fn = float(np.sum(~pred & label))
    denom = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return float((tp * tn - fp * fn) / denom) if denom > 0 else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    x, y = x - x.mean(), y - y.mean()
    denom = np.sqrt(np.sum(x * x) * np.sum(y * y))
    return float(np.sum(x * y) / denom) if denom > 0 else 0.0


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank (as scipy.stats.rankdata)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    # boundaries of runs of equal values
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_x)) + 1]
    ends = np.r_[starts[1:], len(x)]
    avg = (starts + ends + 1) / 2.0  # mean of ranks start+1 .. end
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return pearson(_ranks(x), _ranks(y))


METRICS = {"accuracy": accuracy, "f1": f1, "mcc": matthews_corrcoef, "pearson": pearson, "spearman": spearman}


def compute(names: list[str], pred: np.ndarray, label: np.ndarray) -> dict[str, float]:
    return {name: METRICS[name](pred, label) for name in names}


def no_skill(names: list[str], train_labels: np.ndarray, eval_labels: np.ndarray, regression: bool) -> dict[str, float]:
    """The metrics of a constant prediction learnt from the training labels alone: the majority class
    (the train mean for regression, whose correlations are then 0). The level an encoder must
    beat to have learnt anything from the text."""
    train_labels = np.asarray(train_labels)
    if regression:
        constant = float(train_labels.mean())
    else:
        values, counts = np.unique(train_labels, return_counts=True)
        constant = values[np.argmax(counts)]
    return compute(names, np.full(len(eval_labels), constant), np.asarray(eval_labels))

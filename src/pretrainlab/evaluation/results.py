"""Results files of every evaluation, and the checks that decide whether a finished result may be reported.

``evaluation.run`` writes one JSON file per (encoder, task, seed): ``results.json`` in its run
directory, or ``<suite>/<task>/seed<k>.json`` in an evaluation suite. A result is reported (by the suite
that skips it as done, or by the comparison) only when

- the file is readable, complete JSON, and its metrics are finite numbers (:func:`read_result`);
- it was computed for the encoder that is there now (:func:`check_encoder`: the hash of its
  weights, not its path; a run directory pretrained again holds another encoder);
- it was computed with the settings asked for (:func:`check_settings`: the task's recipe, the data
  source and the optimizer) and on the same data files (:func:`check_data`: their sha256, so a dev
  file edited in place is noticed).

Each refusal is a :class:`ResultError` naming the file, what is wrong and what to do.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from pretrainlab.evaluation.base import get, known
from pretrainlab.runtime.provenance import describe, differences

# what a result depends on, beyond the encoder and the seed (trainer, logger and compile settings change
# how it runs, not what it computes): the task's recipe, the optimizer, and the block of data settings
# its evaluation reads (``Evaluation.data_block``: glue, ner, blimp, ...). The class a task config names
# (``task._target_``) is code, as the rest of the package is: a class renamed computes what it computed.
RESULT_SETTINGS = ("task", "optim")
NOT_SETTINGS = ("task._target_",)


def settings_groups(task: str) -> tuple[str, ...]:
    return (*RESULT_SETTINGS, get(task).data_block if known(task) else "glue")


# settings added since results were first written, with the value that results without them were made with
LEGACY = {"glue.group_by_length": False, "glue.synthetic.unseen_words": 0.0}
_RESULTS_FILE = re.compile(r"results\.json|seed\d+\.json")

AGAIN = (
    "Delete it (or move it away) to fine-tune that task and seed again: experiments/suite.py and ablate.py re-run "
    "exactly the results that are missing."
)


class ResultError(ValueError):
    """A results file that cannot be reported as asked: unreadable, incomplete, not finite, of
    another encoder, settings or data."""


def is_result(d: object) -> bool:
    return isinstance(d, dict) and "task" in d and "metrics" in d and "label" in d and "seed" in d


def is_results_file(path: Path) -> bool:
    """Whether ``path`` is named as fine-tuning names its results (``results.json``, ``seed<k>.json``)."""
    return _RESULTS_FILE.fullmatch(Path(path).name) is not None


def read_result(path: Path) -> dict:
    """The result in ``path``: complete JSON with a task, seed, label and finite metrics."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ResultError(f"{path} cannot be read ({e}). {AGAIN}") from None
    if not text.strip():
        raise ResultError(f"{path} is empty: a copy or a write that was cut short? {AGAIN}")
    try:
        d = json.loads(text)
    except ValueError as e:
        raise ResultError(f"{path} is not complete JSON ({e}): a copy or a write that was cut short? {AGAIN}") from None
    if not is_result(d) or not isinstance(d["metrics"], dict) or not d["metrics"]:
        raise ResultError(f"{path} is not a GLUE result (it needs task, seed, label and metrics). {AGAIN}")
    bad = {
        k: v
        for k, v in d["metrics"].items()
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
    }
    if bad:
        raise ResultError(
            f"{path} holds metrics that are not finite numbers ({', '.join(f'{k}={v}' for k, v in bad.items())}"
            f"): the fine-tuning run diverged or the file was damaged; a mean over it would be "
            f"meaningless. {AGAIN}"
        )
    contradictions = get(d["task"]).contradictions(d) if known(d["task"]) else []
    if contradictions:
        raise ResultError(
            f"{path} contradicts its own record: {'; '.join(contradictions)}. Was it edited after it was written? "
            f"{AGAIN}"
        )
    return d


def check_encoder(result: dict, identity: dict, init: str, path: Path) -> None:
    """Refuse ``result`` (read from ``path``) unless it was computed for the encoder ``identity``
    (``export.pretrained.encoder_identity``) describes, with the same ``init``."""
    was = result.get("pretrained") or {}
    if was.get("encoder_id") == identity["encoder_id"] and was.get("init") == init:
        return
    if "encoder_id" not in was:
        why = "was written before results recorded their encoder's hash, so it cannot be matched to this encoder"
    elif was.get("init") != init:
        why = f"holds init={was.get('init')} results, and the encoder asked for is init={init}"
    else:
        why = (
            f"holds results of another encoder (weights {str(was.get('weights_sha256'))[:12]}, the encoder there now "
            f"has {identity['weights_sha256'][:12]}: it was pretrained again or replaced)"
        )
    raise ResultError(
        f"{path} {why}. Use another output_dir for this encoder, or move the old results away to run them again."
    )


def check_place(result: dict, task: str, seed: int, path: Path) -> None:
    """Refuse ``result`` when it is of another task or seed than its file's place says (a file
    copied or renamed into the wrong place)."""
    if result["task"] != task or result["seed"] != seed:
        raise ResultError(
            f"{path} holds the result of {result['task']} seed {result['seed']}, not of {task} seed "
            f"{seed} as its place says: it was copied or renamed. {AGAIN}"
        )


def check_settings(result: dict, now: dict, path: Path) -> None:
    """Refuse ``result`` when it was made with other settings (:func:`settings_groups`) than ``now``
    (a resolved fine-tuning config)."""
    was = result.get("config")
    if not was:
        return
    groups = settings_groups(result["task"])
    changed = [d for group in groups for d in differences(was.get(group), now.get(group), group, LEGACY, NOT_SETTINGS)]
    if changed:
        raise ResultError(
            f"{path} was fine-tuned with other settings ({describe(changed)}): reporting it beside this "
            f"suite's results would mix two experiments. Use another output_dir for these settings, or "
            f"move the old results away to run them again."
        )


def changed_files(a: dict, b: dict) -> list[str]:
    """The data files (name -> sha256) whose hashes differ between ``a`` and ``b``, one missing
    from either included, sorted."""
    return sorted(name for name in set(a) | set(b) if a.get(name) != b.get(name))


def check_data(result: dict, digests: dict | None, path: Path) -> None:
    """Refuse ``result`` when the data files it was computed on (their sha256, recorded as
    ``data.files``) differ from ``digests`` (the files there now)."""
    was = ((result.get("data") or {}).get("files")) or None
    if not was or not digests:
        return
    changed = changed_files(was, digests)
    if changed:
        raise ResultError(
            f"{path} was computed on other data: {', '.join(changed)} changed since (sha256 "
            f"{str(was.get(changed[0]))[:12]} then, {str(digests.get(changed[0]))[:12]} now). Its scores are "
            f"not this data's. {AGAIN}"
        )


def settings_of(result: dict) -> dict[str, Any]:
    """The recorded settings a result's comparability depends on, for comparing results with each
    other: :func:`settings_groups` without the data directory's path (its files' hashes are compared)."""
    config = result.get("config") or {}
    out = {group: config.get(group) for group in settings_groups(result["task"]) if config.get(group) is not None}
    for group, block in out.items():
        if group not in RESULT_SETTINGS and isinstance(block, dict):
            out[group] = {k: v for k, v in block.items() if k != "data_dir"}
        elif group == "task" and isinstance(block, dict):
            out[group] = {k: v for k, v in block.items() if f"task.{k}" not in NOT_SETTINGS}
    return out


__all__ = [
    "changed_files",
    "AGAIN",
    "LEGACY",
    "RESULT_SETTINGS",
    "settings_groups",
    "ResultError",
    "check_data",
    "check_encoder",
    "check_place",
    "check_settings",
    "is_result",
    "is_results_file",
    "read_result",
    "settings_of",
]

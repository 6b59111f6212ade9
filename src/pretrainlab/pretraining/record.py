"""What a pretraining run records of itself, and the check that a run directory holds the run a
config asks for.

Every export (``encoder/``, ``snapshots/<fraction>/``) records in its ``config.json`` the run's
resolved config and the identity of its data (:func:`data_identity`: the corpus files' fingerprint
and the tokenizer's). A study that finds a run directory already pretrained, or interrupted, calls
:func:`check_same_run` before it skips or resumes it: a run made with other settings (another
budget, learning rate, corpus, tokenizer, ...) is refused, naming what differs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from pretrainlab.export.native import CONFIG
from pretrainlab.runtime.checkpoints import data_differences
from pretrainlab.runtime.provenance import ADDED_SETTINGS as LEGACY
from pretrainlab.runtime.provenance import PRETRAINING_HOW, SettingsMismatch, describe, differences


def data_identity(cfg: DictConfig) -> dict:
    """The corpus's fingerprint (for local files: their names, sizes and contents' hashes) and the
    tokenizer's (its settings and corpus, or the pretrained file's hash). A local corpus is read
    once per process to hash it (about a second per 1.5 GB); nothing else is read."""
    return identity(instantiate(cfg.data).fingerprint(), instantiate(cfg.tokenizer))


def identity(corpus_fingerprint: str, tokenizer_spec: Any) -> dict:
    """The data identity a run records (exports, checkpoints) from its corpus's fingerprint and its
    tokenizer spec."""
    return {"corpus": corpus_fingerprint, "tokenizer": tokenizer_spec.key(corpus_fingerprint)}


def recorded(run_dir: Path) -> tuple[dict, dict | None, str] | None:
    """(config, data identity or None, what) of the run in ``run_dir``: from its exported encoder
    (``what`` = "pretrained") or, for a run that has not finished, from its ``config.yaml``
    (``what`` = "started"); None when it holds neither."""
    export = run_dir / "encoder" / CONFIG
    if export.is_file():
        pre = json.loads(export.read_text()).get("pretraining") or {}
        if pre.get("config"):
            return pre["config"], pre.get("data"), "pretrained"
    if (run_dir / "config.yaml").is_file():
        return cast(dict, OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))), None, "started"
    return None


def check_same_run(run_dir: Path, cfg: DictConfig) -> None:
    """Refuse ``run_dir`` as the run ``cfg`` describes when it was pretrained (or started) with other
    settings: every key of the composed config but :data:`PRETRAINING_HOW`, and the corpus and
    tokenizer it was trained on."""
    found = recorded(run_dir)
    if found is None:
        return
    was, data_was, what = found
    now = OmegaConf.to_container(cfg, resolve=True)
    changed = differences(was, now, legacy=LEGACY, ignore=PRETRAINING_HOW)
    if data_was:
        changed += data_differences(data_was, data_identity(cfg))
    if not changed:
        return
    if what == "pretrained":
        head = (
            f"{run_dir} holds an encoder pretrained with other settings than asked for now ({describe(changed)}): "
            f"reporting it would put one experiment's encoder under another's settings."
        )
    else:
        head = (
            f"{run_dir} holds an interrupted run started with other settings than asked for now "
            f"({describe(changed)}): resuming it would mix the two."
        )
    raise SettingsMismatch(
        f"{head} Use another study name (study=<name>) for these settings, or move {run_dir} away to pretrain it again."
    )


__all__ = ["LEGACY", "check_same_run", "data_identity", "identity", "recorded"]

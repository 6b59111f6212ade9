"""Pretraining runs trained together (pretraining.group): each run of a fused group is the run trained
alone in every output (losses, weights, checkpoints and their resumption, export, learning.csv,
train.log, W&B run), up to float rounding; what cannot fuse is refused before any run starts."""

import csv
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pretrainlab.config import ConfigError
from pretrainlab.pretraining.group import Member, run_together, why_not
from pretrainlab.pretraining.module import PretrainModule
from pretrainlab.pretraining.run import run
from tests.conftest import SMALL, compose_train

# the slot's recipe on the tiny encoder: no dropout, batches of one shape
FUSABLE = (
    *SMALL,
    "model.hidden_dropout=0",
    "model.attention_dropout=0",
    "static_shapes=true",
    "max_steps=30",
    "val_every=15",
    "checkpoint_every=10",
)
RUNS = [("roberta", 0), ("roberta", 1), ("bert", 0)]  # two seeds of one objective, and one with a pooled pair head


def _cfg(objective: str, seed: int, *more: str):
    return compose_train(*FUSABLE, f"objective={objective}", f"seed={seed}", *more)


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return {
        **load_file(str(run_dir / "encoder" / "encoder.safetensors")),
        **{f"objective.{k}": v for k, v in load_file(str(run_dir / "encoder" / "objective.safetensors")).items()},
    }


def _learning(run_dir: Path) -> list[dict]:
    with open(run_dir / "learning.csv") as f:
        return list(csv.DictReader(f))


def _assert_same_run(fused: Path, alone: Path, validations: int = 2) -> None:
    a, f = _weights(alone), _weights(fused)
    assert a.keys() == f.keys()
    for key in a:
        torch.testing.assert_close(f[key], a[key], atol=2e-5, rtol=1e-4, msg=f"{fused.name}: {key}")
    rows_a, rows_f = _learning(alone), {r["step"]: r for r in _learning(fused)}
    assert len(rows_a) == validations and {r["step"] for r in rows_a} <= set(rows_f)  # a stop adds the row of its step
    for ra in rows_a:
        rf = rows_f[ra["step"]]
        assert rf["tokens"] == ra["tokens"] and rf["flops"] == ra["flops"]
        for key in ra:
            if key.startswith("value:"):
                assert float(rf[key]) == pytest.approx(float(ra[key]), rel=1e-4, abs=1e-5), (fused.name, key)


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """The three runs, each trained alone."""
    root = tmp_path_factory.mktemp("alone")
    return {(o, s): (root / f"{o}-s{s}", run(_cfg(o, s), root / f"{o}-s{s}")) for o, s in RUNS}


def test_each_run_of_a_fused_group_is_the_run_trained_alone(alone, tmp_path):
    """Two seeds of RoBERTa and a BERT (its pooler trained, RoBERTa's frozen) in one group: each run's final
    weights (encoder and heads), held-out checks at every validation, token and FLOP counts, validation
    loss and checkpoint are its run alone's; its train.log holds its own lines only."""
    members = [Member(_cfg(o, s), tmp_path / f"{o}-s{s}") for o, s in RUNS]
    results = run_together(members)
    for (o, s), member, result in zip(RUNS, members, results, strict=True):
        alone_dir, alone_result = alone[(o, s)]
        _assert_same_run(member.run_dir, alone_dir)
        assert result["global_step"] == alone_result["global_step"] == 30
        assert result["val/loss"] == pytest.approx(alone_result["val/loss"], rel=1e-4)
        assert result["encoder_dir"] == str(member.run_dir / "encoder")
        # a checkpoint holds this run's weights only (views of the stack would save all three runs' weights):
        # the size of the run alone's, but for the paths it records
        size = (member.run_dir / "checkpoints" / "last.ckpt").stat().st_size
        assert abs(size - (alone_dir / "checkpoints" / "last.ckpt").stat().st_size) < 2_000
        log = (member.run_dir / "train.log").read_text()
        assert str(member.run_dir) in log and "finished: step 30" in log
        for other in members:
            if other is not member:
                assert str(other.run_dir) not in log, (member.run_dir.name, other.run_dir.name)


def test_a_fused_group_stopped_by_a_signal_resumes_alone_or_together_to_the_uninterrupted_runs(
    alone, tmp_path, monkeypatch
):
    """A SIGTERM during the group's training: every run saves its checkpoint at the end of its step and the
    group exits with 143, as a run alone does. Resumed (one run alone, the others together again), each
    ends where its uninterrupted run alone ends."""
    original = PretrainModule.on_train_batch_end
    sent = []

    def signalled(self, outputs, batch, batch_idx):
        original(self, outputs, batch, batch_idx)
        if self.global_step == 12 and not sent:
            sent.append(self.global_step)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(PretrainModule, "on_train_batch_end", signalled)
    members = [Member(_cfg(o, s), tmp_path / f"{o}-s{s}") for o, s in RUNS]
    with pytest.raises(SystemExit) as stop:
        run_together(members)
    assert stop.value.code == 143
    monkeypatch.setattr(PretrainModule, "on_train_batch_end", original)
    steps = []
    for m in members:
        saved = torch.load(m.run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        steps.append(saved["global_step"])
        assert not (m.run_dir / "encoder").exists()
    assert all(12 <= step < 30 for step in steps), steps
    first, *others = members
    run(_cfg(*RUNS[0], "ckpt_path=last"), first.run_dir)
    run_together([Member(_cfg(o, s, "ckpt_path=last"), m.run_dir) for (o, s), m in zip(RUNS[1:], others, strict=True)])
    for (o, s), m in zip(RUNS, members, strict=True):
        _assert_same_run(m.run_dir, alone[(o, s)][0])


def test_runs_that_cannot_fuse_are_refused_before_any_run_starts(tmp_path):
    """Each setting that would make a run of the group differ from the run alone, or that a group cannot
    train, is refused with the setting, before any run directory is made."""
    assert why_not(_cfg("roberta", 0)) is None
    cases = {
        "dropout": compose_train(*SMALL, "static_shapes=true", "objective=roberta"),
        "needs more than one encoder call": _cfg("electra", 0),
        "share_layers": _cfg("albert", 0, "model.share_layers=true"),
        "static_shapes": _cfg("roberta", 0, "static_shapes=false"),
        "device_batch_size": _cfg("roberta", 0, "device_batch_size=8"),
        "on_nonfinite": _cfg("roberta", 0, "on_nonfinite=skip"),
    }
    for expected, cfg in cases.items():
        with pytest.raises(ConfigError, match=expected):
            run_together([Member(_cfg("roberta", 1), tmp_path / "ok"), Member(cfg, tmp_path / "bad")])
    with pytest.raises(ConfigError, match="model.hidden_size differs"):
        run_together(
            [
                Member(_cfg("roberta", 0), tmp_path / "a"),
                Member(_cfg("roberta", 1, "model.hidden_size=64"), tmp_path / "b"),
            ]
        )
    assert not list(tmp_path.iterdir())


def test_each_run_of_a_fused_group_logs_to_a_wandb_run_of_its_own(tmp_path, monkeypatch):
    """logger=wandb (offline here): the group's runs log at the same time from one process, each to a W&B run of
    its own (its name, id and losses; nothing of the other run's), closed with its run's exit status."""
    from wandb.sdk.wandb_run import Run

    monkeypatch.setenv("WANDB_MODE", "offline")
    finished = {}
    finish = Run.finish

    def recorded(self, exit_code=None, **kwargs):
        finished[self.id] = exit_code
        return finish(self, exit_code=exit_code, **kwargs)

    monkeypatch.setattr(Run, "finish", recorded)
    more = ("logger=wandb", "logger.project=group", "max_steps=4", "val_every=4")
    members = [Member(_cfg("roberta", s, *more), tmp_path / f"s{s}") for s in (0, 1)]
    run_together(members)
    ids = [(m.run_dir / ".wandb_id").read_text().split()[0] for m in members]
    assert ids[0] != ids[1] and finished == dict.fromkeys(ids, 0)  # each closed with its run's exit status
    for mine, theirs, m in zip(ids, ids[::-1], members, strict=True):
        (log,) = (m.run_dir / "wandb").glob("offline-run-*/run-*.wandb")
        data = log.read_bytes()
        assert mine.encode() in data and b"val/mlm_loss" in data and f"roberta-model-s{m.cfg.seed}".encode() in data
        assert theirs.encode() not in data and f"roberta-model-s{1 - m.cfg.seed}".encode() not in data


def test_a_study_with_fuse_pretraining_trains_each_objectives_seeds_as_one_group(tmp_path, caplog):
    """fuse_pretraining=true: a study of RoBERTa and ELECTRA, two seeds each: RoBERTa's seeds train as one
    fused group in a process of their own (jobs=2), beside ELECTRA's, which train one by one with
    the reason in the log; each RoBERTa run is the run its own config (config.yaml) trains alone."""
    from omegaconf import OmegaConf

    from pretrainlab.studies.ablation import run_study
    from tests.conftest import compose_config

    quoted = lambda xs: "[" + ",".join(f'"{x}"' for x in xs) + "]"  # noqa: E731
    pretrain = [*FUSABLE[:-3], "max_steps=10", "val_every=5", "checkpoint_every=1000"]
    cfg = compose_config(
        "ablate",
        "study=fused",
        f"output_root={tmp_path}",
        "objectives=[roberta,electra]",
        "seeds=[0,1]",
        "evals=[]",
        "scratch=false",
        "intrinsic=false",
        "fuse_pretraining=true",
        "jobs=2",
        f"pretrain={quoted(pretrain)}",
    )
    with caplog.at_level("INFO", logger="pretrainlab"):
        run_study(cfg)
    runs = tmp_path / "fused" / "pretrain"
    text = caplog.text + "".join(p.read_text() for p in (tmp_path / "fused" / "logs").glob("pretrain-*.log"))
    assert "fused group of 2 runs" in text and "roberta-s0, roberta-s1" in text
    for seed in (0, 1):
        assert (
            f"pretraining electra-s{seed} alone, not fused: objective=electra needs more than one encoder call" in text
        )
        assert (runs / f"electra-s{seed}" / "encoder" / "config.json").is_file()
        fused = runs / f"roberta-s{seed}"
        alone = tmp_path / "alone" / f"roberta-s{seed}"
        run(OmegaConf.load(fused / "config.yaml"), alone)
        _assert_same_run(fused, alone, validations=2)

"""A study's pretraining runs trained several at a time (``jobs``): each run in its own process, the
same runs as one at a time, a failed run named with its log, and a signal passed on to every run in
progress, which saves and resumes."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import SMALL, compose_config, run_command, start_command

ROOT = Path(__file__).resolve().parents[1]


def quoted(xs: list[str]) -> str:
    return "[" + ",".join(f'"{x}"' for x in xs) + "]"


def study_overrides(tmp_path: Path, pretrain: list[str], *extra: str) -> list[str]:
    glue = ["glue.source=synthetic", "glue.synthetic.scale=0.05", "task_overrides.epochs=1", "logger=csv"]
    glue += ["trainer.enable_progress_bar=false", "task_overrides.max_seq_len=64"]
    return [
        "study=par",
        f"output_root={tmp_path}",
        "objectives=[roberta,bert]",
        "seeds=[0]",
        f"pretrain={quoted([*SMALL, 'data.num_documents=200', *pretrain])}",
        "suite.glue_tasks=[rte]",
        "suite.seeds=[0]",
        f"suite.overrides={quoted(glue)}",
        "intrinsic=false",
        *extra,
    ]


def test_jobs_is_checked_before_anything_runs():
    from pretrainlab.studies.parallel import check_jobs

    one = compose_config("train")
    assert check_jobs(2, [one, one]) == 2
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="number of runs to train at once"):
            check_jobs(bad, [one])
    several = compose_config("train", "trainer.devices=2")
    with pytest.raises(ValueError, match="parallel already; set jobs=1"):
        check_jobs(2, [one, several])
    assert check_jobs(1, [several]) == 1


@pytest.mark.slow
def test_two_runs_at_once_are_the_runs_of_a_study_one_at_a_time(tmp_path, monkeypatch):
    """With jobs=2 both runs are trained, each in its own process with its log, and so are the encoders'
    evaluations, all forked from one server (one interpreter's imports for the study, not one per phase);
    the same study with jobs=1 then finds them finished and made with its own settings, and redoes nothing."""
    from pretrainlab.studies import forkserver
    from pretrainlab.studies.ablation import run_study

    servers = []
    popen = forkserver.ForkServer.popen
    monkeypatch.setattr(
        forkserver.ForkServer, "popen", lambda self, *a, **k: servers.append(self._proc) or popen(self, *a, **k)
    )
    overrides = study_overrides(tmp_path, ["max_steps=30", "checkpoint_every=10", "val_every=30"])
    table = run_study(compose_config("ablate", *overrides, "jobs=2"))
    assert len(servers) == 5 and len({id(s) for s in servers[1:]}) == 1, servers  # 2 runs, 3 suites: one server
    root = tmp_path / "par" / "pretrain"
    for run in ("roberta-s0", "bert-s0"):
        assert (root / run / "encoder" / "config.json").is_file()
        log = (tmp_path / "par" / "logs" / f"pretrain-{run}.log").read_text()
        assert "finished: step 30" in log and f"exported encoder -> {root / run / 'encoder'}" in log, log[-2000:]
        # its held-out checks were computed in its own process, where the study reads them back
        assert f"held-out checks -> {root / run / 'intrinsic.json'}" in log, log[-2000:]
    assert sorted(table["labels"]) == ["bert", "roberta", "scratch"]
    cost = (tmp_path / "par" / "report" / "cost.md").read_text()
    # its duration is the study's wall-clock; the runs' process time, two at a time, is not added up as one
    assert re.search(r"Wall-clock: pretraining [\d.]+ min, evaluation [\d.]+ min", cost), cost
    assert "summed over the runs (2 at a time: time that ran side by side, not a duration)" in cost
    # the three encoders' suites (two pretrained, scratch) ran in processes of their own, with their logs
    for label in ("roberta-s0", "bert-s0", "roberta-s0-scratch"):
        log = (tmp_path / "par" / "logs" / f"evaluate-{label}.log").read_text()
        assert "rte" in log, log[-2000:]

    def fail(*a, **k):
        raise AssertionError("finished work was redone")

    monkeypatch.setattr("pretrainlab.pretraining.run.run", fail)
    monkeypatch.setattr("pretrainlab.evaluation.run.run", fail)
    monkeypatch.setattr("pretrainlab.studies.parallel.run_parallel", fail)
    measured = json.loads((tmp_path / "par" / "report" / "cost.json").read_text())["wall_s"]
    assert set(measured) == {"pretraining", "evaluation"} and measured["pretraining"] > 1
    again = run_study(compose_config("ablate", *overrides, "jobs=1"))
    assert again["labels"] == table["labels"]
    # the command that found everything done reports the wall-clock of the one that did it (its own, under a
    # second, was no phase's duration: "pretraining 0.0 min")
    assert json.loads((tmp_path / "par" / "report" / "cost.json").read_text())["wall_s"] == measured


def test_every_runs_settings_are_checked_before_the_first_run_starts(tmp_path):
    from pretrainlab.config import ConfigError
    from pretrainlab.studies.ablation import run_study

    overrides = study_overrides(tmp_path, ["max_steps=20"], f"+objective_overrides.bert={quoted(['optim.lr=-1.0'])}")
    with pytest.raises(ConfigError, match="pretraining run bert-s0 of the study: optim.lr=-1.0: must be positive"):
        run_study(compose_config("ablate", *overrides))
    assert not (tmp_path / "par" / "pretrain" / "roberta-s0" / "checkpoints").exists()  # nothing trained


@pytest.mark.slow
def test_a_failed_run_is_named_with_its_log_and_the_other_run_finishes(tmp_path):
    from pretrainlab.studies.ablation import run_study

    overrides = study_overrides(
        tmp_path,
        ["max_steps=20", "checkpoint_every=10", "val_every=20"],
        "jobs=2",
        # a run that fails once started: its loss is not finite from its first step
        f"+objective_overrides.bert={quoted(['optim.lr=1.0e30'])}",
    )
    with pytest.raises(RuntimeError) as failed:
        run_study(compose_config("ablate", *overrides))
    message = str(failed.value)
    root = tmp_path / "par" / "pretrain"
    assert "pretraining bert seed 0 failed with exit status 1" in message, message
    assert (
        str(tmp_path / "par" / "logs" / "pretrain-bert-s0.log") in message and "non-finite training loss" in message
    )  # its log's end
    assert "continue the study with" in message
    assert (root / "roberta-s0" / "encoder" / "config.json").is_file()
    assert not (root / "bert-s0" / "encoder").exists()


@pytest.mark.slow
def test_a_signal_to_the_study_stops_every_run_at_a_checkpoint_and_the_study_resumes(tmp_path):
    """SIGTERM to the study while both runs train: each saves a checkpoint and stops, the study exits
    143 with the command that continues it; that command resumes both runs from their checkpoints."""
    overrides = study_overrides(tmp_path, ["max_steps=150", "checkpoint_every=5", "val_every=150"], "jobs=2")
    command = [sys.executable, str(ROOT / "experiments" / "ablate.py"), *overrides]
    root = tmp_path / "par" / "pretrain"
    study = start_command(command, cwd=tmp_path, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while not all((root / r / "checkpoints" / "last.ckpt").is_file() for r in ("roberta-s0", "bert-s0")):
        assert study.poll() is None and time.time() < deadline, study.communicate()[0][-3000:]
        time.sleep(0.5)
    os.kill(study.pid, signal.SIGTERM)
    out = study.communicate(timeout=300)[0]
    assert study.returncode == 143, out[-3000:]
    assert "Continue it with" in out and out.count("stopped (exit status 143; log:") == 2, out[-3000:]
    for run in ("roberta-s0", "bert-s0"):
        assert not (root / run / "encoder").exists()  # stopped before the end of its 150 steps
        assert (root / run / "checkpoints" / "last.ckpt").is_file()
        assert "saved" in (tmp_path / "par" / "logs" / f"pretrain-{run}.log").read_text().lower()
    again = run_command(command, cwd=tmp_path, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming from" in again.stdout + again.stderr
    for run in ("roberta-s0", "bert-s0"):
        assert (root / run / "encoder" / "config.json").is_file()

"""A study, a GLUE suite or a comparison reports only what was computed for it, and no run replaces
another's outputs: the settings, encoder and data of finished work are checked before it is skipped
or shown; one process at a time writes into a directory; a signal stops work with a non-zero status
and the command that continues it."""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pretrainlab.compare import CompareError, aggregate, collect, to_markdown
from pretrainlab.evaluation.results import ResultError
from pretrainlab.pretraining.record import check_same_run
from pretrainlab.pretraining.run import run as pretrain
from pretrainlab.runtime.provenance import SettingsMismatch
from pretrainlab.runtime.rundir import LOCK, RunDirBusy, RunDirError, lock, unlock
from tests.conftest import ROOT, SMALL, compose_config, compose_train, run_command, start_command

QUICK = [*SMALL, "max_steps=4", "val_every=4", "checkpoint_every=4"]
GLUE = [
    "glue.source=synthetic",
    "glue.synthetic.scale=0.05",
    "task_overrides.epochs=1",
    "task_overrides.max_seq_len=64",
    "task_overrides.batch_size=32",
    "logger=csv",
    "trainer.enable_progress_bar=false",
]


def quoted(xs: list[str]) -> str:
    return "[" + ",".join(f'"{x}"' for x in xs) + "]"


def study(root: Path, *overrides: str, pretrain: list[str] = QUICK, objectives: str = "[roberta]"):
    return compose_config(
        "ablate",
        "study=s",
        f"output_root={root}",
        f"objectives={objectives}",
        "scratch=false",
        "intrinsic=false",
        "suite.glue_tasks=[rte]",
        "suite.seeds=[0]",
        f"pretrain={quoted(pretrain)}",
        f"suite.overrides={quoted(GLUE)}",
        *overrides,
    )


def suite_cfg(pretrained, *overrides: str):
    return compose_config("suite", f"pretrained={pretrained}", *GLUE, *overrides)


def plan(cfg, tasks, seeds, output_dir=None):
    from pretrainlab.studies.suite import plan_suite

    return plan_suite(cfg, tasks, seeds, output_dir, dict(cfg.task_overrides))


def never(*a, **k):
    raise AssertionError("work was started instead of refused")


@pytest.fixture
def finished(once) -> Path:
    """A pretraining run (roberta, 4 steps) with its GLUE suite on RTE, seeds 0 and 1, made once per session
    and read-only; tests copy it."""
    from pretrainlab.studies.suite import run_suite

    def make(home: Path) -> None:
        pretrain(compose_train(*QUICK), home / "run")
        cfg = suite_cfg(home / "run")
        run_suite(cfg, ["rte"], [0, 1], None, dict(cfg.task_overrides))

    return once("test_trust-finished", make) / "run"


def copy_of(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


# --- a study checks the pretraining runs it would skip or resume ---------------------------------------
def test_a_study_refuses_encoders_pretrained_with_other_settings(tmp_path, monkeypatch):
    from pretrainlab.studies.ablation import run_study

    run_study(study(tmp_path))
    encoder = tmp_path / "s" / "pretrain" / "roberta-s0" / "encoder" / "encoder.safetensors"
    before = encoder.read_bytes()
    monkeypatch.setattr("pretrainlab.pretraining.run.run", never)
    monkeypatch.setattr("pretrainlab.evaluation.run.run", never)
    # another budget, learning rate or tokenizer: refused before any run starts (bert's is planned first)
    for change, named in (
        ("max_steps=8", "max_steps: 4 then, 8 now"),
        ("optim.lr=1.0e-4", "optim.lr: "),
        ("tokenizer.vocab_size=900", "tokenizer.vocab_size: 1000 then, 900 now"),
    ):
        with pytest.raises(SettingsMismatch, match=named) as refused:
            run_study(study(tmp_path, pretrain=[*QUICK, change], objectives="[bert,roberta]"))
        assert "study=<name>" in str(refused.value) and "roberta-s0" in str(refused.value)
    assert not (tmp_path / "s" / "pretrain" / "bert-s0").exists()
    assert encoder.read_bytes() == before
    # settings that change how a run goes, not the encoder it makes, are not differences
    table = run_study(study(tmp_path, pretrain=[*QUICK, "val_every=2", "num_workers=1", "trainer.precision=32"]))
    assert table["labels"] == ["roberta"]


def test_a_study_refuses_to_resume_an_interrupted_run_started_with_other_settings(tmp_path, monkeypatch):
    from pretrainlab.studies.ablation import run_study

    run_dir = tmp_path / "s" / "pretrain" / "roberta-s0"
    pretrain(compose_train(*QUICK, "objective=roberta", "seed=0", "max_steps=6", "export=false"), run_dir)
    monkeypatch.setattr("pretrainlab.pretraining.run.run", never)
    with pytest.raises(
        SettingsMismatch,
        match=r"interrupted run started with other settings than asked for now \(max_steps: 6 then, 4 now",
    ):
        run_study(study(tmp_path))


def test_a_setting_added_since_a_run_was_recorded_is_compared_at_the_value_it_was_made_with(tmp_path):
    """A run recorded before objective.whole_word existed was made without whole-word masking: asked
    for again with it off, it is the same run; with it on, it is another run and is refused."""
    import json

    run_dir = tmp_path / "run"
    cfg = compose_train(*QUICK, "objective=roberta", "max_steps=2", "val_every=2")
    pretrain(cfg, run_dir)
    meta_path = run_dir / "encoder" / "config.json"
    meta = json.loads(meta_path.read_text())
    del meta["pretraining"]["config"]["objective"]["whole_word"]  # as recorded before the setting existed
    meta_path.write_text(json.dumps(meta))
    check_same_run(run_dir, cfg)
    with pytest.raises(SettingsMismatch, match="objective.whole_word: False then, True now"):
        check_same_run(
            run_dir,
            compose_train(*QUICK, "objective=roberta", "max_steps=2", "val_every=2", "objective.whole_word=true"),
        )


def test_a_corpus_is_its_contents_a_changed_byte_is_a_difference_a_new_copy_is_not(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(40):
        (docs / f"{i}.txt").write_text(f"Book {i} begins here. " * 5 + "\n\nIt ends with a line of its own. " * 3)
    text = [o for o in QUICK if not o.startswith("data.")]
    cfg = compose_train(*text, "data=text", f"data.files=[{docs}]", "tokenizer.vocab_size=200")
    pretrain(cfg, tmp_path / "run")
    check_same_run(tmp_path / "run", cfg)  # the same corpus: nothing to say
    # copied anew (a backup restored, the data copied to another machine): new modification times and
    # inodes, the same bytes; the same corpus, so the run is resumed or reported, not refused
    shutil.move(docs, tmp_path / "old")
    shutil.copytree(tmp_path / "old", docs, copy_function=shutil.copy)
    for i, f in enumerate(sorted(docs.iterdir())):
        os.utime(f, ns=(time.time_ns() + i * 10**9, time.time_ns() + i * 10**9))
    check_same_run(tmp_path / "run", cfg)
    # one character edited in place, the size kept: another corpus
    f = docs / "7.txt"
    f.write_text(f.read_text().replace("Book 7", "Book 8"))
    with pytest.raises(SettingsMismatch, match="the corpus files"):
        check_same_run(tmp_path / "run", cfg)


# --- the comparison and the suite report only results that are the encoder's ---------------------------
def test_compare_refuses_results_of_an_encoder_pretrained_again(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    assert collect([str(run_dir)])  # as it is: its results are its encoder's
    pretrain(compose_train(*QUICK, "max_steps=8", "ckpt_path=last"), run_dir)  # trained further
    with pytest.raises(CompareError, match=r"glue/rte/seed0.json holds results of another encoder"):
        collect([str(run_dir)])
    done = run_command(
        [sys.executable, "experiments/compare.py", str(run_dir), "--wandb", "disabled", "--out", str(tmp_path / "cmp")],
        cwd=ROOT,
    )
    assert done.returncode == 2 and "holds results of another encoder" in done.stderr
    assert not (tmp_path / "cmp").exists()
    assert collect([str(finished)])  # the original, untouched, is still its own


@pytest.mark.parametrize("damage", ["empty", "truncated", "nan", "infinite", "text"])
def test_damaged_results_files_are_refused_naming_the_file(finished, tmp_path, damage):
    run_dir = copy_of(finished, tmp_path)
    path = run_dir / "glue" / "rte" / "seed1.json"
    text = path.read_text()
    result = json.loads(text)
    if damage == "empty":
        path.write_text("")
    elif damage == "truncated":
        path.write_text(text[: len(text) // 2])
    else:
        result["metrics"]["accuracy"] = {"nan": math.nan, "infinite": math.inf, "text": "0.5"}[damage]
        path.write_text(json.dumps(result))
    with pytest.raises(CompareError, match=re.escape(str(path))):
        collect([str(run_dir)])
    with pytest.raises(ResultError, match=re.escape(str(path))):
        plan(suite_cfg(run_dir), ["rte"], [0, 1])


def test_a_result_that_contradicts_its_own_record_is_refused(finished, tmp_path):
    """A fine-tuned result reports its last epoch: an accuracy that is not its history's was edited; so is
    a probe's score that is not its last-four probe's, or a BLiMP accuracy its pairs do not give."""
    from pretrainlab.evaluation.results import read_result

    run_dir = copy_of(finished, tmp_path)
    path = run_dir / "glue" / "rte" / "seed1.json"
    result = json.loads(path.read_text())
    was = result["history"][-1]["metrics"]["accuracy"]
    path.write_text(json.dumps({**result, "metrics": {"accuracy": 0.99}}))
    with pytest.raises(
        ResultError, match=rf"contradicts its own record: accuracy 0.99 where its last epoch's history says {was}"
    ):
        read_result(path)
    with pytest.raises(CompareError, match="contradicts its own record"):
        collect([str(run_dir)])
    with pytest.raises(ResultError, match="contradicts its own record"):
        plan(suite_cfg(run_dir), ["rte"], [0, 1])
    probe = {"task": "probe_ner", "seed": 0, "label": "x", "metrics": {"f1": 0.95}, "probes": {"last4": 0.225}}
    (tmp_path / "probe.json").write_text(json.dumps(probe))
    with pytest.raises(ResultError, match="f1 0.95 where its probe of the last four layers scored 0.225"):
        read_result(tmp_path / "probe.json")
    blimp = {"task": "blimp", "seed": 0, "label": "x", "metrics": {"accuracy": 0.9}, "items": {"a": "1100", "b": "10"}}
    (tmp_path / "blimp.json").write_text(json.dumps(blimp))
    with pytest.raises(ResultError, match="accuracy 0.9 where its 6 pairs' outcomes give 0.5"):
        read_result(tmp_path / "blimp.json")
    (tmp_path / "blimp.json").write_text(json.dumps({**blimp, "metrics": {"accuracy": 0.5}}))
    assert read_result(tmp_path / "blimp.json")["metrics"] == {"accuracy": 0.5}


def test_a_result_in_the_place_of_another_task_or_seed_is_refused(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    shutil.copy(run_dir / "glue" / "rte" / "seed0.json", run_dir / "glue" / "rte" / "seed1.json")
    with pytest.raises(ResultError, match="holds the result of rte seed 0, not of rte seed 1"):
        plan(suite_cfg(run_dir), ["rte"], [0, 1])


def test_results_computed_on_a_data_file_edited_since_are_refused(finished, tmp_path):
    from pretrainlab.evaluation.glue.synthetic import SyntheticGlue
    from pretrainlab.studies.suite import run_suite

    data = SyntheticGlue(scale=0.05).write(tmp_path / "cache")
    glue_dir = tmp_path / "glue_data"
    shutil.copytree(data, glue_dir)
    local = ["glue.source=local", f"glue.data_dir={glue_dir}"]
    cfg = suite_cfg(finished, *local)
    out = tmp_path / "suite"
    run_suite(cfg, ["rte"], [0], out, dict(cfg.task_overrides))
    assert plan(cfg, ["rte"], [0], out)[1][0].done is not None  # unchanged: done already
    dev = glue_dir / "RTE" / "dev.tsv"
    rows = dev.read_text().splitlines()
    last = rows[-1].split("\t")
    last[-1] = "entailment" if last[-1] == "not_entailment" else "not_entailment"  # one label corrected in place
    dev.write_text("\n".join([*rows[:-1], "\t".join(last)]) + "\n")
    with pytest.raises(ResultError, match=r"computed on other data: RTE/dev.tsv changed since"):
        plan(cfg, ["rte"], [0], out)
    # the comparison does not put results on two versions of the data side by side
    os.rename(out / "rte" / "seed0.json", tmp_path / "old.json")
    run_suite(cfg, ["rte"], [0], out, dict(cfg.task_overrides))
    (tmp_path / "other" / "rte").mkdir(parents=True)
    old = json.loads((tmp_path / "old.json").read_text())
    old["seed"] = 0
    (tmp_path / "other" / "rte" / "seed0.json").write_text(json.dumps({**old, "label": "roberta-old"}))
    with pytest.raises(CompareError, match="computed on different data: RTE/dev.tsv differ"):
        collect([str(out), str(tmp_path / "other")])


def _result(label, encoder, task, seed, value, config=None):
    return {
        "task": task,
        "seed": seed,
        "label": label,
        "metrics": {"accuracy": value},
        "pretrained": {"encoder_id": encoder, "model": "tiny", "pretrain_seed": 0, "run_dir": f"runs/{encoder}"},
        "eval_examples": {"validation": 277},
        "run_dir": f"runs/{encoder}/glue/{task}/seed{seed}",
        **({"config": config} if config else {}),
    }


def test_results_fine_tuned_with_other_settings_are_not_compared_side_by_side(tmp_path):
    base = {
        "task": {"name": "rte", "lr": 2e-5, "epochs": 3},
        "glue": {"source": "local", "data_dir": "/a"},
        "optim": {"lr": 2e-5},
    }
    moved = {**base, "glue": {"source": "local", "data_dir": "/elsewhere"}}  # the same files, moved: comparable
    other = {**base, "task": {**base["task"], "lr": 1e-3}}
    for name, results in (
        ("a", [_result("bert", "e1", "rte", 0, 0.6, base)]),
        ("b", [_result("roberta", "e2", "rte", 0, 0.7, moved)]),
        ("c", [_result("electra", "e3", "rte", 0, 0.7, other)]),
    ):
        (tmp_path / name / "rte").mkdir(parents=True)
        for r in results:
            (tmp_path / name / "rte" / f"seed{r['seed']}.json").write_text(json.dumps(r))
    assert len(collect([str(tmp_path / "a"), str(tmp_path / "b")])) == 2
    with pytest.raises(CompareError, match=r"rte results were fine-tuned with different settings: task.lr: 2e-05"):
        collect([str(tmp_path / "a"), str(tmp_path / "c")])


def test_a_cell_built_from_fewer_runs_says_so_and_one_run_has_no_spread():
    results = [_result("bert", "b", "rte", s, 0.6 + 0.01 * s) for s in range(3)]
    results += [_result("roberta", "r", "rte", s, 0.7 + 0.02 * s) for s in range(2)]  # a seed missing
    results += [_result("electra", "e", "rte", 0, 0.65)]  # one run
    md = to_markdown(aggregate(results))
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ") and "---" not in line}
    assert "(n=" not in rows["bert"] and "±" in rows["bert"]
    assert "(n=2)" in rows["roberta"]
    assert "65.0 (n=1)" in rows["electra"] and "±" not in rows["electra"]
    assert "(n=k): a cell built from fewer runs" in md
    assert "(n=" not in to_markdown(aggregate([r for r in results if r["label"] == "bert"]))


# --- one process per directory --------------------------------------------------------------------------
def test_a_directory_lock_refuses_a_second_process_and_is_taken_over_when_its_holder_died(tmp_path, caplog):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from pretrainlab.runtime.rundir import lock;"
            f" lock(Path({str(tmp_path)!r})); print('held', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirBusy, match=rf"in use by another process \(pid {holder.pid} "):
            lock(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / LOCK).exists()  # a killed holder leaves its file: stale, taken over
    with caplog.at_level("INFO", logger="pretrainlab"):
        lock(tmp_path)
    assert f"took over a stale lock (pid {holder.pid}" in caplog.text
    lock(tmp_path)  # again, by the same process: a count
    unlock(tmp_path)
    assert (tmp_path / LOCK).exists()
    unlock(tmp_path)
    assert not (tmp_path / LOCK).exists()


@pytest.mark.slow
def test_two_train_processes_started_on_one_directory(tmp_path):
    cmd = [
        sys.executable,
        "train.py",
        *SMALL,
        "max_steps=40",
        "val_every=40",
        "checkpoint_every=40",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    with open(tmp_path / "first.txt", "w") as err:
        first = start_command(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        t0 = time.time()
        while not (tmp_path / "run" / LOCK).exists():
            assert first.poll() is None and time.time() - t0 < 120, (tmp_path / "first.txt").read_text()[-2000:]
            time.sleep(0.05)
        second = run_command(cmd, cwd=ROOT, env=env, timeout=300)
        assert first.wait(timeout=300) == 0, (tmp_path / "first.txt").read_text()[-3000:]
    assert second.returncode == 1 and "is in use by another process" in second.stderr, second.stderr[-2000:]
    assert f"pid {first.pid}" in second.stderr
    assert (tmp_path / "run" / "encoder" / "encoder.safetensors").is_file()
    assert "finished: step 40" in (tmp_path / "run" / "train.log").read_text()
    assert not (tmp_path / "run" / LOCK).exists()


def test_fine_tuning_never_replaces_earlier_results(finished, tmp_path):
    from pretrainlab.evaluation.run import run as finetune

    cfg = compose_config(
        "finetune",
        f"pretrained={finished}",
        "task=rte",
        *[g for g in GLUE if "task_overrides" not in g],
        "task.epochs=1",
    )
    finetune(cfg, tmp_path / "ft")
    before = (tmp_path / "ft" / "results.json").read_bytes()
    again = compose_config(
        "finetune",
        f"pretrained={finished}",
        "task=rte",
        *[g for g in GLUE if "task_overrides" not in g],
        "task.epochs=1",
        "seed=1",
    )
    with pytest.raises(RunDirError, match="holds the results of an earlier fine-tuning run"):
        finetune(again, tmp_path / "ft")
    assert (tmp_path / "ft" / "results.json").read_bytes() == before
    # the command line refuses before Hydra writes anything into the directory
    cmd = [
        sys.executable,
        "finetune.py",
        f"pretrained={finished}",
        "task=rte",
        "glue.source=synthetic",
        "glue.synthetic.scale=0.05",
        "task.epochs=1",
        "logger=csv",
        f"hydra.run.dir={tmp_path / 'ft'}",
    ]
    done = run_command(cmd, cwd=ROOT)
    assert done.returncode == 1 and "holds the results of an earlier fine-tuning run" in done.stderr
    assert not (tmp_path / "ft" / ".hydra").exists() and (tmp_path / "ft" / "results.json").read_bytes() == before
    finetune(
        compose_config(
            "finetune",
            f"pretrained={finished}",
            "task=rte",
            *[g for g in GLUE if "task_overrides" not in g],
            "task.epochs=1",
            "seed=1",
            "overwrite=true",
        ),
        tmp_path / "ft",
    )
    assert json.loads((tmp_path / "ft" / "results.json").read_text())["seed"] == 1


# --- a signal stops fine-tuning with a non-zero status and what to run next -----------------------------
def test_sigterm_during_fine_tuning_exits_143_without_results(finished, tmp_path, monkeypatch, caplog):
    from pretrainlab.evaluation.glue import Classifier as FinetuneModule
    from pretrainlab.studies.suite import run_suite

    original = FinetuneModule.training_step
    sent = []

    def signal_at_step_2(self, batch, batch_idx):
        if self.global_step == 2 and not sent:  # during the third optimizer step of the first fine-tuning
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, batch, batch_idx)

    monkeypatch.setattr(FinetuneModule, "training_step", signal_at_step_2)
    run_dir = copy_of(finished, tmp_path)
    cfg = suite_cfg(run_dir, "task_overrides.epochs=2", "task_overrides.batch_size=8")
    shutil.rmtree(run_dir / "glue")
    with caplog.at_level("WARNING", logger="pretrainlab"), pytest.raises(SystemExit) as stopped:
        run_suite(cfg, ["rte"], [0, 1], None, dict(cfg.task_overrides), resume_hint="python experiments/glue.py ...")
    assert stopped.value.code == 143
    assert "SIGTERM: fine-tuning of rte (seed 0) stopped at step 3 of 8" in caplog.text
    assert "no results were written. Continue with:\n  python experiments/glue.py ..." in caplog.text
    assert not (run_dir / "glue" / "rte" / "seed0.json").exists()
    assert not (run_dir / "glue" / LOCK).exists() and not (run_dir / "glue" / "rte" / "seed0" / LOCK).exists()
    monkeypatch.undo()
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)
    assert len(run_suite(cfg, ["rte"], [0, 1], None, dict(cfg.task_overrides))) == 2  # continued: all there


@pytest.mark.slow
def test_a_study_stopped_by_sigterm_prints_the_command_that_continues_it(tmp_path):
    """SIGTERM to the study's process group during pretraining: exit 143 and the study's own
    command, which (run as printed) finishes the study."""
    pretrain_args = [*SMALL, "max_steps=300", "val_every=300", "checkpoint_every=2"]
    args = [
        "experiments/ablate.py",
        "study=s",
        f"output_root={tmp_path}",
        "objectives=[roberta]",
        "scratch=false",
        "intrinsic=false",
        "suite.glue_tasks=[rte]",
        "suite.seeds=[0]",
        f"pretrain={quoted(pretrain_args)}",
        f"suite.overrides={quoted(GLUE)}",
    ]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    checkpoints = tmp_path / "s" / "pretrain" / "roberta-s0" / "checkpoints"
    with open(tmp_path / "err.txt", "w") as err:
        proc = start_command([sys.executable, *args], cwd=ROOT, env=env, stdout=err, stderr=subprocess.STDOUT)
        t0 = time.time()
        while not (checkpoints / "last.ckpt").exists():
            assert proc.poll() is None and time.time() - t0 < 300, (tmp_path / "err.txt").read_text()[-3000:]
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=300)
    log = (tmp_path / "err.txt").read_text()
    assert code == 143, log[-3000:]
    hint = log.split("Resume with:\n", 1)[1].splitlines()[0].strip()
    assert hint.startswith("python experiments/ablate.py study=s") and "train.py" not in hint
    import shlex

    argv = shlex.split(hint)
    assert argv[1:] == args
    done = run_command([sys.executable, *argv[1:]], cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from" in done.stdout + done.stderr and (tmp_path / "s" / "report" / "comparison.md").is_file()


# --- and the ones of the same kind ----------------------------------------------------------------------
def test_fine_tuning_and_pretraining_never_share_a_directory(finished, tmp_path):
    from pretrainlab.evaluation.run import run as finetune

    run_dir = copy_of(finished, tmp_path)
    config = (run_dir / "config.yaml").read_bytes()
    ft = compose_config(
        "finetune",
        f"pretrained={run_dir}",
        "task=rte",
        "glue.source=synthetic",
        "glue.synthetic.scale=0.05",
        "task.epochs=1",
        "logger=csv",
        "trainer.enable_progress_bar=false",
    )
    with pytest.raises(RunDirError, match="holds a pretraining run .*directory of its own"):
        finetune(ft, run_dir)
    assert (run_dir / "config.yaml").read_bytes() == config
    finetune(ft, tmp_path / "ft")
    with pytest.raises(RunDirError, match="a fine-tuning run's results in results.json"):
        pretrain(compose_train(*QUICK), tmp_path / "ft")
    assert json.loads((tmp_path / "ft" / "results.json").read_text())["task"] == "rte"


def test_a_copied_run_directory_resumes_into_a_w_and_b_run_of_its_own(tmp_path, monkeypatch):
    from pretrainlab.runtime.wandb_runs import read_wandb_id

    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb = [o for o in QUICK if not o.startswith("logger=")] + ["logger=wandb"]
    pretrain(compose_train(*wandb), tmp_path / "run")
    original, where = read_wandb_id(tmp_path / "run")
    assert where == str((tmp_path / "run").resolve())
    pretrain(compose_train(*wandb, "max_steps=6", "ckpt_path=last"), tmp_path / "run")
    assert read_wandb_id(tmp_path / "run")[0] == original  # resumed in place: the same W&B run
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    pretrain(compose_train(*wandb, "max_steps=8", "ckpt_path=last"), tmp_path / "copy")
    copied, where = read_wandb_id(tmp_path / "copy")
    assert copied != original and where == str((tmp_path / "copy").resolve())


def test_a_study_reports_only_the_runs_tasks_and_seeds_it_asks_for(tmp_path):
    from pretrainlab.studies.ablation import run_study

    run_study(study(tmp_path, "suite.seeds=[0,1]", "suite.glue_tasks=[rte,cola]", objectives="[roberta,bert]"))
    table = run_study(study(tmp_path, "suite.seeds=[0]", "suite.glue_tasks=[rte]"))
    assert table["labels"] == ["roberta"] and table["tasks"] == ["rte"]
    assert table["cells"]["roberta"]["rte"]["seeds"] == [0]


def test_an_encoder_replaced_while_it_is_loaded_is_not_recorded_under_the_old_hash(finished, tmp_path, monkeypatch):
    import pretrainlab.export.pretrained as pretrained

    run_dir = copy_of(finished, tmp_path)
    other = tmp_path / "other"
    pretrain(compose_train(*QUICK, "seed=5"), other)
    original = pretrained.load_encoder

    def replaced_meanwhile(path, *a, **k):
        loaded = original(path, *a, **k)
        shutil.copy(other / "encoder" / "encoder.safetensors", run_dir / "encoder" / "encoder.safetensors")
        return loaded

    monkeypatch.setattr(pretrained, "load_encoder", replaced_meanwhile)
    with pytest.raises(RuntimeError, match="changed while it was being loaded"):
        pretrained.load_pretrained(str(run_dir))


def test_a_study_refuses_results_left_by_an_encoder_that_is_gone_before_pretraining(tmp_path, monkeypatch):
    from pretrainlab.studies.ablation import run_study

    run_study(study(tmp_path))
    shutil.rmtree(tmp_path / "s" / "pretrain" / "roberta-s0" / "encoder")
    shutil.rmtree(tmp_path / "s" / "pretrain" / "roberta-s0" / "checkpoints")
    monkeypatch.setattr("pretrainlab.pretraining.run.run", never)
    with pytest.raises(ResultError, match="holds evaluation results .* but no encoder"):
        run_study(study(tmp_path))


@pytest.mark.parametrize(
    "objective", [["objective=clm_mlm", "objective.causal_first=0.5"], ["objective.mask_rate_start=0.4"]]
)
def test_a_finished_scheduled_run_is_not_extended_onto_another_schedule(tmp_path, objective):
    """A causal phase or a masking rate that moves follows each step's place in the run: a run planned
    over 8 steps and continued to 12 would have had its causal half end at step 4 while its config and
    export say half of 12. Refused, naming the planned steps; resuming over the same plan is not."""
    from pretrainlab.config import ConfigError

    run_dir = tmp_path / "run"
    pretrain(compose_train(*SMALL, *objective, "max_steps=8", "val_every=4", "checkpoint_every=4"), run_dir)
    with pytest.raises(ConfigError, match="scheduled over 8 planned optimizer steps .*and this run plans 12"):
        pretrain(compose_train(*SMALL, *objective, "max_steps=12", "val_every=4", "ckpt_path=last"), run_dir)
    again = pretrain(compose_train(*SMALL, *objective, "max_steps=8", "val_every=4", "ckpt_path=last"), run_dir)
    assert again["global_step"] == 8


def test_a_synthetic_evaluation_set_of_another_language_than_the_encoders_is_refused(tmp_path, monkeypatch):
    """An encoder pretrained on the synthetic language of data.seed=1, asked for sets drawn from seed 0's
    (BLiMP, GLUE and NER alike): refused before anything runs, naming the setting that matches."""
    from pretrainlab.config import ConfigError
    from pretrainlab.evaluation.run import run as finetune
    from pretrainlab.studies.suite import plan_suite

    run_dir = tmp_path / "run"
    pretrain(compose_train(*QUICK, "data.seed=1"), run_dir)
    monkeypatch.setattr("pretrainlab.evaluation.blimp.Blimp.evaluate", lambda *a, **k: pytest.fail("scored anyway"))
    for task, block in (("blimp", "blimp"), ("probe_ner", "ner"), ("rte", "glue")):
        cfg = compose_config(
            "finetune", f"pretrained={run_dir}", f"task={task}", f"{block}.source=synthetic", "logger=csv"
        )
        with pytest.raises(ConfigError, match=rf"data.seed=1 .*Set {block}.synthetic.language_seed=1"):
            finetune(cfg, tmp_path / task)
    suite = compose_config("suite", f"pretrained={run_dir}", *GLUE)
    with pytest.raises(ConfigError, match="glue.synthetic.language_seed=0"):
        plan_suite(suite, ["rte"], [0], None, {})
    matched = compose_config("suite", f"pretrained={run_dir}", *GLUE, "glue.synthetic.language_seed=1")
    plan_suite(matched, ["rte"], [0], None, {})  # the encoder's own language: planned

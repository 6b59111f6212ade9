"""Fused runs (pretraining.fused, model.stacked): runs of one encoder shape trained as one batched model
are, run by run, the runs trained alone: the same losses at every step and the same weights after, up
to float rounding."""

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pretrainlab.config import ConfigError
from pretrainlab.model.encoder import EncoderCall
from pretrainlab.optim import OptimConfig
from pretrainlab.pretraining.fused import FusedGroup, GroupAdamW
from pretrainlab.tools.bench_slot import build_run, make_batches
from tests.conftest import SMALL

VOCAB, SEQ, BATCH = 300, 32, 6
# a briefly pretrained encoder without dropout (the slot's recipe), for the fine-tuning tests
SMALL_PRETRAIN = (
    *SMALL,
    "max_steps=30",
    "val_every=30",
    "model.hidden_dropout=0",
    "model.attention_dropout=0",
)


def _run(objective: str, seed: int, train: list[str] | None = None):
    """The slot's run of ``objective`` (its recipe: pre-LN, no dropout) on the tiny encoder."""
    _, encoder, obj = build_run(objective, "tiny", VOCAB, seed, train=train)
    return encoder, obj


def _alone(encoder, objective, batches, optim: OptimConfig):
    """The run on its own, stepped as PretrainModule steps it: AdamW over its trained parameters (as
    Lightning's bf16-mixed with clipping gets it: foreach), gradients clipped to their norm."""
    module = torch.nn.ModuleDict({"encoder": encoder, "objective": objective})
    opt = optim.optimizer(module, mixed_precision=True)
    params = [p for p in module.parameters() if p.requires_grad]
    losses = []
    for batch in batches:
        loss = objective(encoder, batch).loss
        loss.backward()
        losses.append(loss.item())
        torch.nn.utils.clip_grad_norm_(params, optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses


def test_a_fused_group_trains_each_run_exactly_as_it_trains_alone():
    """Six runs of four objectives (masked rows, a pair head through the pooler, causal rows, span
    boundaries, a causal/masked mix), each at its own learning rate, with clipping that bites: after
    eight steps every run's losses and weights (encoder and heads) are its run alone's."""
    names = ["roberta", "bert", "clm", "spanbert", "gpt_bert", "roberta"]
    lrs = [2e-3, 1e-3, 3e-3, 2e-3, 5e-4, 4e-3]
    runs = [_run(name, seed) for seed, name in enumerate(names)]
    data = [make_batches(o, 8, BATCH, SEQ, True, VOCAB, seed=10 + i) for i, (_, o) in enumerate(runs)]
    initial = [copy.deepcopy(e.state_dict()) for e, _ in runs]

    alone = []
    for (encoder, objective), batches, lr in zip(runs, data, lrs, strict=True):
        encoder, objective = copy.deepcopy(encoder), copy.deepcopy(objective)
        losses = _alone(encoder, objective, batches, OptimConfig(lr=lr, grad_clip=0.5))
        alone.append((losses, encoder.state_dict(), objective.state_dict()))

    group = FusedGroup([copy.deepcopy(e) for e, _ in runs], [copy.deepcopy(o) for _, o in runs])
    opt = GroupAdamW(group, OptimConfig(lr=1.0, grad_clip=0.5))
    fused_losses: list[list[float]] = [[] for _ in names]
    clipped = 0
    for step in range(8):
        outs = group([d[step] for d in data])
        sum(out.loss for out in outs).backward()
        clipped += int((opt.grad_norms() > 0.5).sum())
        for m, out in enumerate(outs):
            fused_losses[m].append(out.loss.item())
        opt.step(lrs)
        opt.zero_grad()
    assert clipped > 10  # the clipping is exercised, run by run

    for m, name in enumerate(names):
        losses, encoder_state, objective_state = alone[m]
        np.testing.assert_allclose(fused_losses[m], losses, rtol=0, atol=2e-5, err_msg=name)
        assert losses[-1] < losses[0] - 0.05, f"{name} did not learn: {losses}"
        fused_state = group.stacked.member_state(m)
        assert fused_state.keys() == encoder_state.keys()
        for key, value in encoder_state.items():
            torch.testing.assert_close(fused_state[key], value, rtol=0, atol=2e-5, msg=f"{name}: {key}")
        for key, value in objective_state.items():
            torch.testing.assert_close(group.objectives[m].state_dict()[key], value, rtol=0, atol=2e-5)
        if name != "bert":  # a pooler its objective does not use is frozen: not decayed, not moved
            torch.testing.assert_close(fused_state["pooler.weight"], initial[m]["pooler.weight"], rtol=0, atol=0)
    # the two roberta runs, of different seeds and learning rates, stayed apart
    key = "layers.0.attention.qkv.weight"
    assert not torch.allclose(group.stacked.member_state(0)[key], group.stacked.member_state(5)[key])


def test_a_group_whose_runs_ask_for_rows_of_one_width_keeps_the_last_layer_at_those_rows():
    """Masked LMs alone in a group: the last layer computes only their scored rows (as each run alone
    does), and the outputs are each run's own."""
    runs = [_run("roberta", 0), _run("bert", 1)]
    batches = [make_batches(o, 1, BATCH, SEQ, True, VOCAB, seed=3 + i)[0] for i, (_, o) in enumerate(runs)]
    group = FusedGroup([e for e, _ in runs], [o for _, o in runs])
    calls = [o.encoder_call(b) for (_, o), b in zip(runs, batches, strict=True)]
    assert all(isinstance(c, EncoderCall) and c.rows is not None for c in calls)
    with torch.no_grad():
        outs = group.stacked(calls)
        for (encoder, _), call, out in zip(runs, calls, outs, strict=True):
            alone = call(encoder)
            width = encoder.config.hidden_size
            assert out.hidden_states.shape == alone.hidden_states.shape == (BATCH, calls[0].rows.shape[1], width)
            torch.testing.assert_close(out.hidden_states, alone.hidden_states, rtol=0, atol=1e-5)
            torch.testing.assert_close(out.pooled, alone.pooled, rtol=0, atol=1e-5)


def test_runs_that_cannot_be_fused_are_refused_with_the_reason():
    roberta, electra = _run("roberta", 0), _run("electra", 1)
    mini = build_run("roberta", "mini", VOCAB, 2)
    with pytest.raises(ConfigError, match=r"different encoder shapes.*model\.hidden_size is 128 in one and 256"):
        FusedGroup([roberta[0], mini[1]], [roberta[1], mini[2]])
    shared = _run("albert", 3, ["model.share_layers=true"])
    with pytest.raises(ConfigError, match="shared layers"):
        FusedGroup([shared[0], copy.deepcopy(shared[0])], [shared[1], copy.deepcopy(shared[1])])
    group = FusedGroup([roberta[0], electra[0]], [roberta[1], electra[1]])
    batches = [make_batches(o, 1, BATCH, SEQ, True, VOCAB, seed=1)[0] for _, o in (roberta, electra)]
    with pytest.raises(ConfigError, match="objective=electra cannot be fused"):
        group(batches)
    group = FusedGroup([roberta[0], copy.deepcopy(roberta[0])], [roberta[1], copy.deepcopy(roberta[1])])
    wide = make_batches(roberta[1], 1, BATCH, SEQ, True, VOCAB, seed=1)[0]
    narrow = make_batches(roberta[1], 1, BATCH, SEQ // 2, True, VOCAB, seed=1)[0]
    with pytest.raises(ValueError, match="batches of one shape"):
        group([wide, narrow])


# --- fine-tuning: a GLUE task's seeds trained as one model (evaluation.fused) -------------------------
FINETUNE = [
    "glue.source=synthetic",
    "glue.synthetic.scale=0.25",
    "logger=csv",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "task_overrides.lr=3.0e-4",
    "task_overrides.epochs=2",
    "task_overrides.batch_size=32",
    "task_overrides.max_seq_len=64",
]


def _suite(run_dir, out, fuse: bool, tasks, seeds, *overrides):
    from pretrainlab.studies import suite
    from tests.conftest import compose_config

    cfg = compose_config(
        "suite", f"pretrained={run_dir}", f"fuse_seeds={str(fuse).lower()}", f"output_dir={out}", *FINETUNE, *overrides
    )
    return {(r["task"], r["seed"]): r for r in suite.run_suite(cfg, tasks, seeds, out, dict(cfg.task_overrides))}


def _losses(result) -> np.ndarray:
    """(step, train/loss) of every step the run logged (its CSV logger)."""
    import csv

    (path,) = Path(result["run_dir"]).glob("csv/version_*/metrics.csv")
    return np.array([(int(r["step"]), float(r["train/loss"])) for r in csv.DictReader(path.open()) if r["train/loss"]])


@pytest.mark.parametrize("init", ["pretrained", "scratch"])
def test_fused_seeds_fine_tune_each_seed_as_it_fine_tunes_alone(shared_run, tmp_path, init, caplog):
    """fuse_seeds=true: a task's three seeds trained as one model are, seed by seed, the seeds trained
    alone: the same loss at every step (each seed's own batches, head and classifier-dropout masks, in
    both epochs: the streams carry over the dev evaluation), the same dev metrics, and results files of
    the same fields, in the same places. Scratch encoders (a different random encoder per seed) too."""
    run_dir, _ = shared_run(*SMALL_PRETRAIN)
    tasks, seeds = (["sst2", "stsb"] if init == "pretrained" else ["sst2"]), [0, 1, 2]
    alone = _suite(run_dir, tmp_path / "alone", False, tasks, seeds, f"init={init}")
    with caplog.at_level("INFO", logger="pretrainlab"):
        fused = _suite(run_dir, tmp_path / "fused", True, tasks, seeds, f"init={init}")
    assert caplog.text.count("3 runs fine-tuned at once") == len(tasks), caplog.text
    assert alone.keys() == fused.keys() and len(alone) == 3 * len(tasks)
    first_losses = []
    for key, a in alone.items():
        f = fused[key]
        assert f["fused_runs"] == 3 and "fused_runs" not in a
        assert set(f) - {"fused_runs"} == set(a), key
        where = Path(f["run_dir"]).relative_to(tmp_path / "fused")
        assert where == Path(a["run_dir"]).relative_to(tmp_path / "alone") == Path(key[0], f"seed{key[1]}")
        assert f["steps"] == a["steps"] >= 20
        la, lf = _losses(a), _losses(f)
        assert la.shape == lf.shape == (a["steps"], 2) and (la[:, 0] == lf[:, 0]).all(), key
        np.testing.assert_allclose(lf[:, 1], la[:, 1], rtol=1e-5, err_msg=str(key))
        first_losses.append(la[:, 1])
        assert [h["epoch"] for h in f["history"]] == [h["epoch"] for h in a["history"]] == [1, 2]
        assert [h["step"] for h in f["history"]] == [h["step"] for h in a["history"]]
        for name, value in a["metrics"].items():
            assert f["metrics"][name] == pytest.approx(value, abs=2e-3), (key, name)
        assert f["no_skill"] == a["no_skill"] and f["eval_examples"] == a["eval_examples"]
        assert f["config"]["task"] == a["config"]["task"] and f["pretrained"] == a["pretrained"]
    # the seeds are the seeds': no two of them took the same steps
    assert all(not np.allclose(x, y) for i, x in enumerate(first_losses) for y in first_losses[i + 1 : 3])


def test_seeds_of_an_encoder_with_dropout_are_fine_tuned_one_by_one_and_the_log_says_why(shared_run, tmp_path, caplog):
    """Dropout inside the encoder would draw its masks over the group's padded batch, not the seed's:
    such seeds are fine-tuned one at a time, exactly as without fuse_seeds, and the log names why."""
    run_dir, _ = shared_run(*SMALL_PRETRAIN[:-2])  # the encoder keeps its dropout
    with caplog.at_level("INFO", logger="pretrainlab"):
        fused = _suite(run_dir, tmp_path / "fused", True, ["sst2"], [0, 1], "task_overrides.epochs=1")
    assert "fine-tuned one by one, not fused: the encoder has dropout (model.hidden_dropout=0.1" in caplog.text
    alone = _suite(run_dir, tmp_path / "alone", False, ["sst2"], [0, 1], "task_overrides.epochs=1")
    for key, a in alone.items():
        assert "fused_runs" not in fused[key] and fused[key]["metrics"] == a["metrics"]
        np.testing.assert_array_equal(_losses(fused[key]), _losses(a))


def test_a_fused_group_refuses_what_would_make_its_runs_differ_from_the_runs_alone():
    """What refusal() names: the caller fine-tunes such runs one by one."""
    from types import SimpleNamespace

    from pretrainlab.evaluation.fused import refusal
    from pretrainlab.model.encoder import Encoder, EncoderConfig
    from pretrainlab.runtime.settings import Devices

    def fitting(precision="32-true", world=1, compile=None, lr=1e-3, clip=1.0):
        return SimpleNamespace(
            precision=precision,
            on_cuda=False,
            devices=Devices(world, 32, 1, compile, False),
            recipe=SimpleNamespace(epochs=3, batch_size=32),
            optim=OptimConfig(lr=lr, grad_clip=clip),
        )

    shape = dict(vocab_size=50, num_layers=1, num_heads=2, hidden_dropout=0.0, attention_dropout=0.0)
    enc = [Encoder(EncoderConfig(hidden_size=16, **shape)), Encoder(EncoderConfig(hidden_size=16, **shape))]
    assert refusal([fitting(), fitting(lr=2e-3)], enc) is None  # learning rates may differ
    assert "only one run" in refusal([fitting()], enc[:1])
    assert "DDP" in refusal([fitting(world=2), fitting(world=2)], enc)
    assert "compile=false" in refusal([fitting(compile={}), fitting(compile={})], enc)
    assert "16-mixed" in refusal([fitting("16-mixed"), fitting("16-mixed")], enc)
    assert "optimizer settings" in refusal([fitting(), fitting(clip=0.5)], enc)
    assert "different shapes" in refusal(
        [fitting(), fitting()], [enc[0], Encoder(EncoderConfig(hidden_size=32, **shape))]
    )
    dropping = Encoder(EncoderConfig(hidden_size=16, **{**shape, "hidden_dropout": 0.1}))
    assert "dropout (model.hidden_dropout=0.1" in refusal([fitting(), fitting()], [enc[0], dropping])


def test_a_fused_group_that_fails_on_its_device_leaves_its_seeds_to_run_one_by_one(
    shared_run, tmp_path, caplog, monkeypatch
):
    """A device's error in the fused step (a RuntimeError) is logged with its traceback, and the same seeds
    are then fine-tuned one by one into the same places: the suite finishes, nothing is left half-written."""
    from pretrainlab.evaluation import fused

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(fused, "fit_fused", broken)
    run_dir, _ = shared_run(*SMALL_PRETRAIN)
    with caplog.at_level("INFO", logger="pretrainlab"):
        results = _suite(run_dir, tmp_path / "out", True, ["sst2"], [0, 1], "task_overrides.epochs=1")
    assert "sst2: fine-tuning its 2 runs fused failed (RuntimeError: CUDA error" in caplog.text
    assert "they are fine-tuned one by one" in caplog.text
    assert sorted(results) == [("sst2", 0), ("sst2", 1)]
    for r in results.values():
        assert "fused_runs" not in r and (tmp_path / "out" / "sst2" / f"seed{r['seed']}.json").is_file()


def test_the_fine_tuning_bench_times_both_ways_and_writes_its_report(tmp_path):
    """experiments/bench_finetune.py on the CPU: both ways timed, the same metrics, a report to publish."""
    import json

    from pretrainlab.tools.bench_finetune import main

    assert main(["--seeds", "2", "--epochs", "1", "--report", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert [row[0] for row in report["rows"]] == ["one seed after another", "fused into one model"]
    assert all(float(row[2]) > 0 for row in report["rows"])
    gap = float(report["about"].rsplit(": ", 1)[1].rstrip("."))
    assert gap < 0.01, report["about"]
    assert (tmp_path / "provenance.json").is_file() and (tmp_path / "report.md").is_file()


@pytest.mark.parametrize("fuse", [False, True])
def test_a_studys_fuse_finetuning_reaches_every_encoders_suite(tmp_path, fuse):
    """The study setting (conf/ablate.yaml; true in the slot's preset) is what every encoder's suite reads."""
    from pretrainlab.studies.arms import study_arms
    from pretrainlab.studies.work import StudyWork
    from tests.conftest import compose_config

    cfg = compose_config("ablate_quick", f"output_root={tmp_path}", "objectives=[roberta]", f"fuse_finetuning={fuse}")
    study = StudyWork(cfg, tmp_path / "quick", study_arms(cfg), [])
    assert study.suite_cfg(tmp_path / "run", "pretrained").fuse_seeds is fuse
    assert compose_config("ablate_slot", "corpus=c").fuse_finetuning is True


def _study(root, fuse: bool, jobs: int = 1, objectives: str = "[roberta,bert]"):
    from pretrainlab.studies.ablation import run_study
    from tests.conftest import compose_config

    quoted = lambda xs: "[" + ",".join(f'"{x}"' for x in xs) + "]"  # noqa: E731
    pretrain = [*SMALL_PRETRAIN[:-4], "max_steps=40", "val_every=40", "checkpoint_every=40", *SMALL_PRETRAIN[-2:]]
    return run_study(
        compose_config(
            "ablate",
            "study=fused",
            f"output_root={root}",
            f"objectives={objectives}",
            "seeds=[0]",
            "intrinsic=false",
            "evals=[glue]",
            "suite.glue_tasks=[sst2,stsb]",
            "suite.seeds=[0,1]",
            "baseline=scratch",
            f"fuse_finetuning={str(fuse).lower()}",
            f"jobs={jobs}",
            f"pretrain={quoted(pretrain)}",
            f"suite.overrides={quoted([*FINETUNE, 'task_overrides.epochs=1'])}",
        )
    )


def test_a_study_fuses_each_tasks_fine_tunings_of_every_encoder_into_one_model(tmp_path, caplog):
    """fuse_finetuning=true: each GLUE task's fine-tunings of the study's three encoders (two objectives and
    scratch, two seeds each) are trained at once, as one model of six runs, a process per task (jobs=2),
    before the suites; every run's losses are those of its encoder's suite fine-tuned one run at a time."""
    with caplog.at_level("INFO", logger="pretrainlab"):
        fused = _study(tmp_path / "fused", True, jobs=2)
    assert "fine-tuning sst2, fused: done" in caplog.text and "fine-tuning stsb, fused: done" in caplog.text
    logs = tmp_path / "fused" / "fused" / "logs"
    for task in ("sst2", "stsb"):
        assert "6 runs fine-tuned at once" in (logs / f"fuse-{task}.log").read_text()
    assert sorted(fused["labels"]) == ["bert", "roberta", "scratch"] and set(fused["cells"]["bert"]) >= {"sst2", "stsb"}
    pretrain = tmp_path / "fused" / "fused" / "pretrain"
    results = sorted(pretrain.glob("*/glue*/*/seed*.json"))
    assert len(results) == 3 * 2 * 2
    for run, init in (("roberta-s0", "pretrained"), ("bert-s0", "pretrained"), ("roberta-s0", "scratch")):
        alone = _suite(pretrain / run, tmp_path / "alone" / run / init, False, ["sst2", "stsb"], [0, 1],
                       f"init={init}", "task_overrides.epochs=1")  # fmt: skip
        for (task, seed), a in alone.items():
            folder = "glue" if init == "pretrained" else "glue-scratch"
            f = json.loads((pretrain / run / folder / task / f"seed{seed}.json").read_text())
            assert f["fused_runs"] == 6 and "fused_runs" not in a
            np.testing.assert_allclose(_losses(f)[:, 1], _losses(a)[:, 1], rtol=1e-5, err_msg=f"{run} {init} {task}")


def test_each_fused_seed_logs_to_a_wandb_run_of_its_own(shared_run, tmp_path, monkeypatch):
    """logger=wandb (the default; offline here): each seed of a fused group has its own W&B run, under its
    own name, with the losses and dev metrics it logged and its results in the run's summary."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir, _ = shared_run(*SMALL_PRETRAIN)
    results = _suite(run_dir, tmp_path, True, ["sst2"], [0, 1], "logger=wandb", "logger.project=fused")
    for (_, seed), result in results.items():
        assert result["fused_runs"] == 2
        (log,) = (Path(result["run_dir"]) / "wandb").glob("offline-run-*/run-*.wandb")
        data = log.read_bytes()
        for key in (f"sst2-roberta-s{seed}", "train/loss", "val/accuracy", "glue/sst2/score"):
            assert key.encode() in data, (seed, key)
        other = f"sst2-roberta-s{1 - seed}".encode()
        assert other not in data  # nothing of the other seed's run


def test_a_study_whose_fused_fine_tuning_fails_fine_tunes_those_runs_one_by_one(tmp_path, caplog, monkeypatch):
    """A failure of the study's fused groups (here a bug: a ValueError) costs only their speed: the study
    logs it with its error, and each encoder's suite fine-tunes its runs (fusing only its own two seeds);
    the report is complete."""
    from pretrainlab.studies import parallel

    def broken(*args, **kwargs):
        raise ValueError("a bug in the fused loop")

    monkeypatch.setattr(parallel, "fuse_task", broken)
    with caplog.at_level("INFO", logger="pretrainlab"):
        table = _study(tmp_path, True, objectives="[roberta]")
    assert "fused fine-tuning failed (ValueError: a bug in the fused loop)" in caplog.text, caplog.text
    results = sorted((tmp_path / "fused" / "pretrain").glob("*/glue*/*/seed*.json"))
    assert len(results) == 8 and all(json.loads(p.read_text())["fused_runs"] == 2 for p in results)
    assert sorted(table["labels"]) == ["roberta", "scratch"]

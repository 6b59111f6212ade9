"""End-to-end runs of the pretraining entry point on the embedded synthetic corpus."""

import csv
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pretrainlab.config import ConfigError
from pretrainlab.export import load_encoder
from pretrainlab.pretraining.run import run
from pretrainlab.runtime.wandb_runs import read_wandb_id
from tests.conftest import ROOT, SMALL, compose_train, run_command


def metrics(run_dir: Path) -> list[dict]:
    files = sorted(run_dir.glob("csv/version_*/metrics.csv"))
    return [r for f in files for r in csv.DictReader(f.open())]


def test_run_writes_checkpoint_and_an_encoder_that_loads_without_objective_code(tmp_path, monkeypatch):
    kept = []
    monkeypatch.setattr("pretrainlab.runtime.script.keep_freed_memory", lambda: kept.append(True))
    cfg = compose_train(*SMALL, "max_steps=12", "val_every=6", "checkpoint_every=6")
    result = run(cfg, tmp_path)
    assert result["global_step"] == 12
    assert kept == [True]  # keep_freed_memory: true by default (see pretrainlab.runtime.malloc)
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert (tmp_path / "config.yaml").is_file()
    rows = metrics(tmp_path)
    logged = set().union(*(r.keys() for r in rows))
    for key in (
        "train/loss",
        "train/mlm_loss",
        "train/mlm_acc",
        "val/loss",
        "val/mlm_loss",
        "val/mlm_acc",
        "train/lr",
        "train/tokens_seen",
        "train/flops",
        "perf/tokens_per_s",
        "perf/data_wait_s",
        "perf/data_wait_frac",
    ):
        assert key in logged, key
    encoder, tokenizer, meta = load_encoder(tmp_path)
    assert meta["pretraining"]["objective"] == "roberta" and meta["pretraining"]["global_step"] == 12
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    for k, v in encoder.state_dict().items():
        torch.testing.assert_close(v, state[f"encoder.{k}"])
    ids = torch.tensor([tokenizer.encode("The kolam sees a drum.").ids])
    assert encoder.eval()(ids).hidden_states.shape == (1, ids.shape[1], 128)


def test_one_optimizer_step_runs_in_the_order_the_module_states(tmp_path, monkeypatch):
    """PretrainModule's docstring lists one optimizer step in order (the hooks Lightning's loop calls);
    a run of two steps of two micro-batches each calls them in that order: every micro-batch its
    forward and backward, and after the last one clipping, the optimizer's step, the schedule."""
    import re

    from pretrainlab.pretraining.module import PretrainModule

    stated = re.findall(r"^\s+[1-9]\. +(\w+) ", PretrainModule.__doc__ or "", re.M)  # 0 is the batch
    assert stated == [
        "on_train_batch_start",
        "training_step",
        "backward",
        "configure_gradient_clipping",
        "optimizer_step",
        "lr_scheduler_step",
        "on_train_batch_end",
    ], stated
    called: list[str] = []

    def recorded(name: str):
        original = getattr(PretrainModule, name)

        def hook(self, *args, **kwargs):
            if name != "optimizer_step":
                called.append(name)
            out = original(self, *args, **kwargs)
            if name == "optimizer_step":  # the step's account is kept once the optimizer has stepped
                called.append(name)
            return out

        return hook

    for name in stated:
        monkeypatch.setattr(PretrainModule, name, recorded(name))
    cfg = compose_train(*SMALL, "batch_size=8", "device_batch_size=4", "max_steps=2", "val_every=1000")
    assert run(cfg, tmp_path)["global_step"] == 2
    inner = ["on_train_batch_start", "training_step", "backward", "on_train_batch_end"]  # not the last micro-batch
    assert called == (inner + stated) * 2, called


def test_a_slow_data_loader_shows_in_the_data_wait_and_validation_does_not(tmp_path, monkeypatch):
    import time

    from pretrainlab.data.batches import MaskedBatches
    from pretrainlab.pretraining.module import PretrainModule

    def waits(run_dir):
        rows = [r for r in metrics(run_dir) if r.get("perf/data_wait_s")]
        return [float(r["perf/data_wait_s"]) for r in rows], [float(r["perf/data_wait_frac"]) for r in rows]

    def slowly(original, seconds):
        def slow(*args, **kwargs):
            time.sleep(seconds)
            return original(*args, **kwargs)

        return slow

    overrides = [*SMALL, "max_steps=6", "val_every=2", "trainer.log_every_n_steps=1", "export=false"]
    with monkeypatch.context() as m:
        m.setattr(PretrainModule, "validation_step", slowly(PretrainModule.validation_step, 0.3))
        run(compose_train(*overrides), tmp_path / "slow-validation")
    fast, _ = waits(tmp_path / "slow-validation")
    assert len(fast) == 6 and max(fast) < 0.3 and np.median(fast) < 0.1  # validation is not waiting for data

    # a wait long enough to be most of a step even on a busy machine (this tiny step takes ~0.1-0.3 s)
    monkeypatch.setattr(MaskedBatches, "__getitem__", slowly(MaskedBatches.__getitem__, 1.0))
    run(compose_train(*overrides), tmp_path / "slow-data")
    slow, fractions = waits(tmp_path / "slow-data")
    assert len(slow) == 6 and min(slow) >= 1.0  # every step waited for its batch
    assert np.median(fractions) > 0.5


def test_resume_continues_from_the_checkpoint(tmp_path, monkeypatch):
    kept = []
    monkeypatch.setattr("pretrainlab.runtime.script.keep_freed_memory", lambda: kept.append(True))
    first = tmp_path / "first"
    run(
        compose_train(
            *SMALL, "max_steps=20", "val_every=10", "checkpoint_every=10", "export=false", "keep_freed_memory=false"
        ),
        first,
    )
    assert kept == []
    ckpt = torch.load(first / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 20
    tokens_at_20 = float(ckpt["state_dict"]["tokens_seen"])
    second = tmp_path / "second"
    result = run(
        compose_train(
            *SMALL, "max_steps=30", "val_every=10", "checkpoint_every=10", "export=false", f"ckpt_path={first}"
        ),
        second,
    )
    assert result["global_step"] == 30
    steps = sorted({int(r["step"]) for r in metrics(second) if r.get("train/loss")})
    assert steps[0] >= 20, "the resumed run started over"
    resumed = torch.load(second / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert float(resumed["state_dict"]["tokens_seen"]) > tokens_at_20
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        run(compose_train(*SMALL, "ckpt_path=last"), tmp_path / "fresh")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["max_seq_len=64", "model.max_position_embeddings=32"], "exceeds model.max_position_embeddings=32"),
        (["model.vocab_size=123"], "the tokenizer has .* tokens but model.vocab_size=123"),
        (["trainer.accelerator=cpu", "trainer.precision=16-mixed"], "bf16-mixed"),
    ],
)
def test_bad_settings_fail_early_with_a_clear_message(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        run(compose_train(*SMALL, "max_steps=2", *overrides), tmp_path)
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        ("checkpoint_every=0", "checkpoint_every=0: must be an integer of at least 1"),
        ("val_every=0", "val_every=0: must be an integer of at least 1"),
        ("batch_size=0", "batch_size=0: must be an integer of at least 1"),
        ("device_batch_size=0", "device_batch_size=0: must be null or an integer of at least 1"),
        ("max_seq_len=4", "max_seq_len=4: must be an integer of at least 8"),
        ("num_workers=-1", "num_workers=-1: must be an integer of at least 0"),
        ("val_fraction=1.5", "val_fraction=1.5: must be a number between 0 and 1"),
        ("optim.lr=0", "optim.lr=0: must be positive"),
        ("budget.tokens=-5", "budget.tokens=-5: must be positive"),
        ("objective.mask_rate=1.5", "objective.mask_rate must be in"),
        ("objective.mask_rate_start=0", "objective.mask_rate_start must be in"),
        ("model.num_heads=3", "not divisible by model.num_heads=3"),
    ],
)
def test_every_numeric_setting_is_checked_before_any_work(tmp_path, monkeypatch, override, message):
    def no_work(*a, **k):
        raise AssertionError("the corpus was read before the settings were checked")

    monkeypatch.setattr("pretrainlab.pretraining.run.PretrainData", no_work)
    with pytest.raises(Exception, match=message) as e:
        run(compose_train(*SMALL, "max_steps=2", override), tmp_path)
    assert not isinstance(e.value, (AssertionError, ZeroDivisionError))
    assert "conf/" in str(e.value) or "." in override  # the settings of conf/train.yaml say where they are set
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    good = tmp_path / "run"
    run(compose_train(*SMALL, "max_steps=4", "checkpoint_every=4", "val_every=4", "export=false"), good)
    before = (good / "checkpoints" / "last.ckpt").read_bytes()

    from pretrainlab.pretraining.module import PretrainModule

    real_forward_loss, calls = PretrainModule.forward_loss, []

    # The loss blows up on the third training step. Patched around the (possibly compiled) objective
    # step, not inside it: a compiled step (compile=auto on a GPU) would not see a patched forward.
    def diverging(self, batch):
        out = real_forward_loss(self, batch)
        if self.training:
            calls.append(1)
            if len(calls) >= 3:
                out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(PretrainModule, "forward_loss", diverging)
    with pytest.raises(FloatingPointError, match=r"non-finite training loss \(nan\) at step 6"):
        run(compose_train(*SMALL, "max_steps=40", "checkpoint_every=100", "val_every=100", f"ckpt_path={good}"), good)
    assert (good / "checkpoints" / "last.ckpt").read_bytes() == before


def test_cli_default_logger_writes_an_offline_wandb_run(tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline", "PRETRAINLAB_CACHE": str(tmp_path / "cache")}
    run_dir = tmp_path / "run"
    out = run_command(
        [
            sys.executable,
            "train.py",
            "model=tiny",
            "data.num_documents=200",
            "max_seq_len=64",
            "batch_size=16",
            "max_steps=6",
            "val_every=3",
            "checkpoint_every=3",
            "num_workers=0",
            "tokenizer.vocab_size=800",
            "log_encoder_artifact=true",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("run-*.wandb"))
    run_id = read_wandb_id(run_dir)[0]
    log = next(offline[0].glob("run-*.wandb")).read_bytes()
    assert f"encoder-{run_id}".encode() in log  # the exported encoder, logged as a model artifact
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "encoder" / "encoder.safetensors").is_file()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["objective.mask_rate_start=0.3", "budget.minutes=5"], "a budget in minutes does not say ahead"),
        (["objective=clm_mlm", "data=wikibooks"], "a streamed corpus does not number its batches"),
        (["objective=gpt_bert", "objective.causal_share=0"], "a share of 0 throughout is objective=roberta"),
    ],
)
def test_a_schedule_that_cannot_be_followed_is_refused_before_any_work(tmp_path, monkeypatch, overrides, message):
    def no_work(*a, **k):
        raise AssertionError("the corpus was read before the settings were checked")

    monkeypatch.setattr("pretrainlab.pretraining.run.PretrainData", no_work)
    with pytest.raises(ValueError, match=message):
        run(compose_train(*[o for o in SMALL if not o.startswith("data.")], "max_steps=2", *overrides), tmp_path)


def test_a_scheduled_runs_flops_are_each_steps_tokens_at_its_own_cost_and_its_budget_holds(tmp_path):
    """A masking rate moving from 0.4 to 0.15 under a FLOPs budget: the run counts each step's
    tokens at the FLOPs per token of its rate (validated every step here, so learning.csv holds
    every step's tokens and FLOPs), plans its steps with their mean, and stops at the budget."""
    import re

    from pretrainlab.model.encoder import EncoderConfig
    from pretrainlab.optim import StepProgress
    from pretrainlab.pretraining.assembly import build_objective
    from pretrainlab.runtime.checkpoints import KEY
    from pretrainlab.tokens import SpecialTokens

    budget = 6.0e10
    cfg = compose_train(
        *SMALL, "objective.mask_rate_start=0.4", f"budget.flops={budget}", "val_every=1", "export=false"
    )
    run(cfg, tmp_path)
    rows = list(csv.DictReader((tmp_path / "learning.csv").open()))
    assert [int(r["step"]) for r in rows] == list(range(1, len(rows) + 1)) and len(rows) > 10
    config = EncoderConfig(**torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)[KEY]["model"])
    objective = build_objective(cfg, config, SpecialTokens(config.vocab_size, 0, 1, 2, 3, 4, None))
    planned = int(re.search(r"scheduled over (\d+) planned", (tmp_path / "train.log").read_text()).group(1))
    assert abs(planned - len(rows)) <= 1
    place = StepProgress(planned)
    tokens = np.diff([0.0, *(float(r["tokens"]) for r in rows)])
    flops = np.cumsum([t * objective.flops_at(config, 64, place(k)) for k, t in enumerate(tokens)])
    np.testing.assert_allclose([float(r["flops"]) for r in rows], flops, rtol=1e-9)
    at_start = float(rows[-1]["tokens"]) * objective.flops_at(config, 64, 0.0)  # 0.4 throughout
    assert flops[-1] < 0.95 * at_start  # the rate went down, and so did the cost
    assert flops[-2] < budget <= flops[-1]


class _Event:
    """A stand-in for a CUDA event pair's end: done once the test says so, and the span it reports."""

    def __init__(self, ms: float, done: bool = False):
        self.ms, self.done, self.waited = ms, done, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited, self.done = True, True

    def elapsed_time(self, end: "_Event") -> float:
        return end.ms


def test_on_a_gpu_a_step_counts_its_time_on_the_device_once_the_device_has_run_it():
    """The host runs ahead of the kernels it queues, so its clock once said that the nine runs of a GPU
    slot had trained for 1.2 min each in a phase of 3.9 min: on a GPU each step's span comes from CUDA
    events, added when the device has finished it, and every queued step is waited for when the seconds
    are read (an export, a snapshot) or saved (a checkpoint)."""
    from pretrainlab.model.encoder import EncoderConfig
    from pretrainlab.optim import Budget, OptimConfig
    from pretrainlab.pretraining.module import PretrainModule
    from pretrainlab.tools.bench_slot import build_run

    _, _, objective = build_run("roberta", "tiny", 300, 0)
    module = PretrainModule(EncoderConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2), objective,
                            OptimConfig(), Budget("steps", 10), 1.0)  # fmt: skip
    done, queued = _Event(120.0, done=True), _Event(80.0)
    module._device_steps = [(_Event(0), done), (_Event(0), queued)]
    module._settle(wait=False)
    assert module._seconds == pytest.approx(0.12) and not queued.waited  # the finished step only, no wait
    assert module.seconds == pytest.approx(0.2) and queued.waited  # read: every queued step, waited for
    module._device_steps = [(_Event(0), _Event(500.0))]
    assert float(module.state_dict()["train_seconds"]) == pytest.approx(0.7)  # a checkpoint's counter is whole

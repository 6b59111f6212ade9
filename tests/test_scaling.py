"""Scaling up without changing results: global batch vs devices and accumulation, data sharding,
exact resume (in process after a crash and SIGTERM; SIGTERM and SIGKILL with 2-process DDP), determinism, non-finite losses,
atomic checkpoints, bf16 on CPU, and the multirun + ddp refusal."""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pretrainlab.config import ConfigError
from pretrainlab.data.batches import EpochBatches
from pretrainlab.pretraining.run import run
from pretrainlab.runtime.settings import batch_split
from tests.conftest import ROOT, SMALL, Command, compose_config, compose_train, run_command, start_command

# short epochs (so resumed segments cross an epoch boundary), a loss logged at every step
RESUME = [
    *SMALL,
    "data.num_documents=120",
    "trainer.log_every_n_steps=1",
    "val_every=1000",
    "checkpoint_every=10",
    "export=false",
]


def losses(run_dir: Path) -> dict[int, float]:
    """train/loss by step, over every CSV version of a run directory (a resumed run adds one).
    Lightning logs the loss of the k-th optimizer step under step k - 1."""
    out = {}
    for f in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        for r in csv.DictReader(f.open()):
            if r.get("train/loss"):
                out[int(r["step"])] = float(r["train/loss"])
    return out


def same_loss(a: float, b: float) -> bool:
    """Equal up to float32 rounding (relative 1e-5, about 40 ulps at a loss of 4). Two processes
    running the same step on the same weights and batch have been seen, rarely, to differ in the
    last bit (3.9596331 vs 3.9596326, one ulp), as when BLAS splits a product differently; a
    difference in data order, masks or dropout draws moves the loss by 1e-3 or more."""
    return abs(a - b) <= 1e-5 * max(abs(a), abs(b))


# --- global batch, devices, accumulation -----------------------------------------------------------
def test_batch_split_derives_micro_batch_and_accumulation():
    assert batch_split(256, 8, None) == (32, 1)
    assert batch_split(256, 8, 8) == (8, 4)
    assert batch_split(32, 1, 8) == (8, 4)
    assert batch_split(32, 2, 16) == (16, 1)
    with pytest.raises(ConfigError, match="not divisible by the 3 devices"):
        batch_split(32, 3, None)
    with pytest.raises(ConfigError, match="choose a divisor of 16"):
        batch_split(32, 2, 6)


def test_the_device_plan_is_decided_from_the_config_once():
    import torch._inductor
    import torch._inductor.config

    from pretrainlab.runtime.settings import Devices

    devices = Devices.of(compose_train("trainer=cpu", "trainer.devices=2", "compile=false"), 64, 16)
    assert (devices.world, devices.micro_batch, devices.accumulate) == (2, 16, 2)
    assert devices.compile is None and not devices.static_shapes
    assert "64 = 2 device(s) x 16 micro-batch x 2 accumulation" in devices.describe()
    compiled = Devices.of(compose_train("trainer=cpu", "compile=true", "compile_mode=reduce-overhead"), 32)
    assert compiled.compile == {"mode": "reduce-overhead", "dynamic": False} and compiled.static_shapes
    # shapes that vary: dynamic, with the mode's inductor options and the coalescing analysis off
    varying = Devices.of(compose_train("trainer=cpu", "compile=true", "compile_mode=max-autotune-no-cudagraphs"), 32)
    mode_options = torch._inductor.list_mode_options("max-autotune-no-cudagraphs")
    assert mode_options and not varying.static_shapes
    assert varying.compile == {"dynamic": None, "options": {**mode_options, "triton.coalesce_tiling_analysis": False}}
    assert "compiled (max-autotune-no-cudagraphs)" in varying.describe()
    with torch._inductor.config.patch(varying.compile["options"]):  # raises on an option this inductor lacks
        assert torch._inductor.config.triton.coalesce_tiling_analysis is False
    with pytest.raises(ConfigError, match=r"task.batch_size=32 is not divisible by the 3 devices"):
        Devices.of(
            compose_config("finetune", "pretrained=x", "trainer=cpu", "trainer.devices=3"),
            32,
            setting="task.batch_size",
        )


@pytest.mark.parametrize("world, accumulate", [(2, 1), (1, 2), (2, 2), (4, 1)])
def test_every_step_sees_the_same_examples_whatever_the_devices(world, accumulate):
    n, global_batch = 1000, 32
    micro = global_batch // (world * accumulate)
    reference = list(EpochBatches(n, global_batch, seed=3))
    for epoch in (0, 1):
        reference_epoch = EpochBatches(n, global_batch, seed=3)
        reference_epoch.set_epoch(epoch)
        steps = [set(k.example_ids) for k in reference_epoch]
        per_rank = []
        for rank in range(world):
            s = EpochBatches(n, micro, seed=3, rank=rank, world_size=world, accumulate=accumulate)
            s.set_epoch(epoch)
            keys = list(s)
            assert len(keys) == len(s) == len(steps) * accumulate  # same number of optimizer steps
            per_rank.append(keys)
        seen = []
        for step, expected in enumerate(steps):
            got = [
                i for keys in per_rank for k in keys[step * accumulate : (step + 1) * accumulate] for i in k.example_ids
            ]
            assert len(got) == len(set(got)) == global_batch and set(got) == expected
            seen += got
        # across the epoch: nothing duplicated, nothing dropped beyond drop_last's remainder
        assert len(seen) == len(set(seen)) == n - n % global_batch
        keys = [k.index for keys in per_rank for k in keys]
        assert len(keys) == len(set(keys))  # every micro-batch has its own mask seed
    assert len(reference) == n // global_batch


def test_resume_at_skips_exactly_the_consumed_micro_batches():
    s = EpochBatches(500, 8, seed=0, accumulate=2)
    full = list(s)
    s.resume_at(7)
    assert list(s) == full[7:]
    assert list(s) == full  # only the first iteration after resuming is shortened


def test_streaming_ranks_read_disjoint_documents(tmp_path):
    """Streamed corpora are split with datasets' split_dataset_by_node; the held-out documents are
    left out of every rank's shard."""
    import json

    from pretrainlab.data.batches import StreamingBatches
    from pretrainlab.data.corpus import HubCorpus
    from pretrainlab.data.pipeline import PretrainData
    from pretrainlab.data.tokenizer import TokenizerSpec

    for n_files in (1, 2):  # one file: every other row; two files: one file per rank
        docs = []
        for f in range(n_files):
            path = tmp_path / f"docs{n_files}-{f}.jsonl"
            with path.open("w") as out:
                for i in range(f * 100 // n_files, (f + 1) * 100 // n_files):
                    out.write(json.dumps({"text": f"Document number{i} begins. It ends here."}) + "\n")
            docs.append(str(path))
        corpus = HubCorpus(sources=[{"path": "json", "data_files": docs, "text_column": "text"}], streaming=True)

        data = PretrainData(corpus, TokenizerSpec(vocab_size=200), tmp_path / "cache")
        kw = dict(builder=None, collator=None, batch_size=4, seed=0, val_documents=10)
        val = [d[0][:3].tolist() for d in StreamingBatches(data, split="val", **kw)._documents()]
        ranks = [
            [d[0][:3].tolist() for d in StreamingBatches(data, split="train", rank=r, world_size=2, **kw)._documents()]
            for r in range(2)
        ]
        as_set = [{tuple(x) for x in r} for r in ranks]
        assert len(val) == 10 and as_set[0].isdisjoint(as_set[1])
        assert len(ranks[0]) + len(ranks[1]) == 90 and not (as_set[0] | as_set[1]) & {tuple(v) for v in val}
        assert abs(len(ranks[0]) - len(ranks[1])) <= 10


# --- exact resume -----------------------------------------------------------------------------------
class Crash(RuntimeError):
    pass


def test_resume_after_a_crash_repeats_the_uninterrupted_losses_exactly(tmp_path, monkeypatch):
    from pretrainlab.pretraining.module import PretrainModule

    overrides = [*RESUME, "max_steps=40", "device_batch_size=8"]  # accumulation 2
    full = run(compose_train(*overrides), tmp_path / "full")
    # determinism: same seed, same losses, also with tokenizer and examples built again in a new cache
    again = run(compose_train(*overrides, f"cache_dir={tmp_path / 'new-cache'}"), tmp_path / "again")
    assert (tmp_path / "new-cache" / "tokenizers").is_dir()
    reference = losses(tmp_path / "full")
    again_losses = losses(tmp_path / "again")
    assert len(reference) == 40 and sorted(again_losses) == sorted(reference)
    assert all(same_loss(again_losses[s], reference[s]) for s in reference), (again_losses, reference)
    assert full["global_step"] == again["global_step"] == 40

    original = PretrainModule.on_train_batch_end

    def crash_at_25(self, outputs, batch, batch_idx):
        original(self, outputs, batch, batch_idx)
        if self.global_step == 25:
            raise Crash("simulated crash after the step-20 checkpoint")

    monkeypatch.setattr(PretrainModule, "on_train_batch_end", crash_at_25)
    with pytest.raises(Crash):
        run(compose_train(*overrides), tmp_path / "crashed")
    monkeypatch.setattr(PretrainModule, "on_train_batch_end", original)
    at_crash = torch.load(tmp_path / "crashed" / "checkpoints" / "last.ckpt", weights_only=False)
    assert at_crash["global_step"] == 20
    run(compose_train(*overrides, "ckpt_path=last"), tmp_path / "crashed")
    resumed = losses(tmp_path / "crashed")
    final = torch.load(tmp_path / "crashed" / "checkpoints" / "last.ckpt", weights_only=False)
    assert final["global_step"] == 40 and final["epoch"] > at_crash["epoch"]  # the resumed part crosses an epoch
    assert sorted(reference) == list(range(40))
    for s in range(20, 40):  # every step after the checkpoint
        assert same_loss(resumed[s], reference[s]), (s, resumed[s], reference[s])
    seeds = run(compose_train(*overrides, "seed=1", "max_steps=5"), tmp_path / "seed1")
    assert seeds["global_step"] == 5 and not same_loss(losses(tmp_path / "seed1")[1], reference[1])  # other masks


def _start(run_dir: Path, *overrides: str, env: dict | None = None, stderr=subprocess.PIPE) -> Command:
    """``python train.py`` in the background, in a process group of its own, as a job under SLURM or a
    command in a terminal (a signal to the group reaches its DataLoader workers)."""
    cmd = [sys.executable, "train.py", *RESUME, *overrides, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "WANDB_MODE": "disabled", **(env or {})}
    return start_command(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def _wait_for(path: Path, proc: Command, timeout: float = 300) -> None:
    t0 = time.time()
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"run ended before {path} appeared: {proc.stderr.read()[-3000:]}")
        if time.time() - t0 > timeout:
            proc.kill()
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.05)


@pytest.mark.parametrize("objective, accumulate", [("roberta", 1), ("roberta", 2), ("xlnet", 1), ("clm_mlm", 1)])
def test_sigterm_saves_a_checkpoint_that_resumes_exactly(tmp_path, monkeypatch, objective, accumulate):
    """The signal arrives during the step that closes epoch 0 (21 steps per epoch here), and, with
    accumulation, during the step's first micro-batch: the run finishes that step, saves it and exits
    143, and the resumed run repeats the uninterrupted losses from there on (CLM then MLM: in its
    masked phase, which the resumed run must find from the step it resumes at)."""
    from pretrainlab.pretraining.module import PretrainModule

    overrides = [*RESUME, f"objective={objective}", "max_steps=26", f"device_batch_size={16 // accumulate}"]
    run(compose_train(*overrides), tmp_path / "full")
    reference = losses(tmp_path / "full")
    original = PretrainModule.training_step
    sent = []

    def signal_during_step(self, batch, batch_idx, at=(21, 24)):
        if self.global_step + 1 in at and self.global_step not in sent:  # first micro-batch of the step
            sent.append(self.global_step)
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, batch, batch_idx)

    monkeypatch.setattr(PretrainModule, "training_step", signal_during_step)
    for step in (21, 24):
        with pytest.raises(SystemExit) as stopped:
            run(compose_train(*overrides, *(["ckpt_path=last"] if step > 21 else [])), tmp_path / "killed")
        assert stopped.value.code == 143
        saved = torch.load(tmp_path / "killed" / "checkpoints" / "last.ckpt", weights_only=False)
        assert saved["global_step"] == step  # the step in progress was finished, then saved
    monkeypatch.undo()
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)  # the handler is restored after the run
    run(compose_train(*overrides, "ckpt_path=last"), tmp_path / "killed")
    resumed = losses(tmp_path / "killed")
    assert sorted(reference) == list(range(26))
    for s in range(21, 26):
        assert same_loss(resumed[s], reference[s]), (s, resumed[s], reference[s])


def test_a_run_stopped_before_its_first_periodic_checkpoint_ends_with_its_final_state_in_last_ckpt(
    tmp_path, monkeypatch
):
    """The signal's last.ckpt is replaced at the end of the resumed run, not left beside a
    last-v1.ckpt for a later ckpt_path=last to go back to."""
    from pretrainlab.pretraining.module import PretrainModule

    overrides = [*RESUME, "max_steps=8", "checkpoint_every=8"]
    original = PretrainModule.training_step

    def signal_at_3(self, batch, batch_idx):
        if self.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, batch, batch_idx)

    monkeypatch.setattr(PretrainModule, "training_step", signal_at_3)
    with pytest.raises(SystemExit):
        run(compose_train(*overrides), tmp_path)
    monkeypatch.undo()
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3
    run(compose_train(*overrides, "ckpt_path=last"), tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.ckpt", "step=8.ckpt"]
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8


def test_when_only_a_periodic_checkpoint_is_left_every_advice_names_it(tmp_path):
    """last.ckpt lost (deleted, or a copy without it): the refusal and ckpt_path=last point at the
    checkpoint that exists, and their advice works as printed; ckpt_path=auto resumes from it."""
    import re
    import shlex

    from pretrainlab.runtime.rundir import RunDirError

    overrides = [*RESUME, "max_steps=6", "checkpoint_every=4"]
    run(compose_train(*overrides), tmp_path / "run")
    (tmp_path / "run" / "checkpoints" / "last.ckpt").unlink()
    with pytest.raises(RunDirError, match="there is no last.ckpt") as refused:
        run(compose_train(*overrides), tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="the newest checkpoint of this run is .*step=4.ckpt") as missing:
        run(compose_train(*overrides, "ckpt_path=last"), tmp_path / "run")
    for advice in (str(refused.value), str(missing.value)):
        (override,) = shlex.split(re.search(r"'ckpt_path=\"[^\"]*\"'", advice).group(0))  # as a shell reads it
        assert compose_train(*overrides, override).ckpt_path == str(tmp_path / "run" / "checkpoints" / "step=4.ckpt")
    # auto takes it (a fresh start there would be refused: the directory holds a run)
    run(compose_train(*overrides, "max_steps=8", "ckpt_path=auto"), tmp_path / "run")
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8


def test_extending_a_budget_relabels_the_snapshots_of_the_old_one(tmp_path, caplog):
    """Step 2 of an 8-step run is 0.25 of it; after the run is extended to 16 steps it is 0.125: the
    snapshot is renamed and says so, and a fraction already passed when the run resumed is not
    taken late under its label."""
    import json

    overrides = [*RESUME, "checkpoint_every=8", "snapshots=[0.25,0.5]"]
    run(compose_train(*overrides, "max_steps=8"), tmp_path)
    with caplog.at_level("WARNING", logger="pretrainlab"):
        run(compose_train(*overrides, "max_steps=16", "snapshots=[0.25,0.375,0.5]", "ckpt_path=last"), tmp_path)

    def meta(name):
        return json.loads((tmp_path / "snapshots" / name / "config.json").read_text())["pretraining"]

    assert sorted(p.name for p in (tmp_path / "snapshots").iterdir()) == ["0.125", "0.25", "0.5"]
    assert meta("0.125")["global_step"] == 2 and meta("0.125")["relabelled_from"]["fraction"] == 0.25
    assert meta("0.25")["global_step"] == 4 and meta("0.25")["relabelled_from"]["budget"]["total"] == 8
    assert meta("0.5")["global_step"] == 9 and "relabelled_from" not in meta("0.5")
    assert "no snapshot at 0.375 of the budget: the run resumed at 0.5" in caplog.text
    assert "snapshot 0.25 of the old budget is at 0.125 of this one" in caplog.text


# the real signals, to a 2-process DDP run (single-process SIGKILL is the in-process crash test above)
DDP = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]


@pytest.fixture
def ddp_reference(once) -> dict[int, float]:
    """The losses of an uninterrupted 2-process run of 40 steps (made once per session)."""

    def make(out: Path) -> None:
        ref = _start(out, *DDP, "max_steps=40")
        assert ref.wait() == 0, ref.stderr.read()[-3000:]

    reference = losses(once("test_scaling-ddp-reference", make))
    assert sorted(reference) == list(range(40))
    return reference


def _resumes_exactly(run_dir: Path, reference: dict[int, float], start: int, *overrides: str) -> None:
    resumed_proc = _start(run_dir, *overrides, "max_steps=40", "ckpt_path=last")
    assert resumed_proc.wait() == 0, resumed_proc.stderr.read()[-3000:]
    resumed = losses(run_dir)
    for s in range(start, 40):
        assert same_loss(resumed[s], reference[s]), (s, resumed[s], reference[s])


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_ddp_run_resumes_with_the_uninterrupted_losses(tmp_path, sig, ddp_reference):
    """A 2-process run stopped after its step-20 checkpoint (SIGTERM: it saves and exits 143; SIGKILL: it
    resumes from its last checkpoint) goes on with the uninterrupted run's losses at every step. Its time
    is four processes started (two ranks, twice), each importing torch and Lightning."""
    proc = _start(tmp_path / "killed", *DDP, "max_steps=40")
    _wait_for(tmp_path / "killed" / "checkpoints" / "step=20.ckpt", proc)
    proc.send_signal(sig)
    code = proc.wait(timeout=300)
    time.sleep(1)  # the other rank exits too (stopped with rank 0, or lost its peer)
    last = torch.load(tmp_path / "killed" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    if sig == signal.SIGTERM:
        assert code == 143  # preempted: saved, then exited
        assert 20 <= last < 40
    else:
        # killed right after step=20.ckpt was written: last.ckpt holds step 10 or 20 (or later ones)
        assert code == -signal.SIGKILL and last % 10 == 0 and 10 <= last < 40
    _resumes_exactly(tmp_path / "killed", ddp_reference, last, *DDP)


@pytest.fixture
def reference_losses(once) -> dict[int, float]:
    """The losses of an uninterrupted one-process run of 40 steps (made once per session)."""
    return losses(once("test_scaling-reference", lambda out: run(compose_train(*RESUME, "max_steps=40"), out)))


@pytest.mark.slow
@pytest.mark.parametrize("ddp", [False, True], ids=["one-process", "ddp"])
def test_sigterm_to_the_whole_process_group_saves_the_current_step(tmp_path, ddp, reference_losses, ddp_reference):
    """What SLURM preemption and scancel do: every process of the job gets SIGTERM, the DataLoader
    workers (one per rank here) included. The workers leave it to their main process, which
    finishes its step, saves and exits 143; the run resumes exactly."""
    args = [*(DDP if ddp else []), "num_workers=1", "max_steps=40"]
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = _start(tmp_path / "killed", *args, stderr=err)
        _wait_for(tmp_path / "killed" / "checkpoints" / "step=20.ckpt", proc)
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=300)
    log = (tmp_path / "stderr.txt").read_text()
    assert code == 143, log[-3000:]
    assert "killed by signal" not in log
    last = torch.load(tmp_path / "killed" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 20 <= last < 40
    _resumes_exactly(tmp_path / "killed", ddp_reference if ddp else reference_losses, last, *(DDP if ddp else []))


def test_ctrl_c_saves_the_current_step_marks_the_wandb_run_and_says_how_to_resume(tmp_path, reference_losses):
    import json

    run_dir = tmp_path / "run"
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = _start(
            run_dir,
            "num_workers=1",
            "max_steps=40",
            "logger=wandb",
            stderr=err,
            env={"WANDB_MODE": "offline"},
        )
        _wait_for(run_dir / "checkpoints" / "step=20.ckpt", proc)
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole foreground group
        code = proc.wait(timeout=300)
    log = (tmp_path / "stderr.txt").read_text() + (run_dir / "train.log").read_text()
    assert code == 130, log[-3000:]
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 20 <= last < 40
    assert f"hydra.run.dir={run_dir} ckpt_path=last" in log and f"saved at step {last}" in log
    offline = next((run_dir / "wandb").glob("offline-run-*"))
    inspected = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--summary", "--json", str(offline)],
        capture_output=True,
        text=True,
    )
    state = json.loads(inspected.stdout)
    assert state["exit_code"] == 130 and state["state"] != "finished", state
    assert "interrupted" in state["tags"] and state["summary"]["stopped"] == "interrupted"
    _resumes_exactly(run_dir, reference_losses, last)


# --- failures that must not corrupt anything ----------------------------------------------------------
def test_non_finite_batches_can_be_skipped(tmp_path, monkeypatch):
    from pretrainlab.pretraining.module import PretrainModule

    original = PretrainModule.forward_loss  # around the step, which compile=auto compiles on a GPU
    calls = {"n": 0}

    def nan_once(self, batch):
        out = original(self, batch)
        calls["n"] += 1
        if calls["n"] == 4:
            return type(out)(out.loss * float("nan"), out.metrics)
        return out

    monkeypatch.setattr(PretrainModule, "forward_loss", nan_once)
    run(compose_train(*RESUME, "max_steps=8", "on_nonfinite=skip"), tmp_path)
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 8 and int(ckpt["state_dict"]["skipped_batches"]) == 1
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())


def test_a_crash_while_writing_a_checkpoint_leaves_the_last_one_intact(tmp_path, monkeypatch):
    run(compose_train(*RESUME, "max_steps=10"), tmp_path)
    last = tmp_path / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    original_save = torch.save

    def half_then_die(obj, f, *args, **kwargs):
        if hasattr(f, "write"):  # a checkpoint being written: half of it, then the disk is full
            f.write(before[: len(before) // 2])
            raise OSError("disk full (simulated)")
        return original_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", half_then_die)
    with pytest.raises(OSError, match="disk full"):
        run(compose_train(*RESUME, "max_steps=20", "ckpt_path=last"), tmp_path)
    monkeypatch.undo()
    assert last.read_bytes() == before
    assert torch.load(last, weights_only=False)["global_step"] == 10
    assert not [p for p in last.parent.iterdir() if p.name.startswith(".")]  # no temporary file left behind


def test_bf16_mixed_runs_on_cpu(tmp_path):
    result = run(compose_train(*RESUME, "max_steps=4", "trainer.precision=bf16-mixed"), tmp_path)
    assert result["global_step"] == 4 and np.isfinite(losses(tmp_path)[3])


def test_multirun_with_ddp_is_refused_with_the_supported_alternatives(tmp_path):
    cmd = [
        sys.executable,
        "train.py",
        "-m",
        *RESUME,
        "max_steps=2",
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "seed=0,1",
        f"hydra.sweep.dir={tmp_path}",
    ]
    out = run_command(cmd, cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled"})
    assert out.returncode != 0
    assert "trainer.strategy=ddp_spawn" in out.stderr and "W&B agent" in out.stderr


def test_ckpt_path_auto_resumes_only_when_there_is_a_checkpoint(tmp_path):
    from pretrainlab.runtime.rundir import checkpoint_to_resume as resolve_checkpoint

    assert resolve_checkpoint("auto", tmp_path) is None  # a first submission starts fresh
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert resolve_checkpoint("auto", tmp_path) == tmp_path / "checkpoints" / "last.ckpt"
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        resolve_checkpoint("last", tmp_path / "elsewhere")


# --- compute budgets ------------------------------------------------------------------------------
def test_roberta_and_electra_stop_at_equal_flops_within_one_step(tmp_path):
    budget = 8.0e10
    final = {}
    for objective in ("roberta", "electra"):
        run(
            compose_train(*RESUME, f"objective={objective}", f"budget.flops={budget}", "max_steps=3"),
            tmp_path / objective,
        )
        ckpt = torch.load(tmp_path / objective / "checkpoints" / "last.ckpt", weights_only=False)
        tokens = ckpt["state_dict"]["tokens_seen"].item()
        rows = [r for f in (tmp_path / objective).glob("csv/version_*/metrics.csv") for r in csv.DictReader(f.open())]
        used = [float(r["budget/used"]) for r in rows if r.get("budget/used")]
        per_step = np.diff(used).max()
        final[objective] = (used[-1], per_step, ckpt["global_step"])
        assert budget <= used[-1] < budget + per_step  # stopped by the first step that reached the budget
        assert used[-2] < budget
        assert ckpt["global_step"] > 3 and tokens > 0  # max_steps does not apply under a budget
        lrs = [float(r["train/lr"]) for r in rows if r.get("train/lr")]
        assert lrs[-1] < 0.1 * max(lrs)  # the schedule decayed over the budget, not over max_steps
    (r_used, r_step, r_steps), (e_used, e_step, e_steps) = final["roberta"], final["electra"]
    assert abs(r_used - e_used) < max(r_step, e_step)
    assert e_steps < r_steps  # ELECTRA's generator makes each of its steps costlier


def test_a_budgets_learning_rate_follows_the_steps_already_taken(tmp_path):
    """Under a tokens budget the rate of step k is warmed up to the budget used once step k is
    done, worked out from the k steps before it (each step's own count added to the progress so
    far): rising from the very first steps, none repeated."""
    total, warmup, lr = 30000.0, 0.5, 1.0e-3
    run(
        compose_train(*RESUME, f"budget.tokens={total}", f"optim.warmup={warmup}", f"optim.lr={lr}"),
        tmp_path,
    )
    rows = [r for f in tmp_path.glob("csv/version_*/metrics.csv") for r in csv.DictReader(f.open())]
    lr_at = {int(r["step"]): float(r["train/lr"]) for r in rows if r.get("train/lr")}
    tokens = {int(r["step"]): float(r["train/tokens_seen"]) for r in rows if r.get("train/tokens_seen")}
    steps = sorted(lr_at)
    assert steps[:8] == list(range(8)) and len(steps) > 10
    assert all(b > a for a, b in zip([lr_at[k] for k in steps[:8]], [lr_at[k] for k in steps[1:9]]))
    for k in range(2, 8):  # progress after step k-1, plus step k-1's own count: where step k will end
        ahead = (2 * tokens[k - 1] - tokens[k - 2]) / total
        assert lr_at[k] == pytest.approx(lr * ahead / warmup, rel=1e-6)


def test_token_and_minute_budgets_and_bad_budgets(tmp_path):
    run(compose_train(*RESUME, "budget.tokens=20000"), tmp_path / "tokens")
    ckpt = torch.load(tmp_path / "tokens" / "checkpoints" / "last.ckpt", weights_only=False)
    assert 20000 <= ckpt["state_dict"]["tokens_seen"].item() < 20000 + 16 * 64
    # a checkpoint every step: the last one is the step checkpoint, which must count its own step's time
    run(compose_train(*RESUME, "budget.minutes=0.05", "checkpoint_every=1"), tmp_path / "minutes")
    ckpt = torch.load(tmp_path / "minutes" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["state_dict"]["train_seconds"].item() >= 3.0
    with pytest.raises(ConfigError, match="set one budget"):
        run(compose_train(*RESUME, "budget.tokens=1000", "budget.flops=1.0e9"), tmp_path / "two")
    with pytest.raises(ConfigError, match="must be positive"):
        run(compose_train(*RESUME, "budget.tokens=0"), tmp_path / "zero")


def test_a_budget_that_ends_before_the_first_validation_is_validated_at_its_last_step(tmp_path):
    """A budget too small to reach ``val_every`` (a question slot's short runs, a scaled-down study):
    the run still validates once, where the budget stops it, so its held-out metrics and learning
    checks exist; nothing to refuse."""
    result = run(compose_train(*SMALL, "budget.flops=2.0e10", "val_every=200", "export=false"), tmp_path)
    rows = list(csv.DictReader((tmp_path / "learning.csv").open()))
    assert len(rows) == 1 and 0 < int(rows[0]["step"]) < 200, rows
    assert float(rows[0]["flops"]) >= 2.0e10 and "val/mlm_acc" in result
    assert [c["head"] for c in result["learning"]] == ["MLM at [MASK]"]

"""On a CUDA GPU: the compiled step against eager in bf16 and a step that never waits for the GPU, for
every objective of conf/objective/; the compiled step over batches of varying shape; the masked rows
in bf16, and exact resume with deterministic settings. Skipped where there is no GPU."""

import csv
import os
import sys

import numpy as np
import pytest
import torch

from pretrainlab.model.encoder import Encoder, EncoderConfig
from pretrainlab.pretraining.assembly import build_objective
from pretrainlab.runtime.hydra import options
from pretrainlab.runtime.rundir import latest_checkpoint
from pretrainlab.tokens import SpecialTokens
from tests.conftest import ROOT, SMALL, compose_train, random_documents, run_command

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")


def setup(name: str, dropout: float = 0.0, length: int = 64):
    torch.manual_seed(0)
    tokens = SpecialTokens(1000, 0, 1, 2, 3, 4, np.zeros(1000, dtype=bool))
    config = EncoderConfig(
        vocab_size=1000,
        hidden_size=128,
        num_layers=2,
        num_heads=2,
        intermediate_size=512,
        hidden_dropout=dropout,
        attention_dropout=dropout,
    )
    objective = build_objective(compose_train(f"objective={name}"), config, tokens).cuda()
    encoder = Encoder(config).cuda()
    if not objective.uses_pooler:
        encoder.pooler.requires_grad_(False)
    examples = list(objective.example_builder(length)(random_documents(80, vocab=(5, 1000)), np.random.default_rng(0)))
    batch = objective.collator(length)(examples[:16], torch.Generator().manual_seed(0))
    batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch.items()}
    params = [p for p in [*encoder.parameters(), *objective.parameters()] if p.requires_grad]
    return objective, encoder, batch, params


@pytest.mark.parametrize("name", options("objective"))
def test_the_compiled_step_equals_eager_in_bf16(name):
    objective, encoder, batch, params = setup(name)

    def step(fn):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fn(batch)
        return out, torch.autograd.grad(out.loss, params)

    eager, eager_grads = step(lambda b: objective(encoder, b))
    torch._dynamo.reset()
    compiled, compiled_grads = step(torch.compile(lambda b: objective(encoder, b), dynamic=False))
    torch.testing.assert_close(compiled.loss, eager.loss, rtol=2e-2, atol=2e-2)
    for a, b in zip(compiled_grads, eager_grads):  # bf16 rounding differs element by element: compare whole tensors
        assert float((a.float() - b.float()).norm()) <= 3e-2 * float(b.float().norm()) + 1e-6


@pytest.mark.parametrize("name", ["roberta", "bert", "electra"])
def test_the_compiled_step_follows_batches_of_varying_shape(name):
    """Compiled as training compiles it where shapes vary (each batch as wide as its longest row, with as
    many masked slots as its fullest row: recompiled with dynamic shapes at the second shape), the step
    equals eager at every shape. With torch 2.11's defaults inductor failed at that recompile
    (``dynamic_shape_options``)."""
    from pretrainlab.runtime.settings import compile_options

    kwargs = compile_options(compose_train(f"objective={name}", "trainer=gpu", "compile=true"))
    assert kwargs is not None and kwargs["dynamic"] is None
    objective, encoder, _, params = setup(name)
    torch._dynamo.reset()
    compiled = torch.compile(lambda b: objective(encoder, b), **kwargs)
    shapes = set()
    for seed, length in enumerate((64, 48, 40)):
        examples = objective.example_builder(length)(random_documents(80, vocab=(5, 1000)), np.random.default_rng(seed))
        batch = objective.collator(None)(list(examples)[:16], torch.Generator().manual_seed(seed))
        batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch.items()}
        shapes.add(tuple(batch["input_ids"].shape))
        results = []
        for fn in (lambda b: objective(encoder, b), compiled):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = fn(batch)
            results.append((out.loss, torch.autograd.grad(out.loss, params)))
        (eager, eager_grads), (loss, grads) = results
        torch.testing.assert_close(loss, eager, rtol=2e-2, atol=2e-2)
        for a, b in zip(grads, eager_grads):
            assert float((a.float() - b.float()).norm()) <= 3e-2 * float(b.float().norm()) + 1e-6
    assert len(shapes) == 3  # three shapes: a static compile, then the dynamic one


def test_the_masked_rows_in_bf16_are_the_full_forwards_rows():
    objective, encoder, batch, _ = setup("bert")
    encoder.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        full = encoder(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        rows = encoder(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], rows=batch["mlm_positions"]
        )
    wanted = full.hidden_states.gather(
        1, batch["mlm_positions"][:, :, None].expand(-1, -1, full.hidden_states.shape[-1])
    )
    torch.testing.assert_close(rows.hidden_states.float(), wanted.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(rows.pooled.float(), full.pooled.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", options("objective"))
def test_the_training_step_never_waits_for_the_gpu(name):
    """Forward, loss, backward and the fused AdamW step with CUDA's synchronisation check set to
    raise: no .item(), no data-dependent shape, nothing that copies back to the host."""
    objective, encoder, batch, params = setup(name, dropout=0.1)
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = objective(encoder, batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_resume_on_the_gpu_with_deterministic_settings_repeats_the_losses(tmp_path):
    """A run killed after its step-10 checkpoint and resumed repeats the uninterrupted run's losses."""
    import signal
    import subprocess
    import time

    env = {**os.environ, "WANDB_MODE": "disabled", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    args = [
        sys.executable,
        "train.py",
        *SMALL,
        "trainer=gpu",
        "trainer.precision=32-true",
        "+trainer.deterministic=true",
        "compile=false",
        "trainer.log_every_n_steps=1",
        "val_every=1000",
        "checkpoint_every=10",
        "export=false",
        "max_steps=30",
    ]

    def losses(run_dir):
        rows = [r for f in run_dir.glob("csv/version_*/metrics.csv") for r in csv.DictReader(f.open())]
        return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}

    done = run_command([*args, f"hydra.run.dir={tmp_path / 'full'}"], cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [*args, f"hydra.run.dir={killed}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    t0 = time.time()
    while not (killed / "checkpoints" / "step=10.ckpt").exists() and proc.poll() is None and time.time() - t0 < 600:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # the kill may land between step=10.ckpt and its copy last.ckpt: resume from the newest checkpoint
    newest = latest_checkpoint(killed)
    assert newest is not None, "the killed run left no checkpoint"
    last = torch.load(newest, weights_only=True)["global_step"]
    assert 10 <= last < 30
    done = run_command([*args, f"hydra.run.dir={killed}", "ckpt_path=auto"], cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    full, resumed = losses(tmp_path / "full"), losses(killed)
    assert sorted(full) == list(range(30))
    for step in range(last, 30):
        assert resumed[step] == pytest.approx(full[step], rel=1e-5), (step, resumed[step], full[step])


def test_probes_fit_on_the_gpu_as_they_do_on_the_cpu():
    """probe_all on the device the features come from: on a GPU the same probes reach the same dev
    scores as on the CPU (the informative layer near perfect, the others near chance on both)."""
    from omegaconf import OmegaConf

    from pretrainlab.evaluation.probes import probe_all

    rng = np.random.default_rng(0)
    n, layers, hidden, classes = 4000, 3, 32, 4
    y = rng.integers(0, classes, n)
    x = rng.normal(size=(n, layers, hidden)).astype(np.float32)
    x[:, -1] += 2 * rng.normal(size=(classes, hidden)).astype(np.float32)[y]  # only the last layer knows the class
    cfg = OmegaConf.create({"epochs": 3, "lr": 1e-2, "batch_size": 256, "weight_decay": 0.0})

    def score(pred: np.ndarray) -> float:
        return float((pred == y[3000:]).mean())

    fitted = {d: probe_all(x[:3000], y[:3000], x[3000:], classes, score, cfg, 0, d) for d in ("cpu", "cuda")}
    cpu, gpu = fitted["cpu"]["probes"], fitted["cuda"]["probes"]
    assert gpu["layer_2"] > 0.95 and gpu["layer_0"] < 0.4, gpu
    for name in cpu:
        assert abs(gpu[name] - cpu[name]) < 0.03, (name, cpu, gpu)


def test_a_runs_seconds_on_the_gpu_are_its_steps_on_the_device(tmp_path):
    """The seconds a run's export records are its steps' time on the device (CUDA events), which a
    step's host time falls short of when the host runs ahead: with the device synchronised around the
    whole run, they cannot exceed its wall-clock, and they are most of it for a run that only trains."""
    import json
    import time

    run_dir = tmp_path / "run"
    started = time.time()
    done = run_command(
        [sys.executable, str(ROOT / "train.py"), *SMALL, "trainer=gpu", "model=mini", "batch_size=64", "max_steps=60",
         "val_every=1000", "checkpoint_every=1000", "logger=csv", f"hydra.run.dir={run_dir}"],
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    wall = time.time() - started
    seconds = json.loads((run_dir / "encoder" / "config.json").read_text())["pretraining"]["seconds"]
    assert 0 < seconds < wall


def test_a_fused_group_on_the_gpu_trains_each_run_as_it_trains_alone():
    """tests/test_fused.py's check on the GPU, in float32 (TF32 off): the fused group's losses are its runs'."""
    import copy

    from pretrainlab.optim import OptimConfig
    from pretrainlab.pretraining.fused import FusedGroup, GroupAdamW
    from pretrainlab.tools.bench_slot import build_run, make_batches

    torch.backends.cuda.matmul.allow_tf32 = False
    names = ["roberta", "bert", "clm", "spanbert"]
    runs = [build_run(n, "tiny", 300, i)[1:] for i, n in enumerate(names)]
    data = [[{k: v.cuda() for k, v in b.items()} for b in make_batches(o, 4, 8, 32, True, 300, 10 + i)]
            for i, (_, o) in enumerate(runs)]  # fmt: skip
    alone = []
    for (encoder, objective), batches in zip(runs, data, strict=True):
        encoder, objective = copy.deepcopy(encoder).cuda(), copy.deepcopy(objective).cuda()
        module = torch.nn.ModuleDict({"encoder": encoder, "objective": objective})
        opt = OptimConfig(lr=2e-3).optimizer(module, mixed_precision=True)
        params = [p for p in module.parameters() if p.requires_grad]
        losses = []
        for batch in batches:
            loss = objective(encoder, batch).loss
            loss.backward()
            losses.append(loss.item())
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        alone.append(losses)
    group = FusedGroup([copy.deepcopy(e).cuda() for e, _ in runs], [copy.deepcopy(o).cuda() for _, o in runs])
    opt = GroupAdamW(group, OptimConfig(lr=2e-3))
    fused: list[list[float]] = [[] for _ in names]
    for step in range(4):
        outs = group([d[step] for d in data])
        sum(out.loss for out in outs).backward()
        for m, out in enumerate(outs):
            fused[m].append(out.loss.item())
        opt.step([2e-3] * len(names))
        opt.zero_grad()
    np.testing.assert_allclose(fused, alone, rtol=0, atol=1e-4)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_fused_fine_tuning_seeds_on_the_gpu_are_the_seeds_alone(shared_run, tmp_path, precision):
    """tests/test_fused.py's fine-tuning check on the GPU: each fused seed's losses (its own CUDA dropout
    stream) and dev metrics are the seed alone's, in float32 (TF32 off) and in bf16."""
    from tests.test_fused import SMALL_PRETRAIN, _losses, _suite

    run_dir, _ = shared_run(*SMALL_PRETRAIN)
    gpu = ["trainer.accelerator=gpu", f"trainer.precision={precision}", "compile=false", "tf32=false"]
    alone = _suite(run_dir, tmp_path / "alone", False, ["sst2"], [0, 1, 2], *gpu)
    fused = _suite(run_dir, tmp_path / "fused", True, ["sst2"], [0, 1, 2], *gpu)
    tolerance = 1e-4 if precision == "32-true" else 2e-2
    for key, a in alone.items():
        assert fused[key]["fused_runs"] == 3
        np.testing.assert_allclose(_losses(fused[key])[:, 1], _losses(a)[:, 1], rtol=tolerance, err_msg=str(key))
        assert fused[key]["metrics"]["accuracy"] == pytest.approx(a["metrics"]["accuracy"], abs=0.02)

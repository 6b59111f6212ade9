"""The slot's pretraining phase on one device: its runs as the slot starts them today, beside each lever
that may make many small runs share one GPU better, measured side by side in one call.

    python experiments/bench_slot.py --report runs/bench-slot            # a GPU: about 4 minutes
    python experiments/bench_slot.py --device cpu --model tiny --batch 8 --window-s 1   # anywhere

Every objective of the slot (``conf/ablate_slot.yaml``: its model, recipe and batch) trains in worker
processes, each run built as pretraining builds it (``pretraining.assembly``: model, objective,
AdamW with its clipping, bf16 autocast, ``torch.compile`` of the forward and loss) on batches its own
collator makes from generated documents of the slot's vocabulary. Each configuration is a window in
which a set of workers train at once; each counts the steps, tokens and model FLOPs it finishes in the
window (waiting for the device at its edges). Configurations (``--levers``):

    today          every run in a process of its own, compiled (default mode): the slot's runs now
    graphs         the same with CUDA graphs (compile_mode=reduce-overhead, static shapes)
    batch          the same at --batch-factor x the batch (what a step of the same tokens costs)
    fused          the runs of one encoder shape in one process as one batched model
                   (pretraining.fused), the others in their own processes as today
    fused+graphs   the fused group and the others with CUDA graphs
    mps, mps+graphs, mps+fused, mps+fused+graphs
                   the same, with every worker started under CUDA's Multi-Process Service
                   (runtime.mps), which lets their kernels run at once

Workers are started once per phase (without MPS, then under it) and compile every variant they take
part in before the first window; the windows follow one another. The table gives each
configuration's aggregate model FLOP/s and tokens/s, its ratio to ``today`` and its share of the
device's bf16 matrix-product peak, measured in the same call (``tools.bench.matmul_peak``, 8192 x
8192 on a GPU). The report is written after every phase, so a call cut short keeps what it measured.
Nothing here is the data pipeline or Lightning's loop: both are the same for every configuration.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pretrainlab import atomic

log = logging.getLogger("pretrainlab")

ALL_LEVERS = (
    "today", "graphs", "batch", "batch+graphs", "fused", "fused+graphs",
    "mps", "mps+graphs", "mps+batch+graphs", "mps+fused", "mps+fused+graphs",
)  # fmt: skip
DEFAULT_LEVERS = (
    "today",
    "graphs",
    "batch",
    "fused+graphs",
    "mps",
    "mps+graphs",
    "mps+batch+graphs",
    "mps+fused+graphs",
)
SPECIAL = 5  # ids 0-4: pad, unk, cls, sep, mask


# --- one run, as the slot builds it -----------------------------------------------------------------------
def slot_overrides(objective: str, model: str, overrides: list[str] | None = None) -> list[str]:
    """The train.py overrides of the slot's run of ``objective`` (conf/ablate_slot.yaml's recipe and
    objective_overrides) on ``model``."""
    from omegaconf import OmegaConf

    from pretrainlab.runtime.hydra import compose  # lazily: a worker's start (module docstring)

    cfg, _ = compose("ablate_slot", ["budget_flops=1e15", "corpus=none", *(overrides or [])])
    own = OmegaConf.to_container(cfg.objective_overrides, resolve=True) or {}
    return [
        f"objective={objective}",
        f"model={model}",
        f"model.pre_layer_norm={cfg.pre_layer_norm}",
        f"model.hidden_dropout={cfg.dropout}",
        f"model.attention_dropout={cfg.dropout}",
        f"optim.lr={cfg.lr}",
        *own.get(objective, []),  # type: ignore[union-attr]
    ]


def special_tokens(vocab: int):
    import numpy as np

    from pretrainlab.tokens import SpecialTokens

    return SpecialTokens(vocab, 0, 1, 2, 3, 4, np.zeros(vocab, dtype=bool))


def documents(rng, n: int, vocab: int) -> list[list]:
    """``n`` documents of 2-12 sentences of 4-40 tokens (ids past the special ones, Zipf-like)."""
    import numpy as np

    ranks = np.arange(1, vocab - SPECIAL + 1)
    p = 1.0 / ranks
    p /= p.sum()
    return [
        [
            SPECIAL + rng.choice(vocab - SPECIAL, size=int(rng.integers(4, 41)), p=p)
            for _ in range(int(rng.integers(2, 13)))
        ]
        for _ in range(n)
    ]


def make_batches(objective, count: int, batch_size: int, seq_len: int, static: bool, vocab: int, seed: int) -> list:
    """``count`` training batches of the objective's own examples and collator."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    examples: list = []
    while len(examples) < batch_size:
        examples += list(objective.example_builder(seq_len)(documents(rng, 40, vocab), rng))
    collate = objective.collator(seq_len if static else None)
    if objective.scheduled:  # the middle of the run
        collate = collate.at(0.5)
    generator = torch.Generator().manual_seed(seed)
    return [
        collate([examples[i] for i in rng.integers(0, len(examples), size=batch_size)], generator) for _ in range(count)
    ]


def build_run(
    objective_name: str,
    model: str,
    vocab: int,
    seed: int,
    overrides: list[str] | None = None,
    train: list[str] | None = None,
):
    """(config, encoder, objective) of the slot's run of ``objective_name`` (``overrides``: of the slot's
    config, conf/ablate_slot.yaml; ``train``: train.py overrides after the slot's), its weights seeded by ``seed``."""
    import torch

    from pretrainlab.pretraining.assembly import build_model  # lazily: a worker's start (module docstring)
    from pretrainlab.runtime.hydra import compose  # lazily: a worker's start (module docstring)

    cfg, _ = compose("train", [*slot_overrides(objective_name, model, overrides), *(train or [])])
    torch.manual_seed(seed)
    built = build_model(cfg, special_tokens(vocab))
    encoder = built.encoder()
    return cfg, encoder, built.objective


# --- a worker process ---------------------------------------------------------------------------------------
@dataclass
class Variant:
    """How a worker steps in a window: batch size, compile mode (None: eager) and static shapes."""

    batch: int
    mode: str | None
    static: bool


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


class Trainer:
    """A worker's runs (one, or a fused group) and one step function per variant."""

    def __init__(self, spec: dict):
        import torch
        from hydra.utils import instantiate

        from pretrainlab.runtime.settings import set_matmul_precision

        set_matmul_precision(True)
        self.device = torch.device(spec["device"])
        self.bf16 = spec["precision"] == "bf16"
        self.fused = spec["fused"]
        runs = [
            build_run(name, spec["model"], spec["vocab"], seed=seed, overrides=spec.get("overrides"))
            for name, seed in zip(spec["objectives"], spec["seeds"], strict=True)
        ]
        seq = spec["seq_len"]
        self.flops_per_token = [o.mean_flops_per_token(e.config, seq) for _, e, o in runs]
        self.objectives = [o for _, _, o in runs]
        optim = instantiate(runs[0][0].optim)
        self.lr = optim.lr
        if self.fused:
            from pretrainlab.pretraining.fused import FusedGroup, GroupAdamW

            for _, e, o in runs:
                e.to(self.device), o.to(self.device)
            self.group = FusedGroup([e for _, e, _ in runs], [o for _, _, o in runs])
            self.group_opt = GroupAdamW(self.group, optim)
        else:
            (_, encoder, objective) = runs[0]
            encoder.to(self.device), objective.to(self.device)
            self.encoder, self.objective = encoder, objective
            module = torch.nn.ModuleDict({"encoder": encoder, "objective": objective})
            self.params = [p for p in module.parameters() if p.requires_grad]
            self.opt = optim.optimizer(module, mixed_precision=self.bf16)
            self.schedule = optim.schedule(self.opt, 10**6)
        self.clip = optim.grad_clip
        self.steps: dict[str, Any] = {}
        self.batches: dict[str, list] = {}
        self.tokens: dict[str, list[float]] = {}
        self.flops: dict[str, list[float]] = {}
        self.spec = spec

    def prepare(self, name: str, v: Variant) -> None:
        """The variant's batches on the device and its step function, compiled."""
        import torch
        from omegaconf import OmegaConf

        from pretrainlab.runtime.settings import compile_options

        spec, n = self.spec, 4
        static = v.static or self.fused  # a fused group's batches are of one shape
        per_run = [
            make_batches(o, n, v.batch, spec["seq_len"], static, spec["vocab"], seed=100 * i + 7)
            for i, o in enumerate(self.objectives)
        ]
        moved = [[{k: t.to(self.device, non_blocking=True) for k, t in b.items()} for b in bs] for bs in per_run]
        self.batches[name] = [[moved[r][i] for r in range(len(moved))] for i in range(n)]
        tokens = [[float(per_run[r][i]["n_tokens"]) for r in range(len(per_run))] for i in range(n)]
        self.tokens[name] = [sum(t) for t in tokens]
        self.flops[name] = [sum(t * f for t, f in zip(ts, self.flops_per_token, strict=True)) for ts in tokens]
        if self.fused:
            group = self.group

            def losses(batches):
                return sum(out.loss for out in group(batches))

            fn = losses
        else:
            encoder, objective = self.encoder, self.objective

            def objective_loss(batch):
                return objective(encoder, batch)

            fn = objective_loss
        options = compile_options(
            OmegaConf.create(
                {"compile": v.mode is not None, "compile_mode": v.mode or "default", "static_shapes": static}
            )
        )
        self.steps[name] = fn if options is None else torch.compile(fn, **options)  # as training compiles

    def step(self, name: str, i: int) -> None:
        import torch

        batches = self.batches[name][i % len(self.batches[name])]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            out = self.steps[name](batches if self.fused else batches[0])
        loss = out if self.fused else out.loss
        loss.backward()
        if self.fused:
            self.group_opt.step([self.lr] * self.group.runs)
            self.group_opt.zero_grad()
        else:
            if self.clip:
                torch.nn.utils.clip_grad_norm_(self.params, self.clip)
            self.opt.step()
            self.schedule.step()
            self.opt.zero_grad(set_to_none=True)


def worker(spec_path: str) -> None:
    """One worker process: prepare every variant (warm-up included), say so, train in the
    coordinator's windows, write what it counted."""
    import torch

    spec = json.loads(Path(spec_path).read_text())
    exchange, name = Path(spec["exchange"]), spec["name"]
    torch.set_num_threads(max(1, int(spec.get("threads", 1))))
    started = time.time()
    trainer = Trainer(spec)
    status: dict[str, str] = {}
    warm: dict[str, float] = {}
    for vname, v in spec["variants"].items():
        variant = Variant(**v)
        t0 = time.time()
        try:
            trainer.prepare(vname, variant)
            for i in range(spec["warmup_steps"]):
                trainer.step(vname, i)
            _sync(trainer.device)
            if trainer.device.type == "cuda":  # what this variant's steps held, for the next one
                torch.cuda.empty_cache()
            status[vname] = "ok"
        except Exception as e:  # a lever that does not work here: named in the report, the others go on
            log.exception("%s: variant %s failed", name, vname)
            status[vname] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        warm[vname] = time.time() - t0
    atomic.write_json(exchange / f"ready-{name}.json", {"status": status, "warm_s": warm, "start_s": t0 - started})
    path = exchange / "windows.json"
    while not path.is_file():
        if (exchange / "abort").exists():
            return
        time.sleep(0.05)
    windows = json.loads(path.read_text())
    counted: dict[str, dict] = {}
    for window in windows:
        vname = window["members"].get(name)
        if vname is None:
            continue
        time.sleep(max(0.0, window["start"] - time.time()))
        _sync(trainer.device)
        t0, steps, tokens, flops = time.time(), 0, 0.0, 0.0
        while True:
            trainer.step(vname, steps)
            tokens += trainer.tokens[vname][steps % len(trainer.tokens[vname])]
            flops += trainer.flops[vname][steps % len(trainer.flops[vname])]
            steps += 1
            if time.time() >= window["end"]:
                break
        _sync(trainer.device)
        seconds = time.time() - t0
        counted[window["name"]] = {
            "variant": vname,
            "steps": steps,
            "tokens": tokens,
            "flops": flops,
            "seconds": seconds,
        }
    memory = torch.cuda.max_memory_reserved() if trainer.device.type == "cuda" else 0
    atomic.write_json(exchange / f"rate-{name}.json", {"windows": counted, "memory": memory})


def peak_worker(out: str, device: str) -> None:
    """The device's bf16 matrix-product peak, in a process of its own (before any daemon starts)."""
    import torch

    from pretrainlab.tools.bench import matmul_peak

    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    atomic.write_json(Path(out), {"flops_per_s": matmul_peak("bf16", device), "device": name})


# --- the coordinator ----------------------------------------------------------------------------------------
@dataclass
class Config:
    """One row of the table: a window, who trains in it and how."""

    name: str
    members: dict[str, str]  # worker -> variant
    mps: bool


def _fusable_shape(name: str, model: str, overrides: list[str] | None) -> str | None:
    """The encoder config of ``name``'s run if it can be fused (its objective names its one encoder
    call, ``Objective.encoder_call``, and its layers are not one set of weights), else None."""
    _, encoder, objective = build_run(name, model, 512, 0, overrides)
    batch = make_batches(objective, 1, 2, 32, True, 512, seed=0)[0]
    if objective.encoder_call(batch) is None or encoder.config.share_layers:
        return None
    return json.dumps(encoder.config.to_dict(), sort_keys=True)


def groups(objectives: list[str], model: str, overrides: list[str] | None = None) -> tuple[list[str], list[str]]:
    """(fused, others): the largest set of objectives whose runs can train as one batched model (they
    name their encoder call and share one encoder config), and the rest."""
    by_shape: dict[str, list[str]] = {}
    for name in objectives:
        shape = _fusable_shape(name, model, overrides)
        if shape is not None:
            by_shape.setdefault(shape, []).append(name)
    fused = max(by_shape.values(), key=len, default=[])
    if len(fused) < 2:
        fused = []
    return fused, [o for o in objectives if o not in fused]


def copies_of(objectives: list[str], copies: int) -> dict[str, tuple[str, int]]:
    """The runs timed: each objective's ``copies`` (a question slot's pretraining seeds), as
    run name -> (objective, seed); a run is named by its objective alone when there is one copy."""
    return {(o if copies == 1 else f"{o}-s{k}"): (o, k) for o in objectives for k in range(copies)}


def fused_groups(runs: dict[str, tuple[str, int]], model: str, overrides: list[str] | None, by: str) -> list[list[str]]:
    """The groups of runs the ``fused`` levers train as one batched model each: ``by="shape"``, the runs
    of the largest set of objectives of one encoder shape (``groups``: objectives of every kind side by
    side); ``by="objective"``, each fusable objective's copies (every run of a group the same objective:
    one masking, one head, one attention pattern; only the seed differs)."""
    objectives = list(dict.fromkeys(o for o, _ in runs.values()))
    if by == "shape":
        fusable, _ = groups(objectives, model, overrides)
        found = [[r for r, (o, _) in runs.items() if o in fusable]]
    elif by == "objective":
        found = [
            [r for r, (o, _) in runs.items() if o == objective]
            for objective in objectives
            if _fusable_shape(objective, model, overrides) is not None
        ]
    else:
        raise ValueError(f"fuse by {by!r}: shape or objective")
    return [g for g in found if len(g) > 1]


def plan(
    runs: dict[str, tuple[str, int]],
    fused: list[list[str]],
    levers: list[str],
    batch: int,
    factor: int,
    static: bool = False,
) -> tuple[dict, list[Config]]:
    """The workers (name -> spec fields) and the configurations to time; ``runs``: run name ->
    (objective, seed); ``fused``: the groups of runs the fused levers train as one model each;
    ``static``: compiled without CUDA graphs at static shapes too (``static_shapes=true``), else with
    shapes that vary (the default)."""
    v = {
        "default": {"batch": batch, "mode": "default", "static": static},
        "graphs": {"batch": batch, "mode": "reduce-overhead", "static": True},
        "batch": {"batch": batch * factor, "mode": "default", "static": static},
        "batch-graphs": {"batch": batch * factor, "mode": "reduce-overhead", "static": True},
        "fused": {"batch": batch, "mode": "default", "static": True},
        "fused-graphs": {"batch": batch, "mode": "reduce-overhead", "static": True},
    }
    workers: dict[str, dict] = {
        r: {"objectives": [o], "seeds": [k], "fused": False, "variants": {}} for r, (o, k) in runs.items()
    }
    names = []  # the fused workers
    for g in fused:
        name = "fused" if len(fused) == 1 else f"fused-{runs[g[0]][0]}"
        names.append(name)
        workers[name] = {
            "objectives": [runs[r][0] for r in g],
            "seeds": [runs[r][1] for r in g],
            "fused": True,
            "variants": {},
        }
    grouped = {r for g in fused for r in g}
    others = [r for r in runs if r not in grouped]
    configs = []
    for lever in levers:
        parts = set(lever.split("+"))
        graphs = "graphs" in parts
        members: dict[str, str] = {}
        if "fused" in parts:
            if not fused:
                continue
            members = {w: "fused-graphs" if graphs else "fused" for w in names}
            members |= {r: "graphs" if graphs else "default" for r in others}
        elif "batch" in parts:
            members = {r: "batch-graphs" if graphs else "batch" for r in runs}
        else:
            members = {r: "graphs" if graphs else "default" for r in runs}
        for w, variant in members.items():
            workers[w]["variants"][variant] = v[variant]
        configs.append(Config(lever, members, "mps" in parts))
    return {w: s for w, s in workers.items() if s["variants"]}, configs


class Phase:
    """Workers started together (under MPS or not), prepared, then timed in windows."""

    def __init__(self, name: str, work: Path, workers: dict, configs: list[Config], common: dict, env: dict):
        self.name, self.work, self.configs = name, work / name, configs
        self.exchange = self.work / "exchange"
        self.exchange.mkdir(parents=True, exist_ok=True)
        self.logs = self.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        needed = {w for c in configs for w in c.members}
        self.workers = {w: s for w, s in workers.items() if w in needed}
        # each worker's variants: those of this phase's configurations
        for w in self.workers:
            self.workers[w] = {
                **self.workers[w],
                "variants": {
                    variant: self.workers[w]["variants"][variant]
                    for variant in {c.members[w] for c in configs if w in c.members}
                },
            }
        self.common, self.env = common, env
        self.procs: dict[str, subprocess.Popen] = {}

    def run(self, window_s: float, gap_s: float, timeout_s: float) -> dict:
        threads = max(1, (os.cpu_count() or 1) // max(1, len(self.workers)))
        env = {**os.environ, **self.env, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        started = time.time()
        for w, spec in self.workers.items():
            path = self.work / f"{w}.json"
            atomic.write_json(
                path, {**self.common, **spec, "name": w, "exchange": str(self.exchange), "threads": threads}
            )
            with open(self.logs / f"{w}.log", "ab") as out:
                self.procs[w] = subprocess.Popen(
                    [sys.executable, "-m", "pretrainlab.tools.bench_slot", "--worker", str(path)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
        ready: dict[str, dict] = {}
        failed: dict[str, str] = {}
        try:
            while len(ready) + len(failed) < len(self.workers):
                for w, proc in self.procs.items():
                    if w in ready or w in failed:
                        continue
                    path = self.exchange / f"ready-{w}.json"
                    if path.is_file():
                        ready[w] = json.loads(path.read_text())
                    elif proc.poll() is not None:
                        failed[w] = f"exit status {proc.returncode}: {_tail(self.logs / f'{w}.log')}"
                if time.time() - started > timeout_s:
                    for w in self.workers:
                        if w not in ready and w not in failed:
                            failed[w] = f"not warm after {timeout_s:.0f} s"
                    break
                time.sleep(0.25)
            warm_s = time.time() - started
            runnable: list[Config] = []
            skipped: dict[str, str] = {}
            for c in self.configs:
                why = [
                    f"{w}: {failed[w] if w in failed else ready[w]['status'].get(v, 'not prepared')}"
                    for w, v in c.members.items()
                    if w in failed or ready[w]["status"].get(v) != "ok"
                ]
                (skipped.__setitem__(c.name, "; ".join(why)) if why else runnable.append(c))
            t = time.time() + 2.0
            windows = []
            for c in runnable:
                windows.append({"name": c.name, "start": t, "end": t + window_s, "members": c.members})
                t += window_s + gap_s
            atomic.write_json(self.exchange / "windows.json", windows)
            deadline = t + 60.0
            for w, proc in self.procs.items():
                if w in failed:
                    continue
                try:
                    proc.wait(timeout=max(1.0, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    failed[w] = "did not finish its windows"
            rates = {}
            for w in self.procs:
                path = self.exchange / f"rate-{w}.json"
                if path.is_file():
                    rates[w] = json.loads(path.read_text())
            return {
                "warm_s": warm_s,
                "ready": ready,
                "failed": failed,
                "skipped": skipped,
                "rates": rates,
                "windows": [c.name for c in runnable],
            }
        finally:
            (self.exchange / "abort").touch()
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.terminate()
            for proc in self.procs.values():
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _tail(path: Path, lines: int = 6) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])[-800:]
    except OSError:
        return "(no log)"


def aggregate(configs: list[Config], results: dict[str, dict], workers: dict) -> dict[str, dict]:
    """Per configuration: the sum over its workers of FLOP/s and tokens/s, or why it was not timed."""
    out: dict[str, dict] = {}
    for c in configs:
        phase = results.get("mps" if c.mps else "plain")
        if phase is None:
            continue
        if "not_run" in phase:
            out[c.name] = {"status": phase["not_run"]}
            continue
        if c.name in phase["skipped"]:
            out[c.name] = {"status": f"failed: {phase['skipped'][c.name]}"}
            continue
        counts = [phase["rates"].get(w, {}).get("windows", {}).get(c.name) for w in c.members]
        if c.name not in phase["windows"] or any(x is None for x in counts):
            missing = [w for w, x in zip(c.members, counts, strict=True) if x is None]
            out[c.name] = {"status": f"failed: no count from {', '.join(missing)}"}
            continue
        out[c.name] = {
            "status": "ok",
            "flops_per_s": sum(x["flops"] / x["seconds"] for x in counts),
            "tokens_per_s": sum(x["tokens"] / x["seconds"] for x in counts),
            "processes": len(c.members),
            "runs": sum(len(workers[w]["objectives"]) for w in c.members),
            "steps": {w: x["steps"] for w, x in zip(c.members, counts, strict=True)},
        }
    return out


def write_report(out: Path, configs, rows: dict, peak: float | None, about: str) -> None:
    from pretrainlab.compare.measurements import write_table_report

    base = rows.get("today", {}).get("flops_per_s")
    table = []
    for c in configs:
        r = rows.get(c.name)
        if r is None:
            continue
        if r["status"] != "ok":
            table.append([c.name, str(len(c.members)), "", "", "", "", r["status"]])
            continue
        table.append(
            [
                c.name,
                str(r["processes"]),
                f"{r['flops_per_s'] / 1e12:.1f}",
                f"{r['tokens_per_s'] / 1e6:.2f}",
                f"{r['flops_per_s'] / base:.2f}x" if base else "",
                f"{100 * r['flops_per_s'] / peak:.1f}%" if peak else "",
                "ok",
            ]
        )
    write_table_report(
        out,
        "The slot's pretraining runs on one device: today and each lever",
        ["configuration", "processes", "TFLOP/s", "M tokens/s", "x today", "of peak", "status"],
        table,
        about,
    )
    atomic.write_json(out / "bench-slot.json", {"rows": rows, "peak_flops_per_s": peak, "about": about})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda (default where there is one) or cpu")
    parser.add_argument("--model", default="mini")
    parser.add_argument("--objectives", default="all", help="comma-separated, or all (every conf/objective/ option)")
    parser.add_argument(
        "--copies", type=int, default=1, help="runs of each objective (a question slot's pretraining seeds: 3)"
    )
    parser.add_argument(
        "--fuse",
        choices=("shape", "objective"),
        default="shape",
        help="the fused levers' groups: the runs of one encoder shape (shape), or each objective's copies (objective)",
    )
    parser.add_argument("--batch", type=int, default=None, help="sequences per step; default the slot's (256)")
    parser.add_argument("--batch-factor", type=int, default=2, help="the batch lever's multiple of --batch")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8192, help="the slot's WordPiece vocabulary size")
    parser.add_argument(
        "--precision", choices=("bf16", "fp32"), default=None, help="default bf16 on a GPU, fp32 on a CPU"
    )
    parser.add_argument(
        "--levers", default=",".join(DEFAULT_LEVERS), help=f"comma-separated, of: {', '.join(ALL_LEVERS)}"
    )
    parser.add_argument(
        "--static-shapes",
        action="store_true",
        help="every batch max_seq_len wide without CUDA graphs too (static_shapes=true)",
    )
    parser.add_argument("--eager", action="store_true", help="no torch.compile (a CPU check of the machinery)")
    parser.add_argument("--warmup-steps", type=int, default=6, help="untimed steps per variant (compiles happen here)")
    parser.add_argument("--window-s", type=float, default=8.0, help="seconds each configuration is timed")
    parser.add_argument(
        "--warm-timeout-s", type=float, default=240.0, help="longest a phase's workers may take to warm up"
    )
    parser.add_argument(
        "--work", default=None, help="folder for the workers' specs and logs (default: a temporary one)"
    )
    parser.add_argument("--report", default=None, help="write the table as a report the docs can cite (a folder)")
    parser.add_argument("--override", action="append", default=[], help="an ablate_slot.yaml override (repeatable)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--peak", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][bench_slot] %(message)s")
    if args.worker:
        worker(args.worker)
        return 0
    if args.peak:
        peak_worker(args.peak, args.device)
        return 0
    import tempfile

    from pretrainlab.runtime import mps as mps_

    device = args.device or ("cuda" if _has_cuda() else "cpu")
    precision = args.precision or ("bf16" if device == "cuda" else "fp32")
    batch = args.batch or 256
    from pretrainlab.runtime.hydra import options

    known = options("objective")
    objectives = known if args.objectives == "all" else [o for o in args.objectives.split(",") if o]
    unknown_objectives = [o for o in objectives if o not in known]
    if unknown_objectives or not objectives:
        parser.error(f"--objectives {args.objectives}: choose among {', '.join(known)} (comma-separated), or all")
    for name, value in (("--batch", args.batch), ("--batch-factor", args.batch_factor), ("--seq-len", args.seq_len),
                        ("--vocab", args.vocab), ("--warmup-steps", args.warmup_steps), ("--copies", args.copies)):  # fmt: skip
        if value is not None and value < 1:
            parser.error(f"{name} {value}: give a whole number of 1 or more")
    for name, value in (("--window-s", args.window_s), ("--warm-timeout-s", args.warm_timeout_s)):
        if not (math.isfinite(value) and value > 0):
            parser.error(f"{name} {value}: give a number of seconds above 0")
    for name, folder, mark in (("--work", args.work, "results.json"), ("--report", args.report, "bench-slot.json")):
        path = Path(folder) if folder else None
        if (
            path is not None
            and path.exists()
            and (not path.is_dir() or (any(path.iterdir()) and not (path / mark).exists()))
        ):
            parser.error(
                f"{name} {folder}: a new or empty folder (or one this bench wrote), so that nothing there is overwritten"
            )
    levers = args.levers.split(",")
    unknown = [lever for lever in levers if lever not in ALL_LEVERS]
    if unknown:
        parser.error(f"--levers: {', '.join(unknown)} unknown; choose among {', '.join(ALL_LEVERS)}")
    if device != "cuda" and any("graphs" in lever or "mps" in lever for lever in levers):
        dropped = [lever for lever in levers if "graphs" in lever or "mps" in lever]
        log.warning("%s: CUDA graphs and MPS need a CUDA device; not timed on %s", ", ".join(dropped), device)
        levers = [lever for lever in levers if lever not in dropped]
    runs = copies_of(objectives, args.copies)
    fused = fused_groups(runs, args.model, args.override, args.fuse)
    grouped = {r for g in fused for r in g}
    fused_text = "; ".join(", ".join(g) for g in fused) or "none"
    log.info(
        "fused groups (by %s): %s; alone: %s", args.fuse, fused_text, ", ".join(r for r in runs if r not in grouped)
    )
    workers, configs = plan(runs, fused, levers, batch, args.batch_factor, args.static_shapes)
    if args.eager:
        for spec in workers.values():
            for v in spec["variants"].values():
                v["mode"] = None
    common = {
        "device": device,
        "model": args.model,
        "seq_len": args.seq_len,
        "vocab": args.vocab,
        "precision": precision,
        "warmup_steps": args.warmup_steps,
        "overrides": args.override,
    }
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-slot-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "results.json").write_text("{}")  # this bench's folder (its results at the end)
    t0 = time.time()
    peak, hardware = None, f"CPU, {os.cpu_count()} cores"
    if device == "cuda":
        peak_path = work / "peak.json"
        subprocess.run(
            [sys.executable, "-m", "pretrainlab.tools.bench_slot", "--peak", str(peak_path), "--device", device],
            check=True,
        )
        measured = json.loads(peak_path.read_text())
        peak, hardware = measured["flops_per_s"], f"1 x {measured['device']}"
        log.info("bf16 matrix-product peak: %.0f TFLOP/s", peak / 1e12)
    results: dict[str, dict] = {}
    rows: dict[str, dict] = {}
    notes: list[str] = []
    for phase_name, under_mps in (("plain", False), ("mps", True)):
        phase_configs = [c for c in configs if c.mps == under_mps]
        if not phase_configs:
            continue
        with mps_.mps(work / "mps", wanted=under_mps) as daemon:
            if under_mps and not daemon.running:
                results[phase_name] = {"not_run": f"not run: {daemon.reason}"}
                notes.append(daemon.status)
            else:
                if under_mps:
                    notes.append(daemon.status)
                phase = Phase(phase_name, work, workers, phase_configs, common, daemon.env)
                timeout = args.warm_timeout_s if not under_mps or "plain" not in results else args.warm_timeout_s * 0.6
                done = results[phase_name] = phase.run(args.window_s, 1.0, timeout)
                memory = sum(r.get("memory", 0) for r in done["rates"].values())
                slowest = max((max(r["warm_s"].values()) for r in done["ready"].values()), default=0.0)
                notes.append(
                    f"{phase_name} phase: {len(phase.workers)} processes, warm after {done['warm_s']:.0f} s (the slowest "
                    f"variant's compile and warm-up {slowest:.0f} s), {memory / 2**30:.1f} GiB reserved in all"
                )
                if under_mps and results[phase_name]["failed"]:
                    notes.append(f"MPS log: {mps_.daemon_log(work / 'mps', 5)}")
        rows = aggregate(configs, results, workers)
        about = (
            f"{hardware}; model={args.model}, {len(runs)} runs ({', '.join(runs)}), batch {batch} x "
            f"{args.seq_len} tokens, {precision}, {'eager' if args.eager else 'compiled'}"
            f"{', static shapes' if args.static_shapes else ''}; fused group{'s' if len(fused) > 1 else ''}: "
            f"{fused_text}; each configuration timed for {args.window_s:.0f} s after "
            f"{args.warmup_steps} warm-up steps per variant"
            + (f"; bf16 matrix-product peak {peak / 1e12:.0f} TFLOP/s (8192 x 8192, same call)" if peak else "")
            + f"; {'; '.join(notes)}; {time.time() - t0:.0f} s in all."
        )
        for name, r in rows.items():
            log.info(
                "%-18s %s",
                name,
                f"{r['flops_per_s'] / 1e12:.2f} TFLOP/s, {r['tokens_per_s'] / 1e6:.2f}M tok/s"
                if r["status"] == "ok"
                else r["status"],
            )
        if args.report:
            write_report(Path(args.report), configs, rows, peak, about)
    (work / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(json.dumps(rows, indent=1))
    return 0 if rows.get("today", {}).get("status") == "ok" else 1


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if __name__ == "__main__":
    sys.exit(main())

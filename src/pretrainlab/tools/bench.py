"""Pretraining-step speed: pretrainlab against Hugging Face transformers, same inputs, same run.

    python experiments/bench.py                                   # model=mini, seq 128, batch 32, fp32 (+ bf16)
    python experiments/bench.py --model tiny --precision fp32 --objectives roberta,electra
    python experiments/bench.py --data path/to/books                    # also time the data pipeline

For every objective and precision it runs a full training step (forward, backward, AdamW) of our
encoder + objective and of its transformers peer on the same batch (``tools.peers``: BertForPreTraining,
AlbertForPreTraining, RobertaForMaskedLM, ELECTRA's generator and discriminator composed)
and prints tokens/s, the ratio ours / HF, MFU (useful model FLOPs per second over this machine's
matmul peak, measured in the same run with torch.mm in the same dtype) and peak memory. Each side
runs in its own process, so peak memory (max RSS on CPU, max allocated on CUDA) is its own, and
the two processes take turns, one step at a time (ours, HF, HF, ours, ...): a slow spell of a
shared host slows both alike. The ratio is the median over pairs of neighbouring steps of
HF step time / our step time; tokens/s is each side's median step. ``--rounds`` repeats this in
new processes, and medians are taken over all rounds.
Both sides run with the process setting training uses (``keep_freed_memory``: glibc keeps freed
memory for the next step instead of faulting it in again); ``--malloc default`` measures without.
The package's modules are imported where a process needs them: the coordinator imports no model code, and
each worker only its side's, so that its peak memory is its own model's.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pretrainlab.runtime.hydra import CONF
from pretrainlab.tools.peers import PEERS, ElectraPair

ROOT = CONF.parent  # the repository: the workers run there
VOCAB = 30522
SPECIAL = {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}


# --- the machine's matmul peak ---------------------------------------------------------------------------
def peak_size(device: str) -> int:
    """The matmul size whose speed is the hardware's limit: 8192 on a GPU (2048 does not fill an
    H100), 2048 on a CPU (larger ones fall out of cache)."""
    return 8192 if device == "cuda" else 2048


def matmul_peak(dtype_name: str, device: str, n: int | None = None, windows: int = 5, seconds: float = 0.4) -> float:
    """FLOP/s of torch.mm on n x n matrices: the best of several short windows, so that a moment of
    contention on a shared machine does not lower the peak (and raise every MFU)."""
    import torch

    n = n or peak_size(device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    for _ in range(2):
        torch.mm(a, b)
    _sync(device)
    best = 0.0
    for _ in range(windows):
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            torch.mm(a, b)
            reps += 1
        _sync(device)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0))
    return best


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


# --- one case, in its own process ---------------------------------------------------------------------------
def make_batch(objective, seq_len: int, batch_size: int, seed: int = 0):
    """Random-token examples of exactly seq_len tokens (pairs for bert/albert), masked by our collator."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    examples = []
    for _ in range(batch_size):
        body = rng.integers(1000, VOCAB, size=seq_len - 3 if objective.uses_pooler else seq_len - 2)
        if objective.uses_pooler:  # [CLS] A [SEP] B [SEP]
            cut = int(rng.integers(8, len(body) - 8))
            ids = np.concatenate([[101], body[:cut], [102], body[cut:], [102]])
            types = np.r_[np.zeros(cut + 2, np.int64), np.ones(len(ids) - cut - 2, np.int64)]
            examples.append({"input_ids": ids.astype(np.int32), "token_type_ids": types, "label": rng.integers(2)})
        else:
            examples.append({"input_ids": np.concatenate([[101], body, [102]]).astype(np.int32)})
    batch = objective.collator()(examples, torch.Generator().manual_seed(seed))
    if "token_type_ids" not in batch:
        batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    return batch


def build_ours(objective_name: str, model: str):
    """Our encoder and objective, composed from conf/ as train.py composes them (without importing
    the training stack: the process's memory is the model's)."""
    import numpy as np

    from pretrainlab.pretraining.assembly import build_model  # lazily: each process's memory (module docstring)
    from pretrainlab.runtime.hydra import compose  # lazily: each process's memory (module docstring)
    from pretrainlab.tokens import SpecialTokens  # lazily: each process's memory (module docstring)

    tokens = SpecialTokens(
        VOCAB,
        SPECIAL["pad"],
        SPECIAL["unk"],
        SPECIAL["cls"],
        SPECIAL["sep"],
        SPECIAL["mask"],
        np.zeros(VOCAB, dtype=bool),
    )
    cfg, _ = compose("train", [f"model={model}", f"objective={objective_name}"])
    built = build_model(cfg, tokens)
    return built.encoder(), built.objective


def hf_labels(batch):
    """Our (batch, slots) masked positions as transformers' (batch, seq) MLM labels: the masked
    positions' original ids, -100 elsewhere (the empty slots carry -100 and point at [CLS])."""
    import torch

    return torch.full_like(batch["input_ids"], -100).scatter(1, batch["mlm_positions"], batch["mlm_labels"])


def hf_step_fn(objective_name: str, model, batch):
    """A closure computing the transformers loss on our batch (labels in HF's format)."""
    import torch

    ids, types, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
    labels = hf_labels(batch)
    peer = PEERS[objective_name]
    if objective_name != "electra":
        inputs = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        if peer.token_types:
            inputs["token_type_ids"] = types
        if peer.pair_label is not None:
            inputs[peer.pair_label] = batch["labels"]
        return lambda: model(**inputs).loss

    def electra():
        gen_out = model.gen(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels)
        with torch.no_grad():
            probs = torch.softmax(gen_out.logits.detach().float(), -1)
            sampled = torch.multinomial(probs.view(-1, probs.shape[-1]), 1).view_as(ids)
            masked = labels != -100
            disc_ids = torch.where(masked, sampled, ids)
            original = torch.where(masked, labels, ids)
            replaced = (disc_ids != original).long()
        disc_out = model.disc(input_ids=disc_ids, token_type_ids=types, attention_mask=mask, labels=replaced)
        return gen_out.loss + 50.0 * disc_out.loss

    return electra


class Case:
    """One side (ours or hf) of one objective and precision, built and ready to step."""

    def __init__(
        self,
        impl: str,
        objective_name: str,
        precision: str,
        model: str,
        seq_len: int,
        batch_size: int,
        device: str,
        compile_: bool,
        malloc: str = "keep",
    ):
        import torch

        from pretrainlab.runtime.malloc import keep_freed_memory  # lazily: each process's memory (module docstring)
        from pretrainlab.runtime.settings import (
            set_matmul_precision,
        )  # lazily: each process's memory (module docstring)

        if malloc == "keep":
            keep_freed_memory()
        set_matmul_precision(True)  # TF32 for fp32 on GPUs, as training does by default
        torch.manual_seed(0)
        encoder, objective = build_ours(objective_name, model)
        batch = {
            k: (v.to(device) if torch.is_tensor(v) else v)
            for k, v in make_batch(objective, seq_len, batch_size).items()
        }
        self.impl, self.objective, self.precision, self.device = impl, objective_name, precision, device
        self.n_tokens = int(batch["attention_mask"].sum())
        self.useful_flops = (
            objective.flops_per_token(encoder.config, seq_len) * self.n_tokens
        )  # the same count for both
        if impl == "ours":
            encoder.to(device), objective.to(device)
            params = [p for m in (encoder, objective) for p in m.parameters() if p.requires_grad]
            self.fn = lambda: objective(encoder, batch).loss
        else:
            hf = PEERS[objective_name].model(encoder.config, VOCAB)  # its transformers peer (tools.peers)
            module = hf.module if isinstance(hf, ElectraPair) else hf
            module.to(device).train()
            params = [p for p in module.parameters() if p.requires_grad]
            self.fn = hf_step_fn(objective_name, hf, batch)
        if compile_:  # forward and loss, for both sides
            self.fn = torch.compile(self.fn, dynamic=False)
        # fused AdamW for both: ours by default, and transformers' Trainer default with torch >= 2.8
        self.opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
        self.dtype = torch.bfloat16 if precision == "bf16" else None

    def step(self) -> float:
        """One training step; its wall time in seconds."""
        import torch

        t0 = time.perf_counter()
        with torch.autocast(device_type=self.device, dtype=self.dtype, enabled=self.dtype is not None):
            loss = self.fn()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        _sync(self.device)
        return time.perf_counter() - t0

    def peak_memory(self) -> float:
        """Bytes: max RSS of this process on CPU, max allocated on CUDA."""
        import torch

        if self.device == "cuda":
            return torch.cuda.max_memory_allocated()
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def serve(case: Case) -> None:
    """A case's child process: steps when told to, one JSON line per command (stdin -> stdout).

    ``warmup N`` -> {"warmup_s"}; ``step`` -> {"step_s", "started", "page_faults"}; ``done`` -> {"peak_mem_mb", ...}."""
    out, sys.stdout = sys.stdout, sys.stderr  # stdout carries the replies only
    for line in sys.stdin:
        cmd, *arg = line.split()
        if cmd == "warmup":
            t0 = time.perf_counter()
            for _ in range(int(arg[0])):
                case.step()
            if case.device == "cuda":
                import torch

                torch.cuda.reset_peak_memory_stats()
            reply = {"warmup_s": time.perf_counter() - t0}
        elif cmd == "step":
            faults, started = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.time()
            step_s = case.step()
            reply = {
                "step_s": step_s,
                "started": started,
                "page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
            }
        elif cmd == "done":
            reply = {
                "peak_mem_mb": case.peak_memory() / 2**20,
                "n_tokens": case.n_tokens,
                "useful_flops": case.useful_flops,
            }
        else:
            raise ValueError(f"unknown command {line!r}: expected warmup N, step or done")
        out.write(json.dumps(reply) + "\n")
        out.flush()
        if cmd == "done":
            return


class Worker:
    """The parent's handle on a case's child process."""

    def __init__(self, name: str, cmd: list[str]):
        self.name = name
        self.stderr = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty child never blocks on it
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, cwd=ROOT
        )

    def ask(self, command: str) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None  # opened as pipes
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.stderr.seek(0)
            raise RuntimeError(f"case {self.name} failed:\n{self.stderr.read()[-3000:]}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            self.proc.stdin.close()
            self.proc.wait()
        self.stderr.close()


def run_pair(case: str, worker_cmd, steps: int, warmup: int) -> dict[str, dict]:
    """Ours and HF in two processes, their timed steps interleaved (ours, HF, HF, ours, ...): a slow
    spell of the host slows both sides alike, and each pair of neighbouring steps gives one ratio."""
    workers = {impl: Worker(f"{impl}:{case}", worker_cmd(impl)) for impl in ("ours", "hf")}
    try:
        warm = {impl: w.ask(f"warmup {warmup}")["warmup_s"] for impl, w in workers.items()}
        replies: dict[str, list[dict]] = {"ours": [], "hf": []}
        for i in range(steps):
            for impl in ("ours", "hf") if i % 2 == 0 else ("hf", "ours"):
                replies[impl].append(workers[impl].ask("step"))
        final = {impl: w.ask("done") for impl, w in workers.items()}
    finally:
        for w in workers.values():
            w.close()
    return {
        impl: {
            "times": [r["step_s"] for r in replies[impl]],
            "started": [r["started"] for r in replies[impl]],
            "warmup_s": warm[impl],
            "page_faults_per_step": statistics.mean(r["page_faults"] for r in replies[impl]),
            **final[impl],
        }
        for impl in workers
    }


# --- data pipeline --------------------------------------------------------------------------------------
def bench_data(path: str, objective_name: str, seq_len: int, batch_size: int, workers: int) -> None:
    import shutil

    from pretrainlab.data.corpus import TextFiles  # lazily: each process's memory (module docstring)
    from pretrainlab.data.datamodule import PretrainDataModule  # lazily: each process's memory (module docstring)
    from pretrainlab.data.pipeline import PretrainData  # lazily: each process's memory (module docstring)
    from pretrainlab.data.tokenizer import TokenizerSpec  # lazily: each process's memory (module docstring)
    from pretrainlab.tokens import special_tokens  # lazily: each process's memory (module docstring)

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("    %(message)s"))
    stages = logging.getLogger("pretrainlab")  # each stage logs its own time
    stages.setLevel(logging.INFO)
    stages.addHandler(handler)
    cache = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    try:
        times = []
        for attempt in ("first (cold cache)", "second (cached)"):
            t0 = time.perf_counter()
            data = PretrainData(TextFiles(files=[path], strip_gutenberg=True), TokenizerSpec(), cache)
            tokens = special_tokens(data.tokenizer)
            encoder, objective = build_ours(objective_name, "mini")
            objective = type(objective)(
                encoder_config=encoder.config.__class__(
                    **{**encoder.config.to_dict(), "vocab_size": tokens.vocab_size}
                ),
                tokens=tokens,
            )
            store = data.examples(objective.example_builder(seq_len), "train")
            data.examples(objective.example_builder(seq_len), "val")
            times.append(time.perf_counter() - t0)
            print(f"data pipeline, {attempt}: {times[-1]:.1f}s ({len(store):,} examples, {store.num_tokens:,} tokens)")
        dm = PretrainDataModule(
            data, objective.example_builder(seq_len), objective.collator(), batch_size, 0, num_workers=workers
        )
        dm.prepare()
        loader = dm.train_dataloader()
        it = iter(loader)
        next(it)
        t0, n = time.perf_counter(), 0
        for _ in range(50):
            next(it)
            n += 1
        per_batch = (time.perf_counter() - t0) / n
        print(
            f"DataLoader ({workers} worker(s)): {1000 * per_batch:.1f} ms per batch of {batch_size} "
            f"(compare with the step times above: the step never waits when this is smaller)"
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# --- main ---------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mini", help="comma-separated model presets: a grid, e.g. mini,base")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=None, help="default: 256 on a GPU, 32 on a CPU")
    parser.add_argument("--objectives", default=None, help="comma-separated (default: every conf/objective/ option)")
    parser.add_argument(
        "--precision",
        default="auto",
        help="comma-separated fp32,bf16; auto: fp32, plus bf16 where the hardware has it natively",
    )
    parser.add_argument("--steps", type=int, default=5, help="timed steps per side and round, ours and HF interleaved")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="times each objective runs, in new processes minutes apart; medians are over all rounds",
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compile happens here)")
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the step's forward and loss, on both sides (warm-up cost reported)",
    )
    parser.add_argument(
        "--malloc",
        choices=("keep", "default"),
        default="keep",
        help="keep: freed memory is kept for reuse (pretrainlab.runtime.malloc, as in training), both sides; "
        "default: glibc's defaults",
    )
    parser.add_argument("--data", default=None, help="a corpus (file or directory) to time the data pipeline on")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--report", default=None, help="also write the table as a report the docs can cite (a folder)")
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.batch is None:
        args.batch = 256 if args.device == "cuda" else 32

    if args.case:  # a child process: one side of one case, stepping on command
        impl, objective, precision = args.case.split(":")
        serve(
            Case(
                impl, objective, precision, args.model, args.seq_len, args.batch, args.device, args.compile, args.malloc
            )
        )
        return 0

    import torch

    from pretrainlab.runtime.settings import set_matmul_precision  # lazily: each process's memory (module docstring)

    set_matmul_precision(True)  # the peak and both sides with TF32 for fp32 on GPUs, as training

    native_bf16 = _native_bf16(args.device)
    hardware = (
        torch.cuda.get_device_name()
        if args.device == "cuda"
        else f"CPU {torch.backends.cpu.get_cpu_capability()}, bf16 {'native' if native_bf16 else 'emulated'}"
    )
    print(
        f"torch {torch.__version__}, {args.device} ({hardware}), {torch.get_num_threads()} threads; "
        f"model={args.model}, seq {args.seq_len}, batch {args.batch}; {args.steps} timed steps after "
        f"{args.warmup} warm-up; malloc {args.malloc}"
    )
    if args.precision == "auto":
        args.precision = "fp32,bf16" if native_bf16 else "fp32"
        if not native_bf16:
            print(
                "bf16 skipped: this CPU has no native bf16 (AVX512-BF16 or AMX), so bf16 matmuls run in a slow "
                "emulation (20-30x slower than fp32, measured on an AVX2-only CPU); --precision fp32,bf16 measures it anyway"
            )
    results = []
    if args.objectives is None:  # every objective of conf/objective/ that has a transformers peer
        from pretrainlab.runtime.hydra import options  # lazily: each process's memory (module docstring)

        objectives = [o for o in options("objective") if o in PEERS]
        for o in sorted(set(options("objective")) - set(PEERS)):
            print(f"{o}: no transformers peer in this benchmark; not measured")
    else:
        objectives = [o for o in args.objectives.split(",") if o]
    unknown = [o for o in objectives if o not in PEERS]
    if unknown:
        parser.error(f"unknown objective(s) {', '.join(unknown)}: choose from {', '.join(PEERS)}")
    cells = [(m, p) for m in args.model.split(",") if m for p in args.precision.split(",") if objectives]
    about = f"{args.device} ({hardware}), {torch.get_num_threads()} threads; seq {args.seq_len}, batch {args.batch}"
    for done, (model, precision) in enumerate(cells, 1):
        results += bench_cases(args, model, precision, objectives)
        # written after every model and precision: a run cut off (a GPU slot's time limit) keeps what it measured
        left = "" if done == len(cells) else f"; {done} of {len(cells)} model/precision cells (the run did not finish)"
        write_outputs(args, results, about + left)
    if not cells:
        write_outputs(args, results, about)
    if results:
        print_table(results)
        if args.report:
            print(f"report -> {args.report} (python tools/docs.py publish {args.report} --name <name>)")
    if args.data:
        print()
        bench_data(args.data, "roberta", args.seq_len, args.batch, args.workers)
    return 0


def write_outputs(args, results: list[dict], about: str) -> None:
    """``--json`` and ``--report`` with the cases measured so far."""
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if args.report and results:
        from pretrainlab.compare.measurements import (
            write_table_report,  # lazily: each process's memory (module docstring)
        )

        write_table_report(
            Path(args.report), "Pretraining step: ours against transformers", COLUMNS, table_rows(results), about
        )


def bench_cases(args, model: str, precision: str, objectives: list[str]) -> list[dict]:
    """Every objective of one model and precision, in rounds; the matmul peak before and after."""
    before = matmul_peak(precision, args.device)
    print(f"\nmodel={model}, {precision}:")
    runs: dict[str, list[dict[str, dict]]] = {}
    for round_ in range(args.rounds):  # rounds apart in time, in new processes
        for objective in objectives:
            case = f"{objective}:{precision}"

            def worker_cmd(impl: str, case=case) -> list[str]:
                return [
                    sys.executable,
                    "-m",
                    "pretrainlab.tools.bench",
                    "--case",
                    f"{impl}:{case}",
                    "--model",
                    model,
                    "--seq-len",
                    str(args.seq_len),
                    "--batch",
                    str(args.batch),
                    "--device",
                    args.device,
                    "--malloc",
                    args.malloc,
                ] + (["--compile"] if args.compile else [])

            pair = run_pair(case, worker_cmd, args.steps, args.warmup)
            runs.setdefault(objective, []).append(pair)
            ours, hf = (_tokens_per_s(pair[impl]) for impl in ("ours", "hf"))
            print(
                f"  round {round_ + 1}  {objective:8s} ours {ours:8.0f} tok/s | HF {hf:8.0f} tok/s | "
                f"ours/HF {statistics.median(_ratios(pair)):.2f}x"
                + (
                    f"  (compile warm-up ours {pair['ours']['warmup_s']:.1f}s, HF {pair['hf']['warmup_s']:.1f}s)"
                    if args.compile
                    else ""
                )
            )
    cases = []
    for objective in objectives:
        pairs = runs[objective]
        ratio = statistics.median([r for pair in pairs for r in _ratios(pair)])
        for impl in ("ours", "hf"):
            times = [t for pair in pairs for t in pair[impl]["times"]]
            last = pairs[-1][impl]
            per_step = statistics.median(times)
            cases.append(
                {
                    "impl": impl,
                    "model": model,
                    "objective": objective,
                    "precision": precision,
                    "step_s": per_step,
                    "tokens_per_s": last["n_tokens"] / per_step,
                    "flops_per_s": last["useful_flops"] / per_step,
                    "ours_over_hf": ratio,
                    "warmup_s": pairs[0][impl]["warmup_s"],
                    "step_times": times,
                    "step_started": [t for pair in pairs for t in pair[impl]["started"]],
                    "rounds": [_tokens_per_s(p[impl]) for p in pairs],
                    "peak_mem_mb": max(p[impl]["peak_mem_mb"] for p in pairs),
                    "page_faults_per_step": statistics.mean(p[impl]["page_faults_per_step"] for p in pairs),
                }
            )
    # measured before and after the cases: the machine's speed drifts on shared hosts
    peak = max(before, matmul_peak(precision, args.device))
    n = peak_size(args.device)
    print(f"  matmul peak (torch.mm {n}x{n}, best of before and after): {peak / 1e9:.1f} GFLOP/s")
    for r in cases:
        r["mfu"] = r["flops_per_s"] / peak
        r["peak_flops"] = peak
    return cases


def _tokens_per_s(side: dict) -> float:
    """One side of one round: tokens per second at its median step."""
    return side["n_tokens"] / statistics.median(side["times"])


def _ratios(pair: dict[str, dict]) -> list[float]:
    """HF step time / our step time, for each pair of neighbouring steps."""
    return [h / o for o, h in zip(pair["ours"]["times"], pair["hf"]["times"])]


COLUMNS = [
    "model",
    "objective",
    "precision",
    "ours tok/s",
    "HF tok/s",
    "ours / HF",
    "ours MFU",
    "HF MFU",
    "ours MB",
    "HF MB",
]


def table_rows(results: list[dict]) -> list[list[str]]:
    """One row per case: ours and transformers side by side (``results`` alternates ours, HF)."""
    rows = []
    for i in range(0, len(results), 2):
        o, h = results[i], results[i + 1]
        rows.append(
            [
                o["model"],
                o["objective"],
                o["precision"],
                f"{o['tokens_per_s']:.0f}",
                f"{h['tokens_per_s']:.0f}",
                f"{o['ours_over_hf']:.2f}x",
                f"{100 * o['mfu']:.0f}%",
                f"{100 * h['mfu']:.0f}%",
                f"{o['peak_mem_mb']:.0f}",
                f"{h['peak_mem_mb']:.0f}",
            ]
        )
    return rows


def print_table(results: list[dict]) -> None:
    print("\n| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in table_rows(results):
        print("| " + " | ".join(row) + " |")


def _native_bf16(device: str) -> bool:
    import torch

    if device == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if __name__ == "__main__":
    sys.exit(main())

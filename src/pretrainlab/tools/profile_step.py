"""Where a training step's time goes: the top kernels (GPU) or operators (CPU) of our step, by time.

    python experiments/profile_step.py --model base --objective roberta --precision bf16
    python experiments/profile_step.py --model mini --objective electra --compile --top 30

Builds the same step as experiments/bench.py (our encoder + objective, random tokens, fused AdamW,
bf16 autocast), runs warm-up steps (compilation happens there), then profiles a few steps with
torch.profiler and prints the step's wall time, the share of device time in GEMMs, attention and
everything else, and the kernels that take the most time, each with its calls per step.
"""

from __future__ import annotations

import argparse
import sys

from pretrainlab.tools.bench import Case

GEMM = ("gemm", "matmul", "xmma", "cutlass", "nvjet", "aten::addmm", "aten::mm", "aten::bmm")
ATTENTION = ("flash", "fmha", "attention", "sdpa", "cudnn_generated_fort_native_sdpa")


def kind(name: str) -> str:
    low = name.lower()
    if any(k in low for k in ATTENTION):
        return "attention"
    if any(k in low for k in GEMM):
        return "gemm"
    return "other"


def main(argv: list[str] | None = None) -> int:
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mini")
    parser.add_argument("--objective", default="roberta")
    parser.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=None, help="default: 256 on a GPU, 32 on a CPU")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    batch = args.batch or (256 if args.device == "cuda" else 32)

    case = Case("ours", args.objective, args.precision, args.model, args.seq_len, batch, args.device, args.compile)
    for _ in range(args.warmup):
        case.step()
    times = [case.step() for _ in range(args.steps)]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            case.step()

    gpu = args.device == "cuda"
    rows = []
    for e in prof.key_averages():
        if gpu:  # the kernels themselves (the operators that launch them carry the same time again)
            t = e.self_device_time_total
            if e.device_type != DeviceType.CUDA or t <= 0:
                continue
        else:
            t = e.self_cpu_time_total
            if not e.key.startswith("aten::") or t <= 0:
                continue
        rows.append((t / args.steps, e.count / args.steps, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    shares = {k: sum(r[0] for r in rows if kind(r[2]) == k) / total for k in ("gemm", "attention", "other")}
    step_ms = 1e3 * sorted(times)[len(times) // 2]
    print(
        f"{args.model} {args.objective} {args.precision} batch {batch} x {args.seq_len}"
        f"{' compiled' if args.compile else ''} on {torch.cuda.get_device_name() if gpu else 'CPU'}: "
        f"step {step_ms:.2f} ms wall, {total / 1e3:.2f} ms {'kernel' if gpu else 'operator'} time; "
        f"{case.useful_flops / (step_ms / 1e3) / 1e12:.1f} TFLOP/s useful"
        + (f", the GPU busy {100 * total / 1e3 / step_ms:.0f}% of the step" if gpu else "")
    )
    print("  shares: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in shares.items()))
    print(f"  {'ms/step':>8} {'%':>5} {'calls':>6}  {'kernel' if gpu else 'operator'}")
    for t, calls, name in rows[: args.top]:
        print(f"  {t / 1e3:8.3f} {100 * t / total:5.1f} {calls:6.0f}  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

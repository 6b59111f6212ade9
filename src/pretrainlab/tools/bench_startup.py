"""What it costs a study to start its processes: started fresh against forked from the fork server.

    python experiments/bench_startup.py                       # 4 processes each way, the study's imports
    python experiments/bench_startup.py --processes 8 --report runs/bench-startup
    python experiments/bench_startup.py --wandb               # each process also starts an offline W&B run

Each process is what a study's process is up to its first step of work: it imports what a study's work
imports (``studies.parallel``: torch, Lightning, the package) and exits; ``--module`` runs another
``python -m <module>`` instead. Started ``--processes`` at once, fresh (``subprocess``) and then forked
from a ``studies.forkserver.ForkServer`` (its own imports included), each way's wall-clock until the last
one ended and its CPU seconds (every process, the server's included: this process's children's usage), and
the ratio fresh / forked. The processes share this machine's cores, as a study's do.

``--wandb``: each process also starts (and finishes) an offline W&B run, as a run that logs to W&B does, and
the fresh ones are started twice: importing W&B after torch, then first (``runtime.early``, what the commands
do), which its first run makes cheaper.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORK = "pretrainlab.studies.parallel"  # what every process of a study imports before its work


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fresh(command: list[str], processes: int, logs: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ``processes`` fresh ``python <command>`` at once, in ``env``."""
    cpu, started = _children_cpu(), time.perf_counter()
    procs = []
    for i in range(processes):
        with open(logs / f"fresh-{i}.log", "ab") as out:
            procs.append(subprocess.Popen([sys.executable, *command], stdout=out, stderr=subprocess.STDOUT, env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"a fresh process failed (exit statuses {codes}): see {logs}")
    return time.perf_counter() - started, _children_cpu() - cpu


def forked(
    command: list[str], processes: int, logs: Path, preload: tuple[str, ...], env: dict[str, str]
) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ``processes`` ``python <command>`` forked at once from a fork server
    that imports ``preload`` first (its start and imports counted), in ``env``."""
    from pretrainlab.studies.forkserver import ForkServer

    cpu, started = _children_cpu(), time.perf_counter()
    with ForkServer(preload) as server:
        cwd = os.getcwd()
        procs = [server.popen(command, logs / f"forked-{i}.log", env, cwd) for i in range(processes)]
        codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"a forked process failed (exit statuses {codes}): see {logs}")
    return time.perf_counter() - started, _children_cpu() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python experiments/bench_startup.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--processes", type=int, default=4, help="processes started at once, each way")
    parser.add_argument(
        "--module",
        default=None,
        help="what each process runs (python -m <module>; default: "
        "one that imports what a study's process imports, then exits)",
    )
    parser.add_argument("--wandb", action="store_true", help="each process also starts an offline W&B run")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)  # one of those processes
    parser.add_argument("--wandb-order", choices=("after", "first"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--preload", default=None, help="what the fork server imports (default: the study's)")
    parser.add_argument("--report", type=Path, default=None, help="write a report here (docs publish takes it)")
    args = parser.parse_args(argv)
    if args.probe:  # a process's start: what a study's work imports, then its work would begin
        import importlib

        from pretrainlab.runtime.early import import_wandb_first

        if args.wandb_order == "first":
            import_wandb_first(True)
        importlib.import_module(WORK)
        if args.wandb_order:
            _wandb_run()
        return 0
    if args.processes < 1:
        parser.error(f"--processes {args.processes}: give 1 or more")
    from pretrainlab.studies.forkserver import PRELOAD

    preload = tuple(p for p in (args.preload.split(",") if args.preload else PRELOAD) if p)
    if args.module and args.wandb:
        parser.error("--wandb times this tool's own probe: leave out --module")
    probe = ["-m", "pretrainlab.tools.bench_startup", "--probe"]
    command = ["-m", args.module] if args.module else probe + (["--wandb-order", "first"] if args.wandb else [])
    n = args.processes
    rows = []
    with tempfile.TemporaryDirectory(prefix="pretrainlab-startup-") as tmp:
        env = {**os.environ, "WANDB_DIR": tmp, "WANDB_SILENT": "true"}  # the probes' W&B runs, gone with tmp
        if args.wandb:
            a_wall, a_cpu = fresh([*probe, "--wandb-order", "after"], n, Path(tmp), env)
            rows.append(_row("fresh, W&B imported after torch", n, a_wall, a_cpu))
        f_wall, f_cpu = fresh(command, n, Path(tmp), env)
        k_wall, k_cpu = forked(command, n, Path(tmp), preload, env)
    rows += [
        _row("fresh" + (", W&B imported first" if args.wandb else ""), n, f_wall, f_cpu),
        _row("forked (server included)", n, k_wall, k_cpu),
    ]
    about = (
        f"{n} processes at once, each `python {' '.join(command)}`, started fresh and then forked from a fork server "
        f"that imports {', '.join(preload)}; {os.cpu_count()} cores. Fresh / forked: CPU {f_cpu / k_cpu:.1f}x, "
        f"wall-clock {f_wall / k_wall:.1f}x."
    )
    if args.wandb:
        about += (
            f" Each process also starts an offline W&B run; with W&B imported after torch, its fresh processes "
            f"took {a_cpu / n:.1f} s of CPU each, {a_cpu / f_cpu:.2f}x the {f_cpu / n:.1f} s with W&B first."
        )
    print(about)
    for row in rows:
        print(f"  {row[0]:26s} wall {row[2]:>6s} s   CPU {row[3]:>6s} s   ({row[4]} s a process)")
    if args.report is not None:
        from pretrainlab.compare.measurements import write_table_report

        columns = ["started", "processes", "wall-clock (s)", "CPU (s)", "CPU per process (s)"]
        write_table_report(args.report, "Starting a study's processes: fresh against forked", columns, rows, about)
        print(f"report -> {args.report} (python tools/docs.py publish {args.report} --name <name>)")
    return 0


def _row(started: str, processes: int, wall: float, cpu: float) -> list:
    """A row of the table: how the processes started, how many, wall-clock, CPU and CPU per process."""
    return [started, processes, _seconds(wall), _seconds(cpu), _seconds(cpu / processes)]


def _seconds(s: float) -> str:
    """Seconds to a tenth, or to a thousandth under one: a light process (``--module this``) takes
    hundredths of a second on a fast machine, which a tenth rounds to 0."""
    return f"{s:.1f}" if s >= 1 else f"{s:.3f}"


def _wandb_run() -> Path:
    """An offline W&B run started and finished, as a run that logs to W&B does, in ``WANDB_DIR`` (given to
    ``wandb.init``: W&B reads its environment once per process); returns the run's folder."""
    import wandb

    run = wandb.init(project="bench-startup", mode="offline", dir=os.environ.get("WANDB_DIR"))
    wandb.finish()
    return Path(run.dir)


if __name__ == "__main__":
    sys.exit(main())

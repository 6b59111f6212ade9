"""Several pretraining runs of a study at once (``jobs`` in conf/ablate.yaml), each in its own process
with an equal share of the CPU cores.

A small encoder does not keep two cores busy with one run: on a 2-core CPU two ``model=tiny`` runs
with a thread each train at 1.8x the rate of one run with both threads (docs/learning.md). Each run
is the same as it would be one at a time (its config, directory, checkpoints, export), except that
its arithmetic uses fewer threads, which moves CPU results within their noise.

Every run writes its console output to ``<study>/pretrain/<run>.log``. A run that fails stops the
study once the runs in progress have finished, naming the run, its exit status and its log. A
SIGTERM or Ctrl-C to the study is passed on to every run in progress as one SIGTERM: each finishes
its optimizer step, saves its checkpoint and exits, and the study exits with the command that
continues it. The runs are started in their own sessions, so that a terminal's Ctrl-C reaches them
only through the study, once.

    python -m pretrainlab.studies.parallel <spec.yaml>   # one run (what the study starts)
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("pretrainlab")


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def check_jobs(jobs: int, configs: list[DictConfig]) -> int:
    """``jobs``, checked: a positive integer, and 1 for runs that train on several devices (each such
    run is already parallel, and several of them would compete for the same devices)."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs={jobs!r}: give the number of pretraining runs to train at once, 1 or more.")
    several = [c for c in configs if str(c.trainer.get("devices", 1)) not in ("1", "auto")]
    if jobs > 1 and several:
        raise ValueError(
            f"jobs={jobs} with trainer.devices={several[0].trainer.devices}: a run on several devices is "
            f"parallel already; set jobs=1 (conf/ablate.yaml or the command line)."
        )
    return jobs


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_parallel(planned: list[tuple[Path, DictConfig, dict]], jobs: int, resume_hint: str) -> None:
    """Pretrain every (run directory, composed config, choices) of ``planned``, ``jobs`` at a time,
    each with ``cores() // jobs`` threads (at least one)."""
    threads = max(1, cores() // jobs)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    queue = list(planned)
    running: dict[subprocess.Popen, tuple[str, Path]] = {}
    failed: list[tuple[str, int, Path]] = []
    with tempfile.TemporaryDirectory(prefix="pretrainlab-study-") as tmp:
        try:
            while queue or running:
                while queue and len(running) < jobs and not failed:
                    run_dir, cfg, choices = queue.pop(0)
                    spec = Path(tmp) / f"{run_dir.name}.yaml"
                    OmegaConf.save(
                        OmegaConf.create(
                            {"cfg": cfg, "run_dir": str(run_dir), "choices": dict(choices), "resume": resume_hint}
                        ),
                        spec,
                    )
                    log_path = run_dir.parent / f"{run_dir.name}.log"
                    log_path.parent.mkdir(parents=True, exist_ok=True)
                    with open(log_path, "ab") as out:
                        proc = subprocess.Popen(
                            [sys.executable, "-m", "pretrainlab.studies.parallel", str(spec)],
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            env=env,
                            start_new_session=True,
                        )
                    name = f"{cfg.objective.name} seed {cfg.seed}"
                    running[proc] = (name, log_path)
                    log.info("pretraining %s: started, %d thread(s) (log: %s)", name, threads, log_path)
                time.sleep(0.5)
                for proc in [p for p in running if p.poll() is not None]:
                    name, log_path = running.pop(proc)
                    if proc.returncode == 0:
                        log.info("pretraining %s: done", name)
                    else:
                        failed.append((name, proc.returncode, log_path))
                        log.error("pretraining %s failed (exit status %d): see %s", name, proc.returncode, log_path)
                if failed and not running:
                    break
        except BaseException:  # the study's SIGTERM (SystemExit) or Ctrl-C: every run saves and stops
            for proc in running:
                proc.send_signal(signal.SIGTERM)
            for proc, (name, _) in running.items():
                proc.wait()
                log.warning("pretraining %s: stopped at its last checkpoint (exit status %d)", name, proc.returncode)
            raise
    if failed:
        name, code, log_path = failed[0]
        raise RuntimeError(
            f"pretraining {name} failed with exit status {code}; the end of {log_path}:\n{_tail(log_path)}\n"
            f"Fix what it names, then continue the study with:\n  {resume_hint}"
        )


def _main(spec_path: str) -> None:
    import pretrainlab.runtime.hydra  # noqa: F401  (the resolvers the configs use)
    from pretrainlab.pretraining import run as pretraining

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    spec = OmegaConf.load(spec_path)
    pretraining.run(spec.cfg, spec.run_dir, choices=dict(spec.choices), resume_hint=spec.resume)


if __name__ == "__main__":
    _main(sys.argv[1])

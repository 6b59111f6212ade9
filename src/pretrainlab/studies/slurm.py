"""A study's runs as SLURM jobs (``launcher=slurm`` in conf/ablate.yaml), submitted through submitit.

Each pretraining run is one job; each encoder's evaluation suite (the final encoder, a snapshot, the
scratch baseline) is one job that starts after its pretraining job succeeded (``afterok``). A job runs
exactly what the local launcher runs in a process of its own (``studies.parallel``: the same spec, the
same code), so a study gives the same runs and results whichever launcher ran it.

What the study submitted is recorded in ``<study>/slurm/jobs.json`` (each job's name, id, what it runs
and its attempts); a job writes ``<name>.done`` when its work finished, so a job's end is known exactly
without SLURM's accounting. Running the same command again continues: a job still pending or running
is followed, not submitted again; a finished one is collected; one that failed, was cancelled or is
no longer known to SLURM is submitted again (its work resumes from what it saved).

Signals. SLURM sends a job ``SIGUSR2`` ``signal_s`` seconds before its time limit: the job's run
saves its checkpoint at the end of the optimizer step, as on SIGTERM, and requeues the job
(``scontrol requeue``), which then resumes from that checkpoint (``ckpt_path=auto``). A preemption or
a ``scontrol requeue`` sends SIGTERM and requeues the job itself: the run saves and exits, and resumes
when the job starts again. A requeued job is not a failure. Ctrl-C or SIGTERM to the study cancels
the jobs this study submitted (by their ids, no others) and prints the command that continues it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from pretrainlab import atomic
from pretrainlab.config import ConfigError
from pretrainlab.studies.parallel import Work, run_work

log = logging.getLogger("pretrainlab")

JOBS = "jobs.json"
# SLURM's states of a job that is still on its way (it will run, or runs, or is being requeued)
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
          "SUSPENDED", "STAGE_OUT", "SIGNALING", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}  # fmt: skip
# ends that are the cluster's, not the work's: the job is submitted again (its run resumes), up to RETRIES times
LOST = {"PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "LOST"}
RETRIES = 3


class SlurmError(RuntimeError):
    """A study's SLURM job that failed, or a cluster that cannot take the study's jobs."""


@dataclass(frozen=True)
class Resources:
    """What one job asks SLURM for."""

    gpus: int
    cpus: int
    mem_gb: float | None
    time_min: int

    def sbatch(self) -> list[str]:
        out = [f"--cpus-per-task={self.cpus}", f"--time={self.time_min}"]
        if self.gpus:
            out.append(f"--gpus-per-node={self.gpus}")
        if self.mem_gb:
            out.append(f"--mem={int(self.mem_gb * 1024)}M")
        return out


def resources(cfg: DictConfig, kind: str) -> Resources:
    """The resources of a ``kind`` job (``pretrain`` or ``evaluate``) from ``cfg.slurm``, checked."""
    s = cfg.slurm
    part = s.get(kind) or {}
    values: dict[str, Any] = {
        k: part.get(k) if part.get(k) is not None else s.pretrain.get(k) for k in ("gpus", "cpus", "mem_gb", "time_min")
    }
    for key, low in (("gpus", 0), ("cpus", 1), ("time_min", 1)):
        v = values[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ConfigError(
                f"slurm.{kind}.{key}={v!r}: give a whole number of at least {low} (conf/ablate.yaml, slurm)."
            )
    if values["mem_gb"] is not None and not (isinstance(values["mem_gb"], (int, float)) and values["mem_gb"] > 0):
        raise ConfigError(
            f"slurm.{kind}.mem_gb={values['mem_gb']!r}: give the memory in GB, or null for the partition's default."
        )
    signal_s = s.get("signal_s", 120)
    if not isinstance(signal_s, int) or isinstance(signal_s, bool) or signal_s < 1:
        raise ConfigError(
            f"slurm.signal_s={signal_s!r}: give the seconds of warning before the time limit, at least 1."
        )
    if values["time_min"] * 60 <= signal_s:
        raise ConfigError(
            f"slurm.{kind}.time_min={values['time_min']} leaves no time before the warning slurm.signal_s={signal_s} "
            f"seconds ahead of the limit: raise the time limit or lower signal_s."
        )
    return Resources(int(values["gpus"]), int(values["cpus"]), values["mem_gb"], int(values["time_min"]))


def check_cluster() -> None:
    """Refuse, before any work, a machine that cannot submit to SLURM (no submitit, no ``sbatch``, or no
    controller answering)."""
    try:
        import submitit  # noqa: F401  (an optional dependency: checked here, imported where jobs are submitted)
    except ImportError:
        raise ConfigError(
            "launcher=slurm submits its jobs through submitit, which is not installed: pip install 'pretrainlab[slurm]'."
        ) from None
    try:
        subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30, check=True)
    except FileNotFoundError:
        raise ConfigError(
            "launcher=slurm, but this machine has no SLURM commands (sinfo, sbatch): run the study from a cluster's "
            "login node, or use launcher=local."
        ) from None
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        said = getattr(e, "stderr", "") or ""
        raise ConfigError(
            f"launcher=slurm, but the SLURM controller does not answer (sinfo: {said.strip()})."
        ) from None


# --- what runs inside a job -------------------------------------------------------------------------------


class JobWork:
    """The callable submitit pickles into a job: runs one piece of a study's work (a spec file of
    ``studies.parallel``) and writes ``<name>.done`` when it finished. On SIGUSR2 (the time limit is
    near) the run saves as on SIGTERM and the job requeues itself."""

    def __init__(self, spec: str, done: str):
        self.spec, self.done = spec, done

    def __call__(self) -> None:
        requeue = {"asked": False}

        def near_the_limit(signum: int, frame: Any) -> None:
            log.warning("SIGUSR2: the job's time limit is near; saving, then requeueing the job")
            requeue["asked"] = True
            os.kill(os.getpid(), signal.SIGTERM)  # what a run saves and stops on

        def stop(signum: int, frame: Any) -> None:  # outside training (which saves first, then stops)
            raise SystemExit(128 + signum)

        logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)}
        signal.signal(signal.SIGTERM, stop)  # submitit's own handler ignores SIGTERM
        signal.signal(signal.SIGUSR2, near_the_limit)
        try:
            run_work(self.spec)
        except SystemExit as e:
            if requeue["asked"]:
                job = os.environ.get("SLURM_JOB_ID", "")
                subprocess.run(["scontrol", "requeue", job], check=True, timeout=60)
                log.warning("job %s requeued: it resumes from its checkpoint when it starts again", job)
            raise SlurmError(f"stopped by a signal (exit status {e.code}); a requeued job resumes") from None
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        atomic.write_json(Path(self.done), {"job": os.environ.get("SLURM_JOB_ID"), "time": time.time()})


# --- the study's side -------------------------------------------------------------------------------------


@dataclass
class Planned:
    """One job of the study: its name (``pretrain-<run>``, ``evaluate-<encoder>``), its work, and the
    name of the job it waits for (an evaluation waits for its encoder's pretraining)."""

    name: str
    work: Work
    after: str | None = None


def squeue_states(ids: list[str]) -> dict[str, str]:
    """SLURM's state of each job in ``ids`` it still knows (squeue, then ``scontrol show job`` for
    those that left the queue); a job it no longer knows is left out."""
    states: dict[str, str] = {}
    if not ids:
        return states
    done = subprocess.run(
        ["squeue", "-h", "-o", "%i|%T", "-j", ",".join(ids)], capture_output=True, text=True, timeout=60
    )
    for line in done.stdout.splitlines():
        job, _, state = line.partition("|")
        states[job.strip()] = state.strip()
    for job in (i for i in ids if i not in states):
        shown = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=60)
        found = re.search(r"JobState=(\w+)", shown.stdout)
        if found:
            states[job] = found.group(1)
    return states


class SlurmStudy:
    """A study's jobs on SLURM: submits what is not done or on its way, follows the states, cancels
    the study's jobs on a signal."""

    def __init__(self, cfg: DictConfig, root: Path, resume: str, say: Callable[[str], None] = print):
        import submitit  # the slurm launcher's dependency (pip install 'pretrainlab[slurm]')

        self.cfg, self.root, self.resume, self.say = cfg, root, resume, say
        self.dir = root / "slurm"
        self.record_path = self.dir / JOBS
        self.record: dict[str, dict] = json.loads(self.record_path.read_text()) if self.record_path.is_file() else {}
        self.poll_s = float(cfg.slurm.get("poll_s", 10))
        self.resources = {kind: resources(cfg, kind) for kind in ("pretrain", "evaluate")}
        self._submitit = submitit

    # jobs.json: name -> {"job": id, "kind", "spec", "log", "attempts": [ids]}
    def save(self) -> None:
        atomic.write_json(self.record_path, self.record)

    def done_marker(self, name: str) -> Path:
        return self.dir / f"{name}.done"

    def spec_path(self, name: str) -> Path:
        return self.dir / "specs" / f"{name}.yaml"

    def log_of(self, name: str) -> Path:
        job = self.record.get(name, {}).get("job")
        return self.dir / "logs" / f"{job}_0_log.out" if job else self.dir / "logs"

    def header(self, planned: list[Planned]) -> str:
        s = self.cfg.slurm
        lines = [f"SLURM jobs of the study {self.cfg.study} ({len(planned)}), each with:"]
        for kind, r in self.resources.items():
            lines.append(f"  {kind}: {' '.join(self.options(r))}")
        for line in s.get("setup") or []:
            lines.append(f"  setup: {line}")
        return "\n".join(lines)

    def extra_options(self) -> list[str]:
        """``slurm.sbatch``'s options, each as ``--key[=value]`` (a leading ``#SBATCH`` dropped)."""
        return [str(o).removeprefix("#SBATCH").strip() for o in self.cfg.slurm.get("sbatch") or []]

    def options(self, r: Resources) -> list[str]:
        """The sbatch options of a job with resources ``r``, as the study prints them before submitting."""
        s = self.cfg.slurm
        out = [f"--{k}={s[k]}" for k in ("partition", "account", "qos") if s.get(k)]
        return [*out, *r.sbatch(), f"--signal=USR2@{int(s.get('signal_s', 120))}", "--requeue", *self.extra_options()]

    def executor(self, kind: str, name: str, after: str | None):
        s, r = self.cfg.slurm, self.resources[kind]
        ex = self._submitit.SlurmExecutor(folder=str(self.dir / "logs"), max_num_timeout=1000)
        extra: dict[str, Any] = {"requeue": True}
        for option in self.extra_options():
            key, _, value = option.lstrip("-").partition("=")
            extra[key.replace("-", "_")] = value or True
        threads = f"export OMP_NUM_THREADS={r.cpus} MKL_NUM_THREADS={r.cpus}"
        ex.update_parameters(
            job_name=f"{self.cfg.study}:{name}",
            partition=s.get("partition"),
            account=s.get("account"),
            qos=s.get("qos"),
            time=r.time_min,
            cpus_per_task=r.cpus,
            gpus_per_node=r.gpus or None,
            mem=f"{int(r.mem_gb * 1024)}M" if r.mem_gb else None,
            signal_delay_s=int(s.get("signal_s", 120)),
            setup=[threads, *(s.get("setup") or [])],
            dependency=f"afterok:{after}" if after else None,
            additional_parameters=extra,
            stderr_to_stdout=True,
        )
        return ex

    def states(self) -> dict[str, str]:
        """Each recorded job's state: DONE (its work finished: its marker), SLURM's state, or LOST."""
        done = {name for name in self.record if self.done_marker(name).is_file()}
        slurm = squeue_states([str(r["job"]) for name, r in self.record.items() if name not in done])
        return {name: "DONE" if name in done else slurm.get(str(r["job"]), "LOST") for name, r in self.record.items()}

    def submit(self, planned: list[Planned]) -> list[str]:
        """Submit every job of ``planned`` that is neither done nor on its way; returns their names. A
        job waiting for one submitted again now is submitted again after it (its old dependency can
        never be met)."""
        states = self.states()
        submitted: list[str] = []
        self.dir.mkdir(parents=True, exist_ok=True)
        for p in planned:
            state = states.get(p.name)
            if state == "DONE":
                continue
            if state in ACTIVE:
                if p.after not in submitted:
                    continue
                subprocess.run(["scancel", str(self.record[p.name]["job"])], check=False, timeout=60)
                state = f"waiting for {p.after}'s earlier job"
            after = None
            if p.after is not None and states.get(p.after) != "DONE":
                after = str(self.record[p.after]["job"])
            spec = p.work.save(self.spec_path(p.name), self.resume)
            kind = p.work.kind  # pretrain or evaluate: the resources of its kind
            job = self.executor(kind, p.name, after).submit(JobWork(str(spec), str(self.done_marker(p.name))))
            attempts = [*self.record.get(p.name, {}).get("attempts", []), str(job.job_id)]
            self.record[p.name] = {"job": str(job.job_id), "kind": kind, "spec": str(spec), "attempts": attempts}
            self.save()  # at once: a study stopped now still knows the job
            states[p.name] = "PENDING"
            why = "" if state is None else f" (was {state.lower() if state.isupper() else state}: submitted again)"
            self.say(f"  {p.name}: job {job.job_id} submitted{' after job ' + after if after else ''}{why}")
            submitted.append(p.name)
        return submitted

    def cancel(self) -> list[str]:
        """Cancel this study's jobs that have not ended (their ids, no others)."""
        states = self.states()
        ids = [str(self.record[n]["job"]) for n, s in states.items() if s in ACTIVE]
        if ids:
            subprocess.run(["scancel", *ids], check=False, timeout=60)
        return ids

    def follow(self, planned: list[Planned]) -> None:
        """Print each job's state as it moves until every job is done; a job that failed (or was
        cancelled by someone else) stops the study: the jobs still pending are cancelled, its log named."""
        seen: dict[str, str] = {}
        names = [p.name for p in planned]
        while True:
            states = {n: s for n, s in self.states().items() if n in names}
            changed = {n: s for n, s in states.items() if seen.get(n) != s}
            for n, s in changed.items():
                self.say(f"  {n} (job {self.record[n]['job']}): {s.lower()}")
            seen.update(states)
            if all(s == "DONE" for s in states.values()):
                return
            lost = [n for n, s in states.items() if s in LOST and len(self.record[n]["attempts"]) <= RETRIES]
            if lost:  # the cluster's doing (a node failed, a preemption that cancels): submitted again
                self.submit(planned)
                continue
            failed = [n for n, s in states.items() if s != "DONE" and s not in ACTIVE]
            if failed:
                pending = [n for n, s in states.items() if s in ("PENDING", "REQUEUED")]
                ids = [str(self.record[n]["job"]) for n in pending]
                if ids:
                    subprocess.run(["scancel", *ids], check=False, timeout=60)
                n = failed[0]
                raise SlurmError(
                    f"{n} (job {self.record[n]['job']}) ended {states[n]} without finishing its work; its log: "
                    f"{self.log_of(n)}\n"
                    + (f"Cancelled the jobs still pending: {', '.join(pending)}.\n" if pending else "")
                    + f"Fix what the log names, then continue the study (failed jobs are submitted again) with:\n  {self.resume}"
                )
            time.sleep(self.poll_s)


def run_slurm(study: SlurmStudy, planned: list[Planned], detach: bool) -> bool:
    """Submit the study's jobs and, unless ``detach``, follow them until all are done (True) or the
    study stops; a signal cancels the study's jobs and says how to continue. With ``detach``: True when
    every job is done already (the report can be written), else False."""
    study.say(study.header(planned))
    try:
        study.submit(planned)
        if detach:
            states = study.states()
            if all(states.get(p.name) == "DONE" for p in planned):
                return True
            study.say(
                f"Detached: {sum(states.get(p.name) != 'DONE' for p in planned)} job(s) on their way "
                f"(squeue --name or {study.record_path}). Run the same command again to follow them, submit what "
                f"failed and write the report:\n  {study.resume}"
            )
            return False
        study.follow(planned)
        return True
    except (KeyboardInterrupt, SystemExit):
        cancelled = study.cancel()
        study.say(
            f"Stopped: cancelled this study's {len(cancelled)} job(s) still on their way ({' '.join(cancelled) or '-'}); "
            f"their runs saved what they had. Continue the study with:\n  {study.resume}"
        )
        raise


__all__ = ["JobWork", "Planned", "Resources", "SlurmError", "SlurmStudy", "check_cluster", "resources", "run_slurm"]

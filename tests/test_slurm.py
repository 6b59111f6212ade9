"""Studies and multiruns on a real SLURM cluster (a single-node one on this machine: `.ci/slurm-cluster
start`, which `.ci/run` starts before the tests). Without a cluster these tests are skipped, naming why;
in CI (PRETRAINLAB_REQUIRE_SLURM=1) a missing cluster fails them instead."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pretrainlab.data.hashing import file_digest
from tests.conftest import SMALL, compose_config, run_command, start_command

ROOT = Path(__file__).resolve().parents[1]


def _cluster() -> str | None:
    """Why no SLURM cluster takes jobs here, or None when one does."""
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired) as e:
        return f"no SLURM here ({e.__class__.__name__}); start one with: sudo bash .ci/slurm-cluster start"
    states = done.stdout.split()  # a node that answers: idle, mixed, allocated, completing (not down, drained, "*")
    if done.returncode != 0 or not any(s.rstrip("~#%$@^-!") in ("idle", "mix", "alloc", "comp") for s in states):
        return f"no SLURM node takes jobs (sinfo: {done.stdout.strip() or done.stderr.strip()}); start one with: sudo bash .ci/slurm-cluster start"
    return None


@pytest.fixture(autouse=True)
def slurm_cluster():
    why = _cluster()
    if why is not None:
        if os.environ.get("PRETRAINLAB_REQUIRE_SLURM") == "1":
            pytest.fail(f"PRETRAINLAB_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)


pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def quoted(xs: list[str]) -> str:
    return "[" + ",".join(f'"{x}"' for x in xs) + "]"


# every job on one CPU, as the suite's processes run (one thread per xdist worker): the same arithmetic
JOB = ["slurm.partition=debug", "slurm.pretrain.gpus=0", "slurm.pretrain.cpus=1", "slurm.pretrain.mem_gb=null",
       "slurm.pretrain.time_min=30", "slurm.poll_s=1"]  # fmt: skip


def study(tmp_path: Path, name: str, steps: int = 30, *extra: str, seeds: str = "[0,1]") -> list[str]:
    glue = ["glue.source=synthetic", "glue.synthetic.scale=0.05", "task_overrides.epochs=1", "logger=csv",
            "trainer.enable_progress_bar=false", "task_overrides.max_seq_len=64"]  # fmt: skip
    pretrain = [*SMALL, "data.num_documents=200", f"max_steps={steps}", "checkpoint_every=10", f"val_every={steps}"]
    return [
        f"study={name}",
        f"output_root={tmp_path}",
        "objectives=[roberta,bert]",
        f"seeds={seeds}",
        f"pretrain={quoted(pretrain)}",
        "suite.glue_tasks=[rte]",
        "suite.seeds=[0]",
        f"suite.overrides={quoted(glue)}",
        "intrinsic=false",
        *extra,
    ]


def ablate(*overrides: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return run_command(
        [sys.executable, str(ROOT / "experiments" / "ablate.py"), *overrides],
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    )


def jobs_of(root: Path) -> dict:
    return json.loads((root / "slurm" / "jobs.json").read_text())


def job_state(job: str) -> str:
    shown = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=60).stdout
    return shown.split("JobState=")[1].split()[0] if "JobState=" in shown else "UNKNOWN"


def ended(jobs: dict[str, str], timeout: float = 120) -> dict[str, str]:
    """Each job's state once none is still on its way out: the study is done when every job's work is (its
    marker written), which can be a moment before SLURM has the job COMPLETED (the process exiting)."""
    from pretrainlab.studies.slurm import ACTIVE

    deadline = time.time() + timeout
    while True:
        states = {name: job_state(job) for name, job in jobs.items()}
        if not set(states.values()) & ACTIVE or time.time() > deadline:
            return states
        time.sleep(0.5)


def digests(root: Path) -> dict[str, str]:
    return {
        run.name: file_digest(run / "encoder" / "encoder.safetensors")
        for run in sorted((root / "pretrain").iterdir())
        if (run / "encoder" / "encoder.safetensors").is_file()
    }


def test_a_study_through_slurm_reports_what_the_local_launcher_reports(tmp_path):
    """Two objectives: submitted detached (every pretraining run a job, every encoder's suite a job after
    it), continued by the same command, which follows the jobs to the end and writes the report; every
    encoder and every result equals the local launcher's, and no job was submitted twice. (One pretraining
    seed: each job is a process importing torch and Lightning; a second seed doubles them and checks
    nothing more: every run is its own job whatever its seed.)"""
    local = ablate(*study(tmp_path / "local", "s", seeds="[0]"))
    assert local.returncode == 0, local.stderr[-3000:]
    on_slurm = study(tmp_path / "slurm", "s", 30, "launcher=slurm", *JOB, seeds="[0]")
    first = ablate(*on_slurm, "detach=true")
    assert first.returncode == 0, first.stderr[-3000:]
    said = first.stdout + first.stderr
    assert "Detached:" in said and "Run the same command again" in said, said[-3000:]
    assert "--cpus-per-task=1" in said and "--signal=USR2@120" in said  # the resources, printed before submission
    root = tmp_path / "slurm" / "s"
    submitted = jobs_of(root)
    names = {f"{kind}-{o}-s0" for kind in ("pretrain", "evaluate") for o in ("roberta", "bert")}
    assert set(submitted) == names | {"evaluate-roberta-s0-scratch"}  # scratch: the first run's architecture
    # a pretraining job cancelled from outside: the rerun submits it again, and its evaluation after the new job
    subprocess.run(["scancel", submitted["pretrain-bert-s0"]["job"]], check=True, timeout=60)
    again = ablate(*on_slurm)
    assert again.returncode == 0, again.stderr[-3000:]
    after = jobs_of(root)
    again_submitted = {"pretrain-bert-s0", "evaluate-bert-s0"}
    assert all(len(after[n]["attempts"]) == 2 for n in again_submitted), after
    assert all(after[n]["attempts"] == submitted[n]["attempts"] for n in set(submitted) - again_submitted)
    states = ended({n: after[n]["job"] for n in after})
    assert set(states.values()) == {"COMPLETED"}, states
    assert digests(root) == digests(tmp_path / "local" / "s") and len(digests(root)) == 2
    ours = json.loads((root / "report" / "comparison.json").read_text())
    theirs = json.loads((tmp_path / "local" / "s" / "report" / "comparison.json").read_text())
    assert ours["labels"] == theirs["labels"] == ["bert", "roberta", "scratch"]
    assert ours["cells"] == theirs["cells"] and ours["differences"] == theirs["differences"]


def test_a_pretraining_job_warned_of_its_time_limit_or_requeued_resumes_to_the_uninterrupted_encoder(tmp_path):
    """SIGUSR2 (what SLURM sends slurm.signal_s before the time limit) while the run trains: it saves
    at the end of its step and requeues its job; then scontrol requeue (a preemption) in the restarted
    job: it saves again and SLURM requeues it. Each time the job resumes from its checkpoint, and the
    encoder is bit for bit the one a run without interruption makes; the study never submitted it again."""
    one = ["objectives=[roberta]", "seeds=[0]", "scratch=false", "evals=[]"]
    local = ablate(*study(tmp_path / "local", "r", 300), *one)
    assert local.returncode == 0, local.stderr[-3000:]
    on_slurm = [*study(tmp_path / "slurm", "r", 300), *one, "launcher=slurm", *JOB]
    first = ablate(*on_slurm, "detach=true")
    assert first.returncode == 0, first.stderr[-3000:]
    root = tmp_path / "slurm" / "r"
    job = jobs_of(root)["pretrain-roberta-s0"]["job"]
    checkpoint = root / "pretrain" / "roberta-s0" / "checkpoints" / "last.ckpt"

    def saved_after(moment: float) -> None:  # training, and saved since (checkpoint_every=10)
        deadline = time.time() + 300
        while not (checkpoint.is_file() and checkpoint.stat().st_mtime > moment):
            state = job_state(job)
            assert time.time() < deadline and state in (
                "PENDING",
                "CONFIGURING",
                "RUNNING",
                "COMPLETING",
                "REQUEUED",
            ), state
            time.sleep(0.2)

    def restarts() -> int:
        shown = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
        return int(shown.split("Restarts=")[1].split()[0])

    def release() -> None:
        """A requeued job is held by SLURM for about two minutes before it may start again (then waits
        for the scheduler's next pass): the test lets it start sooner, which changes nothing it checks. Not in
        the second of its requeue: slurmd refuses a job whose credential was made in the second its old one
        was revoked ("Job credential revoked", whole seconds), and the job fails instead of starting."""
        deadline = time.time() + 120
        while job_state(job) != "PENDING":
            assert time.time() < deadline, job_state(job)
            time.sleep(0.2)
        time.sleep(2.0)
        subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=False, timeout=60)

    saved_after(0)
    subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=60)
    deadline = time.time() + 120
    while restarts() < 1:  # the job saved and requeued itself
        assert time.time() < deadline, job_state(job)
        time.sleep(0.2)
    release()
    saved_after(time.time())  # the restarted job resumed and saved
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=60)
    release()
    again = ablate(*on_slurm)
    assert again.returncode == 0, again.stderr[-3000:]
    assert jobs_of(root)["pretrain-roberta-s0"]["attempts"] == [job]  # requeued, never submitted again
    assert restarts() == 2
    log = (root / "slurm" / "logs" / f"{job}_0_log.out").read_text()
    assert f"Restored all states from the checkpoint at {checkpoint}" in log, log[-3000:]
    assert digests(root) == digests(tmp_path / "local" / "r") and len(digests(root)) == 1


def test_a_failed_job_stops_the_study_naming_its_log(tmp_path):
    """A job that fails (here its setup line, as a `module load` that fails would) ends the study with
    its log and the command that continues it; the jobs waiting for it are cancelled."""
    overrides = [*study(tmp_path, "f"), "objectives=[roberta]", "seeds=[0]", "launcher=slurm", *JOB]
    done = ablate(*overrides, 'slurm.setup=["echo no such module: cuda/99 >&2","exit 3"]')
    assert done.returncode != 0
    said = done.stderr
    assert "pretrain-roberta-s0 (job" in said and "ended FAILED" in said, said[-3000:]
    log = said.split("its log: ")[1].split()[0]
    assert "no such module: cuda/99" in Path(log).read_text()
    assert "continue the study" in said
    jobs = jobs_of(tmp_path / "f")
    assert job_state(jobs["evaluate-roberta-s0"]["job"]) == "CANCELLED"


def test_ctrl_c_cancels_the_studys_jobs_and_no_others(tmp_path):
    other = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp_path}/other-%j.out", "--wrap", "sleep 600"],
        capture_output=True,
        text=True,
        check=True,
    )
    other_job = other.stdout.strip().split(";")[0]
    try:
        overrides = [*study(tmp_path, "c", 3000), "objectives=[roberta]", "seeds=[0,1]", "launcher=slurm", *JOB]
        # Ctrl-C as from a terminal (a command's SIGINT raises KeyboardInterrupt, whatever the worker ignores)
        proc = start_command(
            [sys.executable, str(ROOT / "experiments" / "ablate.py"), *overrides], stderr=subprocess.STDOUT
        )
        record = tmp_path / "c" / "slurm" / "jobs.json"
        deadline = time.time() + 300
        while not (record.is_file() and len(json.loads(record.read_text())) == 5):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=300)[0]
        assert proc.returncode != 0
        assert "cancelled this study's 5 job(s)" in out and "Continue the study with" in out, out[-3000:]
        for job in json.loads(record.read_text()).values():
            assert job_state(job["job"]) == "CANCELLED"
        assert job_state(other_job) in ("RUNNING", "PENDING")
    finally:
        subprocess.run(["scancel", other_job], timeout=60)


def test_a_study_refuses_slurm_settings_that_cannot_run_before_submitting(tmp_path):
    from pretrainlab.config import ConfigError
    from pretrainlab.studies.ablation import check_study

    for bad, says in (
        ("slurm.pretrain.cpus=0", "slurm.pretrain.cpus=0: give a whole number of at least 1"),
        ("slurm.evaluate.time_min=1", "slurm.evaluate.time_min=1 leaves no time before the warning"),
        ("launcher=kubernetes", "launcher=kubernetes: choose one of local, slurm"),
    ):
        with pytest.raises(ConfigError, match=says):
            check_study(compose_config("ablate", *study(tmp_path, "bad"), "launcher=slurm", *JOB, bad))
    assert not (tmp_path / "bad" / "slurm").exists()


def test_a_hydra_multirun_runs_its_jobs_through_slurm(tmp_path):
    """train.py -m with hydra/launcher=submitit_slurm: one SLURM job per run, each in its own directory
    with the checks and the export of a single run."""
    overrides = [
        "-m",
        "objective=roberta,bert",
        "seed=0",
        *SMALL,
        "data.num_documents=200",
        "max_steps=5",
        "val_every=5",
        "hydra/launcher=submitit_slurm",
        "hydra.launcher.partition=debug",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.timeout_min=30",
        f"hydra.sweep.dir={tmp_path}/multirun",
    ]
    done = run_command([sys.executable, str(ROOT / "train.py"), *overrides], timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = sorted((tmp_path / "multirun").glob("*/encoder/config.json"))
    assert len(runs) == 2
    logs = list((tmp_path / "multirun" / ".submitit").glob("*/*_log.out"))
    jobs = {p.parent.name for p in logs}  # <array id>_<task>: one SLURM job per run
    assert len(jobs) == 2
    deadline = time.time() + 60  # Hydra returns once the results are written, maybe before SLURM's COMPLETING ends
    while not all(job_state(j) == "COMPLETED" for j in jobs):
        assert time.time() < deadline, {j: job_state(j) for j in jobs}
        time.sleep(1)

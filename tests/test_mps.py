"""CUDA's MPS for processes sharing a GPU (runtime.mps): a daemon of the block's own is started where the
device has it and stopped whatever happens; where it cannot run, the block goes on without it and
says why, and ``mps=true`` is refused before any work. The NVIDIA binaries are stand-ins here: small
scripts on PATH that record how they were called."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pretrainlab.config import ConfigError
from pretrainlab.runtime import mps

CONTROL = """#!/bin/sh
# records its environment's MPS folders and what it was asked
if [ "$1" = "-d" ]; then
  echo "start pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> "{calls}"
  [ -n "{fail}" ] && {{ echo "{fail}" >&2; exit 1; }}
  echo "daemon started" > "$CUDA_MPS_LOG_DIRECTORY/control.log"
  exit 0
fi
read line; echo "asked $line pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "{calls}"
"""
SMI = '#!/bin/sh\necho "GPU 0: Stand-in GPU (UUID: GPU-0)"\n'


@pytest.fixture
def nvidia(tmp_path, monkeypatch):
    """Stand-ins for nvidia-smi and nvidia-cuda-mps-control on PATH; returns (calls file, make(fail=...))."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"

    def make(fail: str = "", control: bool = True, smi: bool = True) -> None:
        for name, text, wanted in (
            ("nvidia-smi", SMI, smi),
            (mps.CONTROL, CONTROL.format(calls=calls, fail=fail), control),
        ):
            path = bin_dir / name
            path.unlink(missing_ok=True)
            if wanted:
                path.write_text(text)
                path.chmod(0o755)

    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.delenv("CUDA_MPS_LOG_DIRECTORY", raising=False)
    make()
    return calls, make


def _calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def test_a_daemon_of_its_own_is_started_for_the_block_and_stopped_even_when_the_block_fails(nvidia, tmp_path):
    calls, _ = nvidia
    with pytest.raises(RuntimeError, match="a run failed"):
        with mps.mps(tmp_path / "mine") as daemon:
            assert daemon.running and daemon.status.startswith("MPS: running")
            assert daemon.env == {
                "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mine" / "pipe"),
                "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mine" / "log"),
            }
            assert _calls(calls) == [f"start pipe={tmp_path}/mine/pipe log={tmp_path}/mine/log"]
            raise RuntimeError("a run failed")
    assert _calls(calls)[-1] == f"asked quit pipe={tmp_path}/mine/pipe"


@pytest.mark.parametrize(
    "setup, why",
    [
        ({"smi": False}, "no NVIDIA driver here"),
        ({"control": False}, "nvidia-cuda-mps-control not found on PATH"),
        ({"fail": "An MPS daemon is already running"}, "exited with 1: An MPS daemon is already running"),
    ],
)
def test_where_mps_cannot_run_the_block_goes_on_without_it_and_says_why(nvidia, tmp_path, setup, why):
    calls, make = nvidia
    make(**setup)
    with mps.mps(tmp_path / "d") as daemon:
        assert not daemon.running and daemon.env == {}
        assert why in daemon.reason and daemon.status == f"MPS: not used: {daemon.reason}"
    assert not any(line.startswith("asked") for line in _calls(calls))  # nothing to stop
    with mps.shared("auto", 4, True, tmp_path / "logs") as daemon:
        assert not daemon.running and why in daemon.reason
    with pytest.raises(ConfigError, match=f"mps=true, but .*{why}.* Set mps=auto"):
        with mps.shared(True, 4, True, tmp_path / "logs"):
            pass


def test_a_studys_processes_are_clients_of_the_daemon_within_the_block(nvidia, tmp_path):
    """``shared``: every process started in the block finds the daemon's folders in its environment;
    after it, this process's environment is as it was, the daemon stopped and its log kept beside the
    study's; a block inside (a slot around its study) uses the same daemon."""
    calls, _ = nvidia
    logs = tmp_path / "study" / "logs"
    with mps.shared("auto", 3, True, logs) as daemon:
        assert daemon.running
        pipe = daemon.env["CUDA_MPS_PIPE_DIRECTORY"]
        assert len(pipe) < 60  # a socket's path has a length limit: the pipe folder is a short temporary one
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ['CUDA_MPS_PIPE_DIRECTORY'])"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert child.stdout.strip() == pipe
        with mps.shared("auto", 3, True, tmp_path / "inner") as inner:
            assert inner.running and inner.env["CUDA_MPS_PIPE_DIRECTORY"] == pipe
        assert [line.split()[0] for line in _calls(calls)] == ["start"]  # the inner block started none
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert _calls(calls)[-1] == f"asked quit pipe={pipe}"
    assert (logs / "mps" / "control.log").read_text().strip() == "daemon started"
    assert not Path(pipe).exists()


def test_no_daemon_for_one_process_or_runs_off_the_gpu_and_true_is_refused_there_before_any_work(nvidia, tmp_path):
    calls, _ = nvidia
    for jobs, cuda in ((1, True), (4, False)):
        with mps.shared("auto", jobs, cuda, tmp_path) as daemon:
            assert not daemon.running
    with mps.shared(False, 4, True, tmp_path) as daemon:
        assert not daemon.running and daemon.reason == "mps=false"
    assert _calls(calls) == []
    with pytest.raises(ConfigError, match="mps=true with jobs=1"):
        mps.check(True, 1, True)
    with pytest.raises(ConfigError, match="not on a CUDA GPU"):
        mps.check(True, 4, False)
    with pytest.raises(ConfigError, match="mps='yes'"):
        mps.check("yes", 4, True)


def test_a_study_refuses_mps_true_where_it_cannot_work_before_any_run(tmp_path):
    """A study on the CPU with ``mps=true``: refused by the study's checks, with the setting and the fix,
    before anything is written."""
    from pretrainlab.runtime.hydra import compose
    from pretrainlab.studies.ablation import check_study

    cfg, _ = compose(
        "ablate_quick",
        [f"output_root={tmp_path}", "objectives=[roberta,clm]", "jobs=2", "mps=true", "evals=[]"],
    )
    with pytest.raises(ConfigError, match="mps=true, but the study's runs are not on a CUDA GPU"):
        check_study(cfg)
    assert not any((tmp_path / cfg.study).rglob("*.ckpt"))

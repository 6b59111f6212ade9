"""A study's processes forked from a server that imported what they need (studies.forkserver): each is
the ``python -m <module> <args>`` it stands for, in the study's environment and working directory, with its
output in its log, in a session of its own, and its exit status as a process's."""

import os
import signal
import sys
import textwrap
import time

import pytest

from pretrainlab.studies.forkserver import ForkServer, ForkServerError

CHILD = textwrap.dedent(
    """
    import atexit, json, os, sys, threading, time

    def at_exit():
        with open("atexit.txt", "w") as f:
            f.write("ran")

    atexit.register(at_exit)
    print("out", flush=True)
    print("err", file=sys.stderr, flush=True)
    late = threading.Thread(target=lambda: (time.sleep(0.3), open("thread.txt", "w").write("joined")))
    late.start()
    info = {"argv": sys.argv, "name": __name__, "cwd": os.getcwd(), "env": os.environ.get("STUDY_SETTING"),
            "sid": os.getsid(0) == os.getpid(), "threads": None}
    if "torch" in sys.modules:
        info["threads"] = sys.modules["torch"].get_num_threads()
    with open("info.json", "w") as f:
        json.dump(info, f)
    what = sys.argv[1]
    if what == "exit":
        sys.exit(int(sys.argv[2]))
    if what == "raise":
        raise ValueError("a bad setting")
    if what == "sleep":
        time.sleep(60)
    """
)


@pytest.fixture
def work(tmp_path):
    (tmp_path / "child_module.py").write_text(CHILD)
    return tmp_path


def test_a_forked_process_is_its_command_in_the_studys_environment_and_folder(work):
    import json

    env = {**os.environ, "STUDY_SETTING": "42", "OMP_NUM_THREADS": "1"}
    with ForkServer(preload=("torch",)) as server:
        proc = server.popen(["-m", "child_module", "ok", "x"], work / "a.log", env, work)
        assert proc.wait(timeout=60) == 0
    info = json.loads((work / "info.json").read_text())
    assert info["argv"][1:] == ["ok", "x"] and info["argv"][0].endswith("child_module.py")
    assert info["name"] == "__main__" and info["cwd"] == str(work) and info["env"] == "42"
    assert info["sid"]  # a session of its own: a terminal's Ctrl-C reaches it only through the study
    assert info["threads"] == 1  # OMP_NUM_THREADS, as a fresh interpreter reads it
    assert (work / "a.log").read_text().split() == ["out", "err"]
    # it exited as an interpreter exits: its threads joined, then its atexit functions
    assert (work / "thread.txt").read_text() == "joined" and (work / "atexit.txt").read_text() == "ran"


def test_a_module_the_server_imported_runs_as_main_as_under_python_m(work, monkeypatch):
    """The work's module is among what the server imports (studies.parallel is): it runs as ``__main__``
    without runpy's warning that it was imported before (it once opened every study process's log)."""
    (work / "quiet_module.py").write_text("print('ran as', __name__)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(work), *sys.path]))
    with ForkServer(preload=("quiet_module",)) as server:
        proc = server.popen(["-m", "quiet_module"], work / "q.log", dict(os.environ), work)
        assert proc.wait(timeout=60) == 0
    assert (work / "q.log").read_text() == "ran as __main__\n"


def test_exit_statuses_are_a_processes_statuses(work):
    env = dict(os.environ)
    with ForkServer(preload=()) as server:
        exits = server.popen(["-m", "child_module", "exit", "3"], work / "exit.log", env, work)
        raises = server.popen(["-m", "child_module", "raise"], work / "raise.log", env, work)
        sleeps = server.popen(["-m", "child_module", "sleep"], work / "sleep.log", env, work)
        assert exits.wait(timeout=60) == 3
        assert raises.wait(timeout=60) == 1
        time.sleep(0.5)
        assert sleeps.poll() is None
        sleeps.send_signal(signal.SIGTERM)
        assert sleeps.wait(timeout=60) == -signal.SIGTERM
    log = (work / "raise.log").read_text()
    assert "Traceback" in log and "ValueError: a bad setting" in log


def test_a_script_runs_as_python_script_would_with_its_output_and_errors_apart(work):
    """``python <script.py> <args>``: the script runs as ``__main__`` with its folder first on the path,
    its standard output and error in files of their own when asked."""
    import json

    scripts = work / "scripts"
    scripts.mkdir()
    (scripts / "helper.py").write_text("VALUE = 7\n")
    (scripts / "tool.py").write_text(
        "import json, sys\nimport helper\n"
        "print(json.dumps({'argv': sys.argv, 'name': __name__, 'value': helper.VALUE}))\n"
        "print('a warning', file=sys.stderr)\nsys.exit(4)\n"
    )
    with ForkServer(preload=()) as server:
        proc = server.popen(
            [str(scripts / "tool.py"), "a", "b"], work / "out.txt", dict(os.environ), work, stderr=work / "err.txt"
        )
        assert proc.wait(timeout=60) == 4
    info = json.loads((work / "out.txt").read_text())
    assert info == {"argv": [str(scripts / "tool.py"), "a", "b"], "name": "__main__", "value": 7}
    assert (work / "err.txt").read_text() == "a warning\n"
    with ForkServer(preload=()) as server, pytest.raises(ValueError, match="starts `-m <module> <args>`"):
        server.popen(["-c", "pass"], work / "c.log", dict(os.environ), work)


def test_what_the_servers_imports_made_outlives_each_forked_process(work, monkeypatch):
    """A module the server imported made a temporary folder (as W&B's media folder is made at import): each
    forked process has its own, as a fresh interpreter would, removed when it ends; one that ends does not
    remove the folder from under the next one (W&B's tables failed in every forked process after the first)."""
    (work / "made_at_import.py").write_text("import tempfile\nFOLDER = tempfile.TemporaryDirectory('made-at-import')\n")
    (work / "uses_it.py").write_text(
        "import atexit, os, made_at_import\n"
        "open(os.path.join(made_at_import.FOLDER.name, 'staged'), 'w').close()\n"
        "print(made_at_import.FOLDER.name)\n"
        "atexit.register(made_at_import.FOLDER.cleanup)\n"  # as W&B removes its media folder when a run ends
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(work), *sys.path]))
    with ForkServer(preload=("made_at_import",)) as server:
        for i in range(2):
            proc = server.popen(["-m", "uses_it"], work / f"{i}.log", dict(os.environ), work)
            assert proc.wait(timeout=60) == 0, (work / f"{i}.log").read_text()
    folders = [(work / f"{i}.log").read_text().strip() for i in range(2)]
    assert folders[0] != folders[1] and not any(os.path.exists(f) for f in folders)  # each its own, removed


def test_a_process_keeps_one_server_for_all_its_phases_and_replaces_one_that_ended(work):
    """``shared()``: the same server for every later use in this process (a study's pretraining, then its
    evaluations), a new one when it has ended, and none inherited by a process forked from this one."""
    from pretrainlab.studies import forkserver

    (work / "inherits.py").write_text("print('ran')\n")
    preload = ("pretrainlab.studies.forkserver",)  # a light server of its own, not the tests' commands' one
    server = forkserver.shared(preload)
    try:
        first = server.popen(["-m", "inherits"], work / "1.log", dict(os.environ), work)
        assert first.wait(timeout=60) == 0, (work / "1.log").read_text()
        assert forkserver.shared(preload) is server
        pid = server._proc.pid
        second = forkserver.shared(preload).popen(["-m", "inherits"], work / "2.log", dict(os.environ), work)
        assert second.wait(timeout=60) == 0 and server._proc.pid == pid  # the same interpreter forked both
        child = os.fork()
        if child == 0:  # a process forked from this one: no server of its parent's
            os._exit(len(forkserver._SHARED))
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0 and forkserver._SHARED
        server._proc.kill()
        server._proc.wait()
        again = forkserver.shared(preload)
        assert again is not server
        server.close()  # the ended one's socket folder goes too
        third = again.popen(["-m", "inherits"], work / "3.log", dict(os.environ), work)
        assert third.wait(timeout=60) == 0
    finally:
        forkserver._SHARED.pop(preload).close()


NESTED_STUDY = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from pretrainlab.studies import forkserver

    server = forkserver.shared(("pretrainlab.studies.forkserver",))
    run = server.popen(["-m", "nested_run"], "run.log", dict(os.environ), os.getcwd())
    code = run.wait(timeout=60)
    more = forkserver.ForkServer(("pretrainlab.studies.forkserver", "json"))  # what its origin did not import
    more.start()
    fresh = "from pretrainlab.studies import forkserver; print(forkserver._ORIGIN)"
    afresh = subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True).stdout.strip()
    info = {"code": code, "own": server._proc is not None, "more_own": more._proc is not None, "afresh": afresh}
    more.close()
    server.close()
    json.dump(info, open("study.json", "w"))
    """
)  # its paths are relative to its own folder, which is not its server's


def test_a_forked_process_forks_its_processes_from_the_server_it_came_from(work):
    """A study that was itself forked (the tests' commands are) starts no server of its own where its server
    imported what it needs: its processes are forked by that one, which tells it (not its other clients) how
    they ended. Asking for more imports starts a server of its own, and a process it starts afresh (a DDP
    rank, a SLURM job) knows of none."""
    import json

    (work / "nested_study.py").write_text(NESTED_STUDY)
    (work / "nested_run.py").write_text(
        "import json, os\njson.dump({'ppid': os.getppid()}, open('run.json', 'w'))\nraise SystemExit(3)\n"
    )
    with ForkServer(preload=("pretrainlab.studies.forkserver",)) as server:
        study = server.popen(["-m", "nested_study"], work / "study.log", dict(os.environ), work)
        assert study.wait(timeout=120) == 0, (work / "study.log").read_text()[-3000:]
        assert server._proc is not None
        origin = server._proc.pid
    info = json.loads((work / "study.json").read_text())
    assert info == {"code": 3, "own": False, "more_own": True, "afresh": "None"}, info
    assert json.loads((work / "run.json").read_text())["ppid"] == origin
    assert (work / "run.log").exists()


def test_a_server_that_cannot_start_is_named(work, monkeypatch):
    (work / "broken_module.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(work), *sys.path]))
    server = ForkServer(preload=("broken_module",))
    with pytest.raises(ForkServerError, match="fork server .* ended with exit status 1"):
        server.popen(["-m", "child_module", "ok"], work / "a.log", dict(os.environ), work)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")
def test_a_process_forked_from_the_studys_server_trains_on_the_gpu(work):
    """The server imports what a study's process does (torch, Lightning, the package) and never initializes
    CUDA (Lightning's checks are NVML-based): a process forked from it computes on the GPU."""
    (work / "cuda_module.py").write_text(
        "import torch\nx = torch.ones(64, 64, device='cuda')\nassert float((x @ x).sum()) == 64.0 ** 3\n"
        "print(torch.cuda._is_in_bad_fork())\n"
    )
    with ForkServer() as server:
        proc = server.popen(["-m", "cuda_module"], work / "cuda.log", dict(os.environ), work)
        assert proc.wait(timeout=300) == 0, (work / "cuda.log").read_text()[-3000:]
    assert (work / "cuda.log").read_text().split()[-1] == "False"


def test_a_server_still_importing_is_not_waited_for(work, monkeypatch):
    """A study stopped (its time limit, a signal) before its first process started stops at once, not
    after the server's imports (ten seconds and more on a loaded machine)."""
    (work / "slow_module.py").write_text("import time\ntime.sleep(30)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(work), *sys.path]))
    server = ForkServer(preload=("slow_module",))
    started = time.monotonic()
    server.start()
    server.close()
    assert time.monotonic() - started < 10


def test_the_startup_bench_times_both_ways_and_writes_its_report(tmp_path, capsys):
    """experiments/bench_startup.py: the same processes started fresh and forked, each way's wall-clock and
    CPU and their ratio, as a report docs can publish (here with a light module, its time is not the point)."""
    import json

    from pretrainlab.tools.bench_startup import main

    assert main(["--processes", "2", "--module", "this", "--preload", "json", "--report", str(tmp_path / "r")]) == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [row[0] for row in report["rows"]] == ["fresh", "forked (server included)"]
    assert all(row[1] == 2 and float(row[3]) > 0 for row in report["rows"])
    assert "Fresh / forked: CPU " in report["about"] and "Fresh / forked" in capsys.readouterr().out


def test_the_startup_bench_keeps_the_time_of_a_light_process_in_its_table():
    """A light process (``--module this``) takes hundredths of a second of CPU on a fast machine: its row says so
    instead of rounding it to 0.0 (which failed the bench's own test on such a machine)."""
    from pretrainlab.tools.bench_startup import _row

    assert _row("fresh", 2, 0.043, 0.031) == ["fresh", 2, "0.043", "0.031", "0.015"]
    assert _row("fresh", 4, 61.27, 18.06) == ["fresh", 4, "61.3", "18.1", "4.5"]


def test_the_startup_bench_with_wandb_times_wandb_after_torch_and_first(tmp_path, monkeypatch, capsys):
    """--wandb: the probes start an offline W&B run; fresh processes are started twice (W&B imported after
    torch, then first) and forked once, and the report says the ratio of the two fresh ways."""
    import json

    from pretrainlab.tools import bench_startup

    started = []

    def fresh(command, processes, logs, env):
        started.append(("fresh", command[-1], env["WANDB_DIR"] == str(logs)))
        return 1.0, 12.0 if command[-1] == "after" else 8.0

    def forked(command, processes, logs, preload, env):
        started.append(("forked", command[-1], preload[0] == "wandb"))
        return 0.5, 4.0

    monkeypatch.setattr(bench_startup, "fresh", fresh)
    monkeypatch.setattr(bench_startup, "forked", forked)
    assert bench_startup.main(["--processes", "2", "--wandb", "--report", str(tmp_path / "r")]) == 0
    assert started == [("fresh", "after", True), ("fresh", "first", True), ("forked", "first", True)]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [row[0] for row in report["rows"]] == [
        "fresh, W&B imported after torch",
        "fresh, W&B imported first",
        "forked (server included)",
    ]
    assert [row[4] for row in report["rows"]] == ["6.0", "4.0", "2.0"]
    assert "took 6.0 s of CPU each, 1.50x the 4.0 s with W&B first" in report["about"]
    with pytest.raises(SystemExit):
        bench_startup.main(["--wandb", "--module", "this"])
    assert "--wandb times this tool's own probe" in capsys.readouterr().err
    # the probe itself: the study's imports, then an offline W&B run, written where it is told (also in a
    # process whose W&B has started runs elsewhere before: it reads its environment once)
    import wandb

    wandb.init(project="elsewhere", mode="offline", dir=str(tmp_path / "before"))
    wandb.finish()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "probe"))
    (tmp_path / "probe").mkdir()
    probed = []
    monkeypatch.setattr(bench_startup, "_wandb_run", lambda real=bench_startup._wandb_run: probed.append(real()))
    assert bench_startup.main(["--probe", "--wandb-order", "after"]) == 0
    assert len(probed) == 1 and probed[0].is_relative_to(tmp_path / "probe" / "wandb") and probed[0].is_dir()

"""Shared fixtures. Tests run offline, on data the project generates, with caches in tmp dirs."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Under pytest-xdist (make test: one worker per core), each worker and the processes its tests start
# get an equal share of the cores: workers whose threads outnumber the cores spin against each other
# (two workers of two threads on two cores ran the learning tests several times slower than one).
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = _threads
    import torch

    torch.set_num_threads(int(_threads))


def pytest_runtest_logreport(report):
    """With PRETRAINLAB_TEST_FAILURES=<file>, every failure's traceback is appended to that file as it
    happens (from the process that ran the test, with or without pytest-xdist), so that a suite cut
    off by a time limit still says why its failures failed."""
    path = os.environ.get("PRETRAINLAB_TEST_FAILURES")
    if path and report.failed and not getattr(report, "node", None):  # node: a report relayed to xdist's controller
        with open(path, "a") as f:
            f.write(f"=== {report.nodeid} ({report.when}, {report.duration:.1f}s)\n{report.longreprtext}\n\n")
    if os.environ.get("PRETRAINLAB_TEST_DURATIONS") and not getattr(report, "node", None):
        _record({"test": report.nodeid, "when": report.when, "seconds": report.duration, "outcome": report.outcome,
                 **({k: round(v, 2) for k, v in _PARTS.items()} if report.when == "call" else {})})  # fmt: skip


# --- where the suite's time goes (PRETRAINLAB_TEST_DURATIONS=<file>: experiments/test_durations.py reads it) ---
_PARTS: dict[str, float] = {}

_PROCESS_RECORD = str(ROOT / "tests" / "process_record")
if os.environ.get("PRETRAINLAB_TEST_DURATIONS") and _PROCESS_RECORD not in os.environ.get("PYTHONPATH", "").split(
    os.pathsep
):  # the processes tests start record themselves (its docstring); xdist's workers inherit it
    os.environ["PYTHONPATH"] = os.pathsep.join([_PROCESS_RECORD, *filter(None, [os.environ.get("PYTHONPATH")])])


def _record(entry: dict) -> None:
    import json

    with open(os.environ["PRETRAINLAB_TEST_DURATIONS"], "a") as f:
        f.write(json.dumps(entry) + "\n")


if os.environ.get("PRETRAINLAB_TEST_DURATIONS"):
    import time as _time

    import lightning as _lightning

    _fit = _lightning.Trainer.fit

    def _timed(part: str, function):
        import functools

        @functools.wraps(function)  # its signature stays readable (tests/test_layout.py reads it)
        def timed(*args, **kwargs):
            start = _time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                _PARTS[part] = _PARTS.get(part, 0.0) + _time.perf_counter() - start

        return timed

    def _fit(fit):  # pretraining, in this process (an evaluation's fitting is counted by its evaluation)
        def fit_timed(self, model, *args, **kwargs):
            if type(model).__name__ == "PretrainModule":
                return _timed("pretraining", fit)(self, model, *args, **kwargs)
            return fit(self, model, *args, **kwargs)

        return fit_timed

    _lightning.Trainer.fit = _fit(_lightning.Trainer.fit)  # type: ignore[method-assign]
    import pretrainlab.evaluation.blimp  # noqa: F401  (every evaluation, so that each is timed)
    import pretrainlab.evaluation.glue  # noqa: F401
    import pretrainlab.evaluation.ner  # noqa: F401
    import pretrainlab.evaluation.probes  # noqa: F401
    import pretrainlab.evaluation.squad  # noqa: F401
    from pretrainlab.evaluation.base import Evaluation as _Evaluation

    _classes = [_Evaluation]
    while _classes:
        _cls = _classes.pop()
        _classes += _cls.__subclasses__()
        if "evaluate" in vars(_cls):
            _cls.evaluate = _timed("evaluation", vars(_cls)["evaluate"])  # type: ignore[method-assign]


def pytest_collection_modifyitems(config, items):
    """The longest tests first, then the other slow ones, then the rest: pytest-xdist hands tests out in
    this order (pyproject.toml: one or two at a time), so the long ones start early and the short ones
    even out the end; a long test drawn last kept one worker busy minutes after the other was done.
    "Longest" is the published report of a recorded run (docs/results/test-time-slowest, CONTRIBUTING.md)."""
    import json

    try:
        report = json.loads((ROOT / "docs" / "results" / "test-time-slowest" / "report.json").read_text())
        measured = {row[0]: float(row[1]) for row in report["rows"]}
    except (OSError, ValueError, KeyError, IndexError):
        measured = {}
    items.sort(key=lambda item: (-measured.get(item.nodeid, 0.0), item.get_closest_marker("slow") is None))


def pytest_runtest_setup(item):
    _PARTS.clear()


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory):
    """One pretrainlab data cache (``PRETRAINLAB_CACHE``) for the whole test session, every pytest-xdist
    worker, every module fixture and every process a test starts: tokenizers, tokenized corpora,
    examples, generated evaluation data and probe features. Each entry is keyed by everything it is
    made from (probe features by the sha256 of the encoder's weights) and written to a temporary name
    and renamed under a file lock, as concurrent runs share a cache in use; so a test reads what another
    test made only when it would make the same. The session's cache starts empty: no entry outlives the
    code that made it. (``own_cache`` gives a test an empty one of its own.)"""
    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:  # <session>/popen-gw<N>: the session's folder is shared
        root = root.parent
    path = root / "shared-cache"
    path.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRETRAINLAB_CACHE", str(path))
        yield path


class Once:
    """What the tests make once per session and only read: pretraining runs, a reference run's losses,
    packed inputs. ``once(name, make)`` returns ``<session>/made-once/<name>/``, where ``make(folder)``
    put its files the first time a test asked for ``name``; every test that asks later (on any
    pytest-xdist worker) gets that folder. One worker makes it, under a file lock in the session's
    folder, while the others wait; what a failed ``make`` left is removed, and the next test that asks
    tries again. The session's folder starts empty: nothing made outlives the code that made it, and
    a name must say everything the thing is made from (``shared_run`` keys runs by their composed config).
    The folder is made in place, not renamed into place: a run records the directory it was trained in.

    Read-only: when the test ends, everything it was given is compared with what it held when made (each
    file's path and sha256, read once per version of a file: ``data.hashing.file_digest``) and a test that changed it fails, naming what changed. A test that
    resumes, overwrites or breaks a run makes its own, or copies a shared one first."""

    DONE = ".fingerprint.json"

    def __init__(self, root: Path):
        self.root = root
        self.given: list[Path] = []
        root.mkdir(parents=True, exist_ok=True)

    def __call__(self, name: str, make) -> Path:
        import json
        import shutil

        from filelock import FileLock

        home = self.root / name
        with FileLock(str(home) + ".lock"):
            if not (home / self.DONE).exists():  # not made yet, or what a failed attempt left
                shutil.rmtree(home, ignore_errors=True)
                home.mkdir(parents=True)
                try:
                    make(home)
                except BaseException:
                    shutil.rmtree(home, ignore_errors=True)
                    raise
                (home / self.DONE).write_text(json.dumps(contents(home)))  # last: it is complete
        self.given.append(home)
        return home

    def check_unchanged(self, test: str) -> None:
        import json

        for home in dict.fromkeys(self.given):
            before, after = json.loads((home / self.DONE).read_text()), contents(home)
            if after != before:
                changed = sorted(p for p in {*before, *after} if before.get(p) != after.get(p))
                pytest.fail(
                    f"{test} changed {home}, which other tests read ({', '.join(changed[:5])}): what the `once` "
                    "fixture made is read-only; copy it (shutil.copytree) before changing it"
                )


def contents(folder: Path) -> dict[str, str]:
    """Each file under ``folder`` (relative path; Once's own record left out) -> its sha256."""
    from pretrainlab.data.hashing import file_digest

    return {
        str(p.relative_to(folder)): file_digest(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != Once.DONE
    }


@pytest.fixture
def once(shared_cache, request):
    """``once(name, make) -> folder``: made once per session, read-only (Once); the test fails if it
    changed what it was given."""
    made = Once(shared_cache.parent / "made-once")
    yield made
    made.check_unchanged(request.node.nodeid)


@pytest.fixture
def shared_run(once):
    """``shared_run(*overrides) -> (run_dir, result)``: the pretraining run that ``train`` composed with the
    overrides makes, and what :func:`pretrainlab.pretraining.run.run` returned; made once per session
    (keyed by the composed config, so settings spelled differently share a run) and read-only."""
    import json

    from omegaconf import OmegaConf

    from pretrainlab.data.hashing import fingerprint

    def shared(*overrides: str) -> tuple[Path, dict]:
        cfg = compose_train(*overrides)

        def make(home: Path) -> None:
            from pretrainlab.pretraining.run import run

            result = run(cfg, home / "run")
            (home / "result.json").write_text(json.dumps(result, default=str))

        home = once("run-" + fingerprint({"train": OmegaConf.to_yaml(cfg)}), make)
        return home / "run", json.loads((home / "result.json").read_text())

    return shared


@pytest.fixture
def own_cache(tmp_path_factory, monkeypatch) -> Path:
    """An empty cache of this test's own, for a test that asserts what a cache holds or writes."""
    path = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("PRETRAINLAB_CACHE", str(path))
    return path


@pytest.fixture(autouse=True)
def _no_shared_wandb_service():
    """A W&B run started in this process puts its wandb-core service's address in WANDB_SERVICE,
    for child processes to share; a train.py started later by a test would then log through this
    process's service instead of its own. Every test starts without it."""
    os.environ.pop("WANDB_SERVICE", None)
    yield
    os.environ.pop("WANDB_SERVICE", None)


_WATCHED = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGUSR2", "SIGALRM") if hasattr(signal, name))


@pytest.fixture(autouse=True)
def _signal_handlers_restored(request):
    """A test that installs a signal handler in the test process restores it: one left installed once
    kept a `timeout 900 pytest ...` running 28 minutes past its SIGTERM. Whatever a test leaves is put
    back, and the test fails naming the signal."""
    before = {s: signal.getsignal(s) for s in _WATCHED}
    yield
    left = [s for s in _WATCHED if signal.getsignal(s) is not before[s]]
    for s in left:
        signal.signal(s, before[s])
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, 0)
    if left:
        pytest.fail(
            f"{request.node.nodeid} left its handler of {', '.join(signal.Signals(s).name for s in left)} installed "
            "in the test process: restore it (try/finally) where it is installed"
        )


# --- Commands --------------------------------------------------------------------------------
# The commands tests run (``python train.py ...``, ``python experiments/ablate.py ...``, ``python -m ...``)
# are forked from a server that imported torch, Lightning, Hydra, W&B and this package once per test worker
# (``studies.forkserver``, as a study forks its runs): a fresh interpreter spends 10-15 s of CPU on
# those imports, more than most of these commands' work. Each is still the command: its own process and
# session, the test's environment and folder, its output, exit status and signals. ``fresh=True`` starts a
# fresh interpreter, for what happens before or during imports (start-up, import order, the environment an
# import reads). The DDP ranks Lightning starts, a slot's or a SLURM job's processes start as they always do.

COMMAND_PRELOAD = ("hydra", "pretrainlab.evaluation.run", "pretrainlab.studies.ablation")


def _fork_server():
    """This worker's server for commands (started by the first one, stopped when the worker exits)."""
    from pretrainlab.studies.forkserver import PRELOAD, shared

    return shared((*PRELOAD, *COMMAND_PRELOAD))


class Command:
    """A command started by :func:`start_command`: what tests use of ``subprocess.Popen`` (``pid``,
    ``returncode``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``communicate``), its output in files
    (``stdout`` and ``stderr`` read them from their start; None where it went elsewhere)."""

    def __init__(self, proc, args: list[str], out: Path | None, err: Path | None, folder: tempfile.TemporaryDirectory):
        self._proc, self.args, self.pid, self._folder = proc, args, proc.pid, folder
        self.stdout = out.open(errors="replace") if out else None
        self.stderr = err.open(errors="replace") if err else None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def poll(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._proc.wait(timeout=timeout)

    def send_signal(self, sig: int) -> None:
        self._proc.send_signal(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        self.wait(timeout)
        return (self.stdout.read() if self.stdout else None, self.stderr.read() if self.stderr else None)


def _forkable(args: list) -> bool:
    import sys

    return len(args) >= 2 and args[0] == sys.executable and (args[1] == "-m" or str(args[1]).endswith(".py"))


def start_command(
    args: list,
    cwd: str | Path | None = None,
    env: dict | None = None,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    fresh: bool = False,
) -> Command:
    """Start ``args`` (``[sys.executable, script or -m, ...]``) in a session of its own, forked unless
    ``fresh``. ``stdout``/``stderr``: PIPE (read from ``.stdout``/``.stderr``), DEVNULL, STDOUT (stderr into
    stdout) or an open file."""
    folder = tempfile.TemporaryDirectory(prefix="command-")

    def target(stream, name: str) -> Path | None:
        if stream == subprocess.PIPE:
            path = Path(folder.name) / name
            path.touch()
            return path
        if stream == subprocess.DEVNULL:
            return Path(os.devnull)
        if stream is None:
            return None
        return Path(stream.name)

    out = target(stdout, "stdout")
    err = out if stderr == subprocess.STDOUT else target(stderr, "stderr")
    env = dict(os.environ if env is None else env)
    cwd = str(cwd or os.getcwd())
    if fresh or not _forkable(args) or out is None or err is None:
        files = [open(p, "a") if p else None for p in (out, err)]
        proc = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=files[0], stderr=files[1], text=True, start_new_session=True
        )
        for f in files:
            if f:
                f.close()
    else:
        proc = _fork_server().popen(args[1:], out, env, cwd, stderr=err)
    return Command(
        proc,
        [str(a) for a in args],
        out if stdout == subprocess.PIPE else None,
        err if stderr == subprocess.PIPE else None,
        folder,
    )


def run_command(args: list, timeout: float = 600, fresh: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """Run a command to its end (:func:`start_command`), its output in files rather than pipes: a process
    it leaves behind (a DataLoader worker, a wandb-core service) holding a pipe open would keep a reader
    waiting for the end of the output after the command has exited. On timeout the command's whole
    process group is killed and the test fails with the end of its output."""
    import time

    started = time.perf_counter()
    try:
        proc = start_command(args, fresh=fresh, **kwargs)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(
                f"{' '.join(map(str, args[:4]))} ... still running after {timeout}s:\n{proc.stderr.read()[-3000:]}"
            ) from None
        out, err = proc.communicate()
        return subprocess.CompletedProcess(args, code, out, err)
    finally:
        _PARTS["commands"] = _PARTS.get("commands", 0.0) + time.perf_counter() - started


def compose_config(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(name, overrides=list(overrides))


def compose_train(*overrides: str):
    return compose_config("train", *overrides)


# a small, fast configuration for end-to-end runs
SMALL = [
    "model=tiny",
    "data.num_documents=300",
    "max_seq_len=64",
    "batch_size=16",
    "logger=csv",
    "num_workers=0",
    "trainer.limit_val_batches=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.enable_progress_bar=false",
    "tokenizer.vocab_size=1000",
]


def scored(batch: dict) -> tuple:
    """A masked-LM batch's scored positions as flat indices into batch x seq (row by row, in
    order), and their labels: the (batch, slots) layout without its empty slots."""
    import torch

    positions, labels = batch["mlm_positions"], batch["mlm_labels"]
    keep = labels != -100
    flat = positions + torch.arange(len(positions))[:, None] * batch["input_ids"].shape[1]
    return flat[keep], labels[keep]


def random_documents(n_docs: int, seed: int = 0, vocab=(5, 500)) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        [rng.integers(*vocab, size=int(rng.integers(1, 30))).astype(np.int32) for _ in range(int(rng.integers(1, 12)))]
        for _ in range(n_docs)
    ]

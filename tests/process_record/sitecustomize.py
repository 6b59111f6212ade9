"""Run at start-up by every Python process a test starts while the suite records its time: with
PRETRAINLAB_TEST_DURATIONS=<file>, tests/conftest.py puts this folder first on PYTHONPATH, so that each
process a test starts (a CLI, a study's run, a slot's job, a DDP rank, a SLURM job) appends to the record,
when it exits, the test that started it, its command, its wall-clock and its CPU seconds.
experiments/test_durations.py counts them by test file. A process that ends by ``os._exit`` or a signal
(DataLoader workers, a killed run) writes nothing. A process forked from a study's fork server
(studies.forkserver) records itself as forked: it imported nothing of its own."""

import os

if os.environ.get("PRETRAINLAB_TEST_DURATIONS") and os.environ.get("PYTEST_CURRENT_TEST"):
    import atexit
    import time

    _started = time.monotonic()
    _forked = False

    def _restart() -> None:
        global _started, _forked
        _started, _forked = time.monotonic(), True

    os.register_at_fork(after_in_child=_restart)

    def _record() -> None:
        import json
        import resource
        import sys

        usage = resource.getrusage(resource.RUSAGE_SELF)
        program = os.path.basename(sys.argv[0])
        if program == "__main__.py":  # python -m <package>
            program = "-m " + os.path.basename(os.path.dirname(sys.argv[0]))
        entry = {
            "process": " ".join([program, *sys.argv[1:2]])[:80],
            "test": os.environ["PYTEST_CURRENT_TEST"].rsplit(" (", 1)[0],
            "wall": round(time.monotonic() - _started, 2),
            "cpu": round(usage.ru_utime + usage.ru_stime, 2),
            "lightning": "lightning" in sys.modules,
            "forked": _forked,
        }
        with open(os.environ["PRETRAINLAB_TEST_DURATIONS"], "a") as f:
            f.write(json.dumps(entry) + "\n")

    atexit.register(_record)

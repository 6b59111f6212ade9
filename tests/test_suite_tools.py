"""The suite's own tools: what it makes once and shares (tests/conftest.py: Once, shared_run), and the
record of where its time goes (experiments/test_durations.py, tests/process_record)."""

import pytest

from tests.conftest import Once


def test_a_thing_is_made_once_and_a_failed_make_leaves_nothing(tmp_path):
    made = Once(tmp_path)
    calls = []

    def make(home):
        calls.append(home)
        (home / "a.txt").write_text("a")

    first = made("thing", make)
    assert made("thing", make) == first and len(calls) == 1
    assert (first / "a.txt").read_text() == "a"

    def broken(home):
        (home / "half.txt").write_text("half")
        raise RuntimeError("failed while making")

    with pytest.raises(RuntimeError, match="failed while making"):
        made("other", broken)
    assert not (tmp_path / "other").exists()
    assert (made("other", make) / "a.txt").exists() and len(calls) == 2  # the next one asking tries again
    made.check_unchanged("test")  # nothing changed: no failure


@pytest.mark.parametrize("change", ["edit", "add", "remove"])
def test_a_test_that_changes_what_was_made_once_fails_naming_the_file(tmp_path, change):
    made = Once(tmp_path)
    home = made(
        "run", lambda home: (home / "checkpoints").mkdir() or (home / "checkpoints" / "last.ckpt").write_text("x")
    )
    target = home / "checkpoints" / ("new.ckpt" if change == "add" else "last.ckpt")
    {"edit": lambda: target.write_text("y"), "add": lambda: target.write_text("z"), "remove": target.unlink}[change]()
    with pytest.raises(
        pytest.fail.Exception,
        match=rf"tests/x.py::t changed .*run, which other tests read \({target.parent.name}/{target.name}\)",
    ):
        made.check_unchanged("tests/x.py::t")


def test_runs_with_the_same_settings_are_one_run_and_other_settings_another(shared_run, tmp_path):
    quick = ["model=tiny", "data.num_documents=40", "max_seq_len=32", "batch_size=4", "max_steps=2", "logger=csv",
             "num_workers=0", "trainer.limit_val_batches=1", "trainer.num_sanity_val_steps=0", "export=false",
             "trainer.enable_progress_bar=false", "tokenizer.vocab_size=200", "trainer.accelerator=cpu"]  # fmt: skip
    run_dir, result = shared_run(*quick, "objective=roberta")
    again, _ = shared_run("objective=roberta", *quick)  # the same config, spelled in another order
    other, _ = shared_run(*quick, "objective=roberta", "seed=1")
    assert again == run_dir != other and result["global_step"] == 2
    assert (run_dir / "checkpoints" / "last.ckpt").exists()


def test_the_record_counts_the_processes_tests_start_by_file_and_the_reports_show_them(tmp_path):
    """Each Python process a test starts appends itself to the record (the test's id, its command, its CPU),
    and the by-file report counts them beside the file's test time."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    record = tmp_path / "durations.jsonl"
    for test, when, seconds in (("tests/test_a.py::t1", "call", 30.0), ("tests/test_b.py::t2", "call", 5.0)):
        for phase in ("setup", when, "teardown"):
            entry = {"test": test, "when": phase, "seconds": seconds if phase == "call" else 0.5, "outcome": "passed"}
            record.open("a").write(json.dumps(entry) + "\n")
    env = {
        **os.environ,
        "PRETRAINLAB_TEST_DURATIONS": str(record),
        "PYTEST_CURRENT_TEST": "tests/test_a.py::t1 (call)",
        "PYTHONPATH": str(ROOT / "tests" / "process_record"),
    }
    subprocess.run([sys.executable, "-c", "sum(range(10**6))"], env=env, check=True)
    forks = "import os; pid = os.fork(); sum(range(10**6)); pid and os.waitpid(pid, 0)"  # as a fork server's child
    subprocess.run([sys.executable, "-c", forks], env=env, check=True)
    started = [json.loads(line) for line in record.read_text().splitlines() if "process" in line]
    assert [(p["test"], p["process"], p["lightning"]) for p in started] == [("tests/test_a.py::t1", "-c", False)] * 3
    assert sorted(p["forked"] for p in started) == [False, False, True]
    assert all(p["cpu"] > 0 and p["wall"] > 0 for p in started)
    no_record = {k: v for k, v in env.items() if k != "PRETRAINLAB_TEST_DURATIONS"}
    subprocess.run([sys.executable, "-c", "pass"], env=no_record, check=True)  # not recording: writes nothing
    assert len(record.read_text().splitlines()) == 9

    out = tmp_path / "report"
    command = [sys.executable, str(ROOT / "experiments" / "test_durations.py"), str(record), "--report", str(out)]
    done = subprocess.run([*command, "--startup-samples", "0", "--wall", "40"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "by-file" / "report.json").read_text())
    assert report["columns"][7:9] == ["processes", "their CPU"]
    rows = {row[0]: row for row in report["rows"]}
    assert list(rows) == ["tests/test_a.py", "tests/test_b.py"]  # longest first
    assert rows["tests/test_a.py"][1:3] == ["1", "0.5"] and rows["tests/test_a.py"][7] == "3"
    assert rows["tests/test_b.py"][7:9] == ["0", "0.0"]
    about = report["about"]
    assert "The tests started 3 Python processes (0 of them imported Lightning; forked from a " in about, about
    assert "the one tests fork their commands from: 1)" in about

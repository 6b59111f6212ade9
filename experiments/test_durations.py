"""Where the test suite's time goes: by file, and its slowest tests, from a run's record.

    PRETRAINLAB_TEST_DURATIONS=runs/durations.jsonl make test       # the suite records every test's phases
    python experiments/test_durations.py runs/durations.jsonl --report runs/test-time   # two reports

Each test's time is its setup, call and teardown; its call is split into what it spent pretraining in
the test's process (``Trainer.fit`` of a ``PretrainModule``), in evaluations (every ``Evaluation.evaluate``),
and in commands run in processes of their own (a CLI, ``tests.conftest.run_command``: imports, Hydra,
and whatever the command does); the rest is building data, composing configs, processes a study starts
itself, and the test's own checks. Every Python process a test starts records itself too
(tests/process_record): how many each file's tests started and the CPU they used, beside what one
process that imports torch and Lightning costs before it does anything (measured here, when the reports
are made). Writes ``<report>/by-file`` and ``<report>/slowest``, table reports that
``python tools/docs.py publish`` takes (CONTRIBUTING.md shows them).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("pretraining", "evaluation", "commands")


def read(path: Path) -> tuple[list[dict], list[dict]]:
    """The record's entries: the tests' phases, and the processes tests started (tests/process_record)."""
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in entries if "process" not in e], [e for e in entries if "process" in e]


def load(entries: list[dict]) -> dict[str, dict]:
    """Per test: seconds in all and per part, its outcome (the last record of a test that ran twice wins)."""
    tests: dict[str, dict] = defaultdict(lambda: {"seconds": 0.0, **dict.fromkeys(PARTS, 0.0), "outcome": "passed"})
    seen: set[tuple[str, str]] = set()
    for entry in entries:
        key = (entry["test"], entry["when"])
        if key in seen:  # a second run appended to the same file: start that test again
            tests.pop(entry["test"], None)
            seen = {k for k in seen if k[0] != entry["test"]}
        seen.add(key)
        test = tests[entry["test"]]
        test["seconds"] += float(entry["seconds"])
        for part in PARTS:
            test[part] += float(entry.get(part) or 0.0)
        if entry["outcome"] != "passed" and entry["when"] == "call":
            test["outcome"] = entry["outcome"]
    return dict(tests)


def processes(entries: list[dict]) -> dict[str, dict]:
    """Per test file: how many Python processes its tests started, their CPU seconds, and how many of them
    imported Lightning themselves (a process forked from a fork server that had imported it did not)."""
    files: dict[str, dict] = defaultdict(lambda: {"count": 0, "cpu": 0.0, "lightning": 0, "forked": 0})
    for entry in entries:
        f = files[entry["test"].split("::")[0]]
        f["count"] += 1
        f["cpu"] += float(entry["cpu"])
        f["lightning"] += bool(entry.get("lightning")) and not entry.get("forked")
        f["forked"] += bool(entry.get("forked"))
    return dict(files)


def startup_cpu(module: str = "pretrainlab.pretraining.run", times: int = 3) -> float:
    """CPU seconds (median of ``times``) of a process that imports ``module`` and exits."""
    import resource
    import statistics
    import subprocess

    spent = []
    for _ in range(times):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True, cwd=ROOT)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(spent)


def checks(nodeid: str) -> str:
    """What a test checks: its docstring's first sentence, else its name in words."""
    file, _, name = nodeid.partition("::")
    function = name.split("[", 1)[0]
    try:
        tree = ast.parse((ROOT / file).read_text())
    except (OSError, SyntaxError):
        return function.replace("_", " ")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            doc = ast.get_docstring(node)
            if doc:
                return " ".join(doc.split())[:160].split(". ")[0].rstrip(".") + "."
    return function.removeprefix("test_").replace("_", " ") + "."


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("record", type=Path, help="the JSON lines the suite wrote (PRETRAINLAB_TEST_DURATIONS)")
    parser.add_argument("--report", type=Path, required=True, help="a folder: by-file/ and slowest/ are written in it")
    parser.add_argument("--wall", type=float, default=None, help="the suite's wall-clock in seconds, as pytest said it")
    parser.add_argument("--top", type=int, default=20, help="how many of the slowest tests to list")
    parser.add_argument(
        "--startup-samples", type=int, default=3, help="times to measure a bare process's start-up (0: not measured)"
    )
    args = parser.parse_args(argv)
    if not args.record.is_file():
        parser.error(f"{args.record}: no such record; run the suite with PRETRAINLAB_TEST_DURATIONS={args.record}")
    phases, started_processes = read(args.record)
    tests = load(phases)
    if not tests:
        parser.error(f"{args.record} records no test")
    sys.path.insert(0, str(ROOT / "src"))
    from pretrainlab.compare.measurements import write_table_report

    total = sum(t["seconds"] for t in tests.values())
    files: dict[str, dict] = defaultdict(
        lambda: {"tests": 0, "seconds": 0.0, **dict.fromkeys(PARTS, 0.0), "slowest": ("", 0.0)}
    )
    for nodeid, t in tests.items():
        f = files[nodeid.split("::")[0]]
        f["tests"] += 1
        f["seconds"] += t["seconds"]
        for part in PARTS:
            f[part] += t[part]
        if t["seconds"] > f["slowest"][1]:
            f["slowest"] = (nodeid.split("::", 1)[1], t["seconds"])
    wall = f", {minutes(args.wall)} min of wall-clock" if args.wall else ""
    started = processes(started_processes)
    count = sum(f["count"] for f in started.values())
    startup = startup_cpu(times=args.startup_samples) if args.startup_samples > 0 else None
    about = (
        f"{len(tests)} tests, {minutes(total)} min of test time in all (setup, call and teardown of every test, "
        f"summed over the workers{wall}). Minutes; a test's call split into pretraining in its process, "
        f"evaluations, and commands run in processes of their own (imports, Hydra and the command's work); the "
        f"rest is data, configs, a study's own processes and the checks. The tests started {count} Python "
        f"processes ({sum(f['lightning'] for f in started.values())} of them imported Lightning; forked from a "
        f"fork server that had imported it, a study's or the one tests fork their commands from: "
        f"{sum(f['forked'] for f in started.values())}), which used "
        f"{minutes(sum(f['cpu'] for f in started.values()))} min of CPU"
        + (
            f"; one that imports pretrainlab.pretraining.run (torch, Lightning) and exits takes {startup:.1f} s of "
            "CPU here."
            if startup is not None
            else "."
        )
    )
    rows = [
        [
            name,
            str(f["tests"]),
            minutes(f["seconds"]),
            f"{100 * f['seconds'] / total:.0f}%",
            *(minutes(f[p]) for p in PARTS),
            str(started.get(name, {}).get("count", 0)),
            minutes(started.get(name, {}).get("cpu", 0.0)),
            f"{f['slowest'][0]} ({f['slowest'][1]:.0f} s)",
        ]
        for name, f in sorted(files.items(), key=lambda kv: -kv[1]["seconds"])
    ]
    write_table_report(
        args.report / "by-file",
        "The test suite's time, by file",
        [
            "file",
            "tests",
            "minutes",
            "share",
            "pretraining",
            "evaluations",
            "commands",
            "processes",
            "their CPU",
            "slowest test",
        ],
        rows,
        about,
    )
    slowest = sorted(tests.items(), key=lambda kv: -kv[1]["seconds"])[: args.top]
    write_table_report(
        args.report / "slowest",
        f"The {len(slowest)} slowest tests",
        ["test", "seconds", "pretraining", "evaluations", "commands", "what it checks"],
        [[n, f"{t['seconds']:.0f}", *(f"{t[p]:.0f}" for p in PARTS), checks(n)] for n, t in slowest],
        about,
    )
    print((args.report / "by-file" / "report.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

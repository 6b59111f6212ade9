"""experiments/bench.py runs end to end (a smoke test: speed itself is measured by the script, not by tests)."""

import json
import os
import statistics
import sys

import pytest

from tests.conftest import ROOT, run_command


def test_bench_compares_with_transformers_and_times_the_data_pipeline(tmp_path):
    corpus = tmp_path / "corpus"  # a directory of books, one document each
    corpus.mkdir()
    for b in range(4):
        (corpus / f"book{b}.txt").write_text(
            " ".join(f"Line {i} of book {b} is about river{i % 7}." for i in range(300))
        )
    out = run_command(
        [
            sys.executable,
            "experiments/bench.py",
            "--model",
            "tiny",
            "--objectives",
            "roberta,electra",
            "--precision",
            "fp32",
            "--seq-len",
            "32",
            "--batch",
            "4",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--rounds",
            "1",  # rounds: test_rounds_are_new_process_pairs_and_the_medians_are_over_all_of_them
            "--json",
            str(tmp_path / "bench.json"),
            "--report",
            str(tmp_path / "report"),
            "--data",
            str(corpus),
        ],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "bench.json").read_text())
    assert [(r["impl"], r["objective"]) for r in results] == [
        ("ours", "roberta"),
        ("hf", "roberta"),
        ("ours", "electra"),
        ("hf", "electra"),
    ]
    assert all(r["tokens_per_s"] > 0 and 0 < r["mfu"] and r["peak_mem_mb"] > 0 for r in results)
    assert all(r["page_faults_per_step"] >= 0 for r in results) and "malloc keep" in out.stdout
    for ours, hf in (results[:2], results[2:]):
        # 4 steps, the two processes taking turns: ours, HF, then HF, ours, ...
        assert len(ours["rounds"]) == len(hf["rounds"]) == 1 and len(ours["step_started"]) == 4
        for i, (o, h) in enumerate(zip(ours["step_started"], hf["step_started"])):
            assert (o < h) == (i % 2 == 0), (i, o, h)
        assert (
            ours["ours_over_hf"]
            == hf["ours_over_hf"]
            == statistics.median(h / o for o, h in zip(ours["step_times"], hf["step_times"]))
        )
        assert all(r["step_s"] == statistics.median(r["step_times"]) for r in (ours, hf))
    assert "| roberta | fp32 |" in out.stdout and "| electra | fp32 |" in out.stdout
    # the same table as a report the docs can cite, with what made it
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [r[1] for r in report["rows"]] == ["roberta", "electra"]
    assert report["rows"][0][5] == f"{results[0]['ours_over_hf']:.2f}x" and report["about"].startswith("cpu (")
    assert json.loads((tmp_path / "report" / "provenance.json").read_text())["device"].startswith("CPU only")
    assert "data pipeline, first (cold cache)" in out.stdout and "DataLoader (1 worker(s))" in out.stdout


def test_rounds_are_new_process_pairs_and_the_medians_are_over_all_of_them(monkeypatch):
    """--rounds: each objective's pair of processes is started again per round, and a case's step time and
    ours/HF ratio are medians over the steps of every round (the end-to-end test above runs one round:
    each round is two more processes importing torch and transformers)."""
    from types import SimpleNamespace

    from pretrainlab.tools import bench

    started: list[tuple[str, int]] = []
    slow = {"roberta": 1.0, "electra": 2.0}

    def run_pair(case, worker_cmd, steps, warmup):
        objective, round_ = case.split(":")[0], sum(c == case for c, _ in started)
        started.append((case, round_))
        command = worker_cmd("hf")  # a new process per side: the bench's own module, stepping one case
        assert command[1:5] == ["-m", "pretrainlab.tools.bench", "--case", f"hf:{case}"] and "--compile" not in command
        side = lambda scale: {  # noqa: E731
            "times": [slow[objective] * scale * (round_ + 1) * (i + 1) for i in range(steps)],
            "started": [float(10 * round_ + i) for i in range(steps)],
            "warmup_s": 0.5 + round_,
            "page_faults_per_step": 2.0 * round_,
            "peak_mem_mb": 100.0 + round_,
            "n_tokens": 64,
            "useful_flops": 1e9,
        }
        return {"ours": side(1.0), "hf": side(3.0)}

    monkeypatch.setattr(bench, "run_pair", run_pair)
    monkeypatch.setattr(bench, "matmul_peak", lambda precision, device: 1e10)
    args = SimpleNamespace(rounds=2, steps=3, warmup=1, seq_len=32, batch=4, device="cpu", malloc="keep", compile=False)
    cases = bench.bench_cases(args, "tiny", "fp32", ["roberta", "electra"])
    # round by round, every objective: roberta, electra, then again
    assert started == [("roberta:fp32", 0), ("electra:fp32", 0), ("roberta:fp32", 1), ("electra:fp32", 1)]
    by = {(c["objective"], c["impl"]): c for c in cases}
    ours, hf = by["roberta", "ours"], by["roberta", "hf"]
    assert ours["step_times"] == [1.0, 2.0, 3.0, 2.0, 4.0, 6.0]  # both rounds' steps
    assert ours["step_s"] == 2.5 and hf["step_s"] == 7.5 and ours["ours_over_hf"] == hf["ours_over_hf"] == 3.0
    assert ours["rounds"] == [64 / 2.0, 64 / 4.0]  # tokens per second, one per round
    assert ours["warmup_s"] == 0.5 and ours["peak_mem_mb"] == 101.0 and ours["page_faults_per_step"] == 1.0
    assert ours["step_started"] == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]
    assert by["electra", "ours"]["step_s"] == 5.0 and ours["mfu"] == pytest.approx(1e9 / 2.5 / 1e10)


def test_a_bench_cut_off_keeps_the_cells_it_measured_in_its_report(tmp_path, monkeypatch):
    """--report is written after every model and precision: a run stopped in its second cell (a GPU
    slot's time limit) leaves a report of its first, which says that the run did not finish."""
    from pretrainlab.tools import bench

    def case(model, precision, impl):
        return {
            "impl": impl, "model": model, "objective": "roberta", "precision": precision,
            "tokens_per_s": 1000.0 if impl == "ours" else 500.0, "ours_over_hf": 2.0, "mfu": 0.1, "peak_mem_mb": 10.0,
        }  # fmt: skip

    def cases(args, model, precision, objectives):
        if model == "mini":
            raise KeyboardInterrupt  # the second cell never finishes
        return [case(model, precision, "ours"), case(model, precision, "hf")]

    monkeypatch.setattr(bench, "bench_cases", cases)
    report = tmp_path / "report"
    argv = ["--model", "tiny,mini", "--objectives", "roberta", "--precision", "fp32", "--device", "cpu"]
    try:
        bench.main([*argv, "--report", str(report), "--json", str(tmp_path / "bench.json")])
    except KeyboardInterrupt:
        pass
    written = json.loads((report / "report.json").read_text())
    assert [row[:3] for row in written["rows"]] == [["tiny", "roberta", "fp32"]]
    assert "1 of 2 model/precision cells (the run did not finish)" in written["about"]
    assert len(json.loads((tmp_path / "bench.json").read_text())) == 2

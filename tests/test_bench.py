"""experiments/bench.py runs end to end (a smoke test: speed itself is measured by the script, not by tests)."""

import json
import os
import statistics
import subprocess
import sys

from tests.conftest import ROOT


def test_bench_compares_with_transformers_and_times_the_data_pipeline(tmp_path):
    corpus = tmp_path / "corpus"  # a directory of books, one document each
    corpus.mkdir()
    for b in range(4):
        (corpus / f"book{b}.txt").write_text(
            " ".join(f"Line {i} of book {b} is about river{i % 7}." for i in range(300))
        )
    out = subprocess.run(
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
            "2",
            "--warmup",
            "1",
            "--rounds",
            "2",
            "--json",
            str(tmp_path / "bench.json"),
            "--report",
            str(tmp_path / "report"),
            "--data",
            str(corpus),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
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
        # 2 rounds x 2 steps, the two processes taking turns: ours, HF, then HF, ours
        assert len(ours["rounds"]) == len(hf["rounds"]) == 2 and len(ours["step_started"]) == 4
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

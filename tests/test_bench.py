"""experiments/bench.py runs end to end (a smoke test: speed itself is measured by the script, not by tests)."""

import json
import os
import subprocess
import sys

from tests.conftest import ROOT


def test_bench_compares_with_transformers_and_times_the_data_pipeline(tmp_path):
    corpus = tmp_path / "corpus"  # a directory of books, one document each
    corpus.mkdir()
    for b in range(4):
        (corpus / f"book{b}.txt").write_text(" ".join(f"Line {i} of book {b} is about river{i % 7}." for i in range(300)))
    out = subprocess.run(
        [sys.executable, "experiments/bench.py", "--model", "tiny", "--objectives", "roberta,electra",
         "--precision", "fp32", "--seq-len", "32", "--batch", "4", "--steps", "1", "--warmup", "1", "--rounds", "2",
         "--json", str(tmp_path / "bench.json"), "--data", str(corpus)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "bench.json").read_text())
    assert [(r["impl"], r["objective"]) for r in results] == [
        ("ours", "roberta"), ("hf", "roberta"), ("ours", "electra"), ("hf", "electra")]
    assert all(r["tokens_per_s"] > 0 and 0 < r["mfu"] and r["peak_mem_mb"] > 0 for r in results)
    assert all(r["page_faults_per_step"] >= 0 for r in results) and "malloc keep" in out.stdout
    assert all(len(r["rounds"]) == 2 and r["tokens_per_s"] == max(r["rounds"]) for r in results)  # the best round
    assert "| roberta | fp32 |" in out.stdout and "| electra | fp32 |" in out.stdout
    assert "data pipeline, first (cold cache)" in out.stdout and "DataLoader (1 worker(s))" in out.stdout

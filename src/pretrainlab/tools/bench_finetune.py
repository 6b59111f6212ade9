"""Time a GLUE task's fine-tuning seeds one after another against fused into one model
(``fuse_seeds=true``, ``pretrainlab.evaluation.fused``), in the same call on the same device:

    python experiments/bench_finetune.py                                      # CPU: tiny encoder, synthetic SST-2
    python experiments/bench_finetune.py --model mini --seeds 3 --glue-dir ../shared/data/glue \\
        --max-train 2000 --epochs 3 --seq-len 128 --precision bf16-mixed --report runs/bench-finetune

Both ways run the evaluation suite as a study runs it (``studies.suite.run_suite``): the same encoder
(``--pretrained``, or a freshly initialised one without dropout, whose weights do not change the time), task, seeds and recipe, each into a folder of its own, after one short warm-up fine-tuning. Prints
the seconds of each, their ratio, and the largest difference between the dev metrics the two ways
reached (they train the same runs: ``tests/test_fused.py``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def _encoder(model: str, home: Path) -> Path:
    """An export of a freshly initialised encoder of ``model``'s shape, without dropout, with a WordPiece
    vocabulary trained on the synthetic language the synthetic GLUE suite is drawn from (its weights do
    not change the time; nothing here needs the ``datasets`` library)."""
    from hydra.utils import instantiate

    from pretrainlab.data.corpus import SyntheticCorpus, split_sentences
    from pretrainlab.data.synthetic import SyntheticLanguage, generate_documents
    from pretrainlab.data.tokenizer import TokenizerSpec
    from pretrainlab.export.native import export_encoder
    from pretrainlab.model.encoder import Encoder
    from pretrainlab.runtime.hydra import compose
    from pretrainlab.tokens import special_tokens

    cfg, _ = compose("train", [f"model={model}", "model.hidden_dropout=0", "model.attention_dropout=0"])
    corpus = SyntheticCorpus()
    texts = generate_documents(300, corpus.min_sentences, corpus.max_sentences, SyntheticLanguage(seed=corpus.seed))
    tokenizer = TokenizerSpec(vocab_size=int(cfg.tokenizer.vocab_size)).train(
        [s for text in texts for s in split_sentences(text)], workdir=home
    )
    encoder = Encoder(instantiate(cfg.model, vocab_size=tokenizer.get_vocab_size()))
    data = {"_target_": "pretrainlab.data.corpus.SyntheticCorpus", "seed": corpus.seed, "num_topics": corpus.num_topics}
    meta = {"objective": "roberta", "config": {"data": data}}
    return export_encoder(encoder, tokenizer, special_tokens(tokenizer), home / "encoder", pretraining=meta)


def _suite(
    pretrained: Path, out: Path, fuse: bool, args, seeds: list[int], extra: tuple[str, ...] = ()
) -> tuple[float, dict]:
    """(seconds, results by seed) of the suite's fine-tunings of ``args.task`` into ``out``."""
    from pretrainlab.runtime.hydra import compose
    from pretrainlab.studies.suite import run_suite

    data = (
        [f"glue.data_dir={args.glue_dir}", "glue.source=local"]
        if args.glue_dir
        else ["glue.source=synthetic", f"glue.synthetic.scale={args.scale}"]
    )
    cfg, _ = compose(
        "suite",
        [
            f"pretrained={pretrained}",
            f"fuse_seeds={str(fuse).lower()}",
            f"output_dir={out}",
            *data,
            *([f"glue.max_train_examples={args.max_train}"] if args.max_train else []),
            f"task_overrides.epochs={args.epochs}",
            f"task_overrides.batch_size={args.batch}",
            f"task_overrides.max_seq_len={args.seq_len}",
            "task_overrides.lr=2.0e-4",
            f"trainer.precision={args.precision}",
            f"trainer.accelerator={args.accelerator}",
            "trainer.enable_progress_bar=false",
            "compile=false",
            "logger=csv",
            *extra,
        ],
    )
    started = time.perf_counter()
    results = run_suite(cfg, [args.task], seeds, out, dict(cfg.task_overrides))
    return time.perf_counter() - started, {r["seed"]: r for r in results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python experiments/bench_finetune.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pretrained", type=Path, default=None, help="an encoder without dropout (a run or export)")
    parser.add_argument("--model", default="tiny", help="the encoder's shape when --pretrained is not given")
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds 0 .. N-1")
    parser.add_argument("--glue-dir", default=None, help="GLUE in its released layout (default: the synthetic suite)")
    parser.add_argument("--scale", type=float, default=0.25, help="the synthetic suite's size")
    parser.add_argument("--max-train", type=int, default=None, help="the first N training examples")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--precision", default="32-true", help="32-true or bf16-mixed")
    parser.add_argument("--accelerator", default="auto", help="auto (a GPU if there is one), cpu or gpu")
    parser.add_argument("--report", type=Path, default=None, help="write a report here (docs publish takes it)")
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error(f"--seeds {args.seeds}: fusing needs 2 or more")
    import torch

    from pretrainlab.runtime.console import quiet_third_parties

    quiet_third_parties()
    seeds = list(range(args.seeds))
    with tempfile.TemporaryDirectory(prefix="pretrainlab-bench-finetune-") as tmp:
        home = Path(tmp)
        pretrained = args.pretrained or _encoder(args.model, home)
        _suite(
            pretrained, home / "warm-up", False, args, [0], ("glue.max_train_examples=64", "task_overrides.epochs=1")
        )
        alone_s, alone = _suite(pretrained, home / "alone", False, args, seeds)
        fused_s, fused = _suite(pretrained, home / "fused", True, args, seeds)
    if any("fused_runs" not in r for r in fused.values()):
        raise RuntimeError("the seeds were not fused (the log says why): this encoder cannot be fine-tuned fused")
    gap = max(abs(fused[s]["metrics"][k] - v) for s in seeds for k, v in alone[s]["metrics"].items())
    steps = alone[0]["steps"]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() and args.accelerator != "cpu" else "CPU"
    rows = [
        ["one seed after another", args.seeds, f"{alone_s:.1f}", f"{args.seeds * steps / alone_s:.1f}", "1.00x"],
        [
            "fused into one model",
            args.seeds,
            f"{fused_s:.1f}",
            f"{args.seeds * steps / fused_s:.1f}",
            f"{alone_s / fused_s:.2f}x",
        ],
    ]
    about = (
        f"{args.task}: {args.seeds} seeds x {steps} steps ({alone[0]['train_examples']} examples, {args.epochs} epochs, "
        f"batch {args.batch}, sequences up to {args.seq_len}, {args.precision}) on {device}; encoder "
        f"{'given' if args.pretrained else f'model={args.model}, freshly initialised'}. Fused / one after another: "
        f"{alone_s / fused_s:.2f}x; the largest difference between their dev metrics: {gap:.2g}."
    )
    print(about)
    for row in rows:
        print(f"  {row[0]:24s} {row[2]:>7s} s   {row[3]:>7s} steps/s   {row[4]}")
    if args.report is not None:
        from pretrainlab.compare.measurements import write_table_report

        columns = ["fine-tuned", "seeds", "seconds", "run-steps/s", "x one after another"]
        write_table_report(
            args.report, "A GLUE task's fine-tuning seeds: one after another against fused", columns, rows, about
        )
        print(f"report -> {args.report} (python tools/docs.py publish {args.report} --name <name>)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

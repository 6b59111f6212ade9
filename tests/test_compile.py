"""The training step compiles whole: no graph break for any objective, in training and evaluation,
with fixed and with varying shapes; the compiled step gives the eager step's values; static shapes
give every batch the same shapes (as CUDA graphs need)."""

import csv

import numpy as np
import pytest
import torch

from pretrainlab.model.encoder import Encoder, EncoderConfig
from pretrainlab.objectives.masking import max_selected
from pretrainlab.pretraining.assembly import build_objective
from pretrainlab.pretraining.run import run
from pretrainlab.runtime.hydra import options
from pretrainlab.tokens import SpecialTokens
from tests.conftest import SMALL, compose_train, random_documents


def setup(name: str, length: int | None, dropout: float = 0.1, seed: int = 0):
    torch.manual_seed(seed)
    tokens = SpecialTokens(500, 0, 1, 2, 3, 4, np.zeros(500, dtype=bool))
    config = EncoderConfig(
        vocab_size=500,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
        hidden_dropout=dropout,
        attention_dropout=dropout,
    )
    objective = build_objective(compose_train(f"objective={name}"), config, tokens)
    examples = list(objective.example_builder(32)(random_documents(60, seed=seed), np.random.default_rng(seed)))
    return objective, Encoder(config), examples


@pytest.mark.parametrize("name", options("objective"))
@pytest.mark.parametrize("length", [32, None], ids=["static", "varying"])
def test_the_objective_step_has_no_graph_break(name, length):
    objective, encoder, examples = setup(name, length)
    batch = objective.collator(length)(examples[:8], torch.Generator().manual_seed(0))
    for training in (True, False):
        encoder.train(training)
        objective.train(training)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(lambda b: objective(encoder, b).loss)(batch)
        assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]
        assert explained.graph_count == 1


@pytest.mark.parametrize("name", ["roberta", "bert"])
def test_static_shapes_give_every_batch_the_same_shapes(name):
    objective, _, examples = setup(name, 32)
    collate = objective.collator(32)
    shapes = set()
    for i in range(0, 48, 8):  # batches of different contents and lengths
        batch = collate(examples[i : i + 8], torch.Generator().manual_seed(i))
        shapes.add(tuple((k, tuple(v.shape)) for k, v in sorted(batch.items()) if torch.is_tensor(v)))
    assert len(shapes) == 1
    shape = dict(next(iter(shapes)))
    assert shape["input_ids"] == (8, 32) and shape["mlm_positions"] == (8, max_selected(32, 0.15))
    short = [{k: (v[:12] if np.ndim(v) else v) for k, v in e.items()} for e in examples[:8]]
    short_batch = collate(short, torch.Generator().manual_seed(0))  # short examples are padded to the length
    assert short_batch["input_ids"].shape == (8, 32) and objective.collator()(short, torch.Generator())[
        "input_ids"
    ].shape == (8, 16)  # without a length: the longest, rounded up to 8


def test_the_compiled_step_equals_the_eager_one():
    """Inductor's code on this CPU against eager, ELECTRA: the masked-LM head on full logits, the
    generator's sampling at the batch's uniforms, the discriminator (no dropout: its draws differ)."""
    objective, encoder, examples = setup("electra", 32, dropout=0.0)
    batch = objective.collator(32)(examples[:8], torch.Generator().manual_seed(0))
    encoder.pooler.requires_grad_(False)  # ELECTRA does not use it (as PretrainModule does)
    params = [p for p in [*encoder.parameters(), *objective.parameters()] if p.requires_grad]

    def step(fn):
        out = fn(batch)
        return out, torch.autograd.grad(out.loss, params)

    eager, eager_grads = step(lambda b: objective(encoder, b))
    torch._dynamo.reset()
    compiled, compiled_grads = step(torch.compile(lambda b: objective(encoder, b), dynamic=False))
    torch.testing.assert_close(compiled.loss, eager.loss, rtol=1e-5, atol=1e-5)
    for name in eager.metrics:
        torch.testing.assert_close(compiled.metrics[name], eager.metrics[name], rtol=1e-5, atol=1e-5)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_compiled_training_run_gives_the_eager_losses(tmp_path, monkeypatch):
    """``compile=true`` in a run: the module compiles its step, logs the warm-up, and trains to the
    eager losses (the aot_eager backend traces exactly what inductor would compile, without the
    C++ build; the inductor code itself is checked above)."""
    overrides = [
        *SMALL,
        "max_steps=6",
        "val_every=3",
        "checkpoint_every=6",
        "trainer.log_every_n_steps=1",
        "export=false",
        "model.hidden_dropout=0.0",
        "model.attention_dropout=0.0",
        "static_shapes=true",
    ]

    def losses(run_dir):
        rows = [r for f in run_dir.glob("csv/version_*/metrics.csv") for r in csv.DictReader(f.open())]
        return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}, rows

    run(compose_train(*overrides), tmp_path / "eager")
    graphs = []

    def aot_eager(gm, example_inputs):  # inductor's tracing without its C++ build, counting every graph
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    monkeypatch.setattr("pretrainlab.runtime.settings.compile_options", lambda cfg: {"backend": aot_eager})
    torch._dynamo.reset()
    run(compose_train(*overrides, "compile=true"), tmp_path / "compiled")
    eager, _ = losses(tmp_path / "eager")
    compiled, rows = losses(tmp_path / "compiled")
    assert sorted(compiled) == sorted(eager) == list(range(6))
    for step in eager:
        assert compiled[step] == pytest.approx(eager[step], rel=1e-4), (step, compiled[step], eager[step])
    assert any(r.get("perf/compile_warmup_s") for r in rows)
    # one compile, the training step's: validation runs eager (compiled, its no-grad graph was a second
    # compile at every run's start, for a few batches now and then)
    assert len(graphs) == 1, [g.code[:200] for g in graphs]
    assert [r["val/loss"] for r in rows if r.get("val/loss")]

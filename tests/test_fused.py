"""Fused runs (pretraining.fused, model.stacked): runs of one encoder shape trained as one batched model
are, run by run, the runs trained alone: the same losses at every step and the same weights after, up
to float rounding."""

import copy

import numpy as np
import pytest
import torch

from pretrainlab.config import ConfigError
from pretrainlab.model.encoder import EncoderCall
from pretrainlab.optim import OptimConfig
from pretrainlab.pretraining.fused import FusedGroup, GroupAdamW
from pretrainlab.tools.bench_slot import build_run, make_batches

VOCAB, SEQ, BATCH = 300, 32, 6


def _run(objective: str, seed: int, train: list[str] | None = None):
    """The slot's run of ``objective`` (its recipe: pre-LN, no dropout) on the tiny encoder."""
    _, encoder, obj = build_run(objective, "tiny", VOCAB, seed, train=train)
    return encoder, obj


def _alone(encoder, objective, batches, optim: OptimConfig):
    """The run on its own, stepped as PretrainModule steps it: AdamW over its trained parameters (as
    Lightning's bf16-mixed with clipping gets it: foreach), gradients clipped to their norm."""
    module = torch.nn.ModuleDict({"encoder": encoder, "objective": objective})
    opt = optim.optimizer(module, mixed_precision=True)
    params = [p for p in module.parameters() if p.requires_grad]
    losses = []
    for batch in batches:
        loss = objective(encoder, batch).loss
        loss.backward()
        losses.append(loss.item())
        torch.nn.utils.clip_grad_norm_(params, optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses


def test_a_fused_group_trains_each_run_exactly_as_it_trains_alone():
    """Six runs of four objectives (masked rows, a pair head through the pooler, causal rows, span
    boundaries, a causal/masked mix), each at its own learning rate, with clipping that bites: after
    eight steps every run's losses and weights (encoder and heads) are its run alone's."""
    names = ["roberta", "bert", "clm", "spanbert", "gpt_bert", "roberta"]
    lrs = [2e-3, 1e-3, 3e-3, 2e-3, 5e-4, 4e-3]
    runs = [_run(name, seed) for seed, name in enumerate(names)]
    data = [make_batches(o, 8, BATCH, SEQ, True, VOCAB, seed=10 + i) for i, (_, o) in enumerate(runs)]
    initial = [copy.deepcopy(e.state_dict()) for e, _ in runs]

    alone = []
    for (encoder, objective), batches, lr in zip(runs, data, lrs, strict=True):
        encoder, objective = copy.deepcopy(encoder), copy.deepcopy(objective)
        losses = _alone(encoder, objective, batches, OptimConfig(lr=lr, grad_clip=0.5))
        alone.append((losses, encoder.state_dict(), objective.state_dict()))

    group = FusedGroup([copy.deepcopy(e) for e, _ in runs], [copy.deepcopy(o) for _, o in runs])
    opt = GroupAdamW(group, OptimConfig(lr=1.0, grad_clip=0.5))
    fused_losses: list[list[float]] = [[] for _ in names]
    clipped = 0
    for step in range(8):
        outs = group([d[step] for d in data])
        sum(out.loss for out in outs).backward()
        clipped += int((opt.grad_norms() > 0.5).sum())
        for m, out in enumerate(outs):
            fused_losses[m].append(out.loss.item())
        opt.step(lrs)
        opt.zero_grad()
    assert clipped > 10  # the clipping is exercised, run by run

    for m, name in enumerate(names):
        losses, encoder_state, objective_state = alone[m]
        np.testing.assert_allclose(fused_losses[m], losses, rtol=0, atol=2e-5, err_msg=name)
        assert losses[-1] < losses[0] - 0.05, f"{name} did not learn: {losses}"
        fused_state = group.stacked.member_state(m)
        assert fused_state.keys() == encoder_state.keys()
        for key, value in encoder_state.items():
            torch.testing.assert_close(fused_state[key], value, rtol=0, atol=2e-5, msg=f"{name}: {key}")
        for key, value in objective_state.items():
            torch.testing.assert_close(group.objectives[m].state_dict()[key], value, rtol=0, atol=2e-5)
        if name != "bert":  # a pooler its objective does not use is frozen: not decayed, not moved
            torch.testing.assert_close(fused_state["pooler.weight"], initial[m]["pooler.weight"], rtol=0, atol=0)
    # the two roberta runs, of different seeds and learning rates, stayed apart
    key = "layers.0.attention.qkv.weight"
    assert not torch.allclose(group.stacked.member_state(0)[key], group.stacked.member_state(5)[key])


def test_a_group_whose_runs_ask_for_rows_of_one_width_keeps_the_last_layer_at_those_rows():
    """Masked LMs alone in a group: the last layer computes only their scored rows (as each run alone
    does), and the outputs are each run's own."""
    runs = [_run("roberta", 0), _run("bert", 1)]
    batches = [make_batches(o, 1, BATCH, SEQ, True, VOCAB, seed=3 + i)[0] for i, (_, o) in enumerate(runs)]
    group = FusedGroup([e for e, _ in runs], [o for _, o in runs])
    calls = [o.encoder_call(b) for (_, o), b in zip(runs, batches, strict=True)]
    assert all(isinstance(c, EncoderCall) and c.rows is not None for c in calls)
    with torch.no_grad():
        outs = group.stacked(calls)
        for (encoder, _), call, out in zip(runs, calls, outs, strict=True):
            alone = call(encoder)
            width = encoder.config.hidden_size
            assert out.hidden_states.shape == alone.hidden_states.shape == (BATCH, calls[0].rows.shape[1], width)
            torch.testing.assert_close(out.hidden_states, alone.hidden_states, rtol=0, atol=1e-5)
            torch.testing.assert_close(out.pooled, alone.pooled, rtol=0, atol=1e-5)


def test_runs_that_cannot_be_fused_are_refused_with_the_reason():
    roberta, electra = _run("roberta", 0), _run("electra", 1)
    mini = build_run("roberta", "mini", VOCAB, 2)
    with pytest.raises(ConfigError, match=r"different encoder shapes.*model\.hidden_size is 128 in one and 256"):
        FusedGroup([roberta[0], mini[1]], [roberta[1], mini[2]])
    shared = _run("albert", 3, ["model.share_layers=true"])
    with pytest.raises(ConfigError, match="shared layers"):
        FusedGroup([shared[0], copy.deepcopy(shared[0])], [shared[1], copy.deepcopy(shared[1])])
    group = FusedGroup([roberta[0], electra[0]], [roberta[1], electra[1]])
    batches = [make_batches(o, 1, BATCH, SEQ, True, VOCAB, seed=1)[0] for _, o in (roberta, electra)]
    with pytest.raises(ConfigError, match="objective=electra cannot be fused"):
        group(batches)
    group = FusedGroup([roberta[0], copy.deepcopy(roberta[0])], [roberta[1], copy.deepcopy(roberta[1])])
    wide = make_batches(roberta[1], 1, BATCH, SEQ, True, VOCAB, seed=1)[0]
    narrow = make_batches(roberta[1], 1, BATCH, SEQ // 2, True, VOCAB, seed=1)[0]
    with pytest.raises(ValueError, match="batches of one shape"):
        group([wide, narrow])

import pytest
import torch
from hydra.utils import instantiate

from pretrainlab.config import ConfigError
from pretrainlab.model.encoder import Encoder, EncoderConfig, count_parameters
from tests.conftest import compose_train


@pytest.mark.parametrize("preset, expected", [("base", 109_482_240), ("large", 335_141_888)])
def test_bert_presets_have_hugging_face_parameter_counts(preset, expected):
    cfg = compose_train(f"model={preset}", "model.vocab_size=30522")
    assert count_parameters(instantiate(cfg.model)) == expected


def test_presets_shapes():
    for preset, (h, layers, heads) in {
        "tiny": (128, 2, 2),
        "mini": (256, 4, 4),
        "small": (512, 4, 8),
        "medium": (512, 8, 8),
    }.items():
        c = instantiate(compose_train(f"model={preset}", "model.vocab_size=100").model)
        assert (c.hidden_size, c.num_layers, c.num_heads, c.intermediate_size) == (h, layers, heads, 4 * h)


def test_config_rejects_impossible_shapes_with_a_readable_message():
    with pytest.raises(ConfigError, match="not divisible by model.num_heads"):
        EncoderConfig(vocab_size=100, hidden_size=100, num_heads=3)
    with pytest.raises(ConfigError, match="positive integer"):
        EncoderConfig(vocab_size=0)
    with pytest.raises(ConfigError, match="hidden_dropout"):
        EncoderConfig(vocab_size=10, hidden_dropout=1.5)


def tiny(**kw):
    return EncoderConfig(
        **{
            "vocab_size": 50,
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 4,
            "hidden_dropout": 0.0,
            "attention_dropout": 0.0,
            **kw,
        }
    )


@pytest.mark.parametrize("kw", [{}, {"pre_layer_norm": True}, {"embedding_size": 16, "share_layers": True}])
def test_padding_does_not_change_real_tokens(kw):
    torch.manual_seed(0)
    enc = Encoder(tiny(**kw)).eval()
    ids = torch.randint(5, 50, (2, 7))
    padded = torch.cat([ids, torch.zeros(2, 5, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(2, 7), torch.zeros(2, 5)], dim=1)
    a = enc(ids).hidden_states
    b = enc(padded, attention_mask=mask).hidden_states[:, :7]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # without the mask the padding leaks into the real tokens
    c = enc(padded).hidden_states[:, :7]
    assert not torch.allclose(a, c, atol=1e-4)


@pytest.mark.parametrize(
    "kw", [{}, {"pre_layer_norm": True}, {"embedding_size": 16, "share_layers": True}, {"add_pooler": False}]
)
@pytest.mark.parametrize("train", [False, True])
def test_rows_give_the_full_forwards_rows_and_pooled_vector(kw, train):
    """``rows=`` computes the last layer only where a masked LM scores: same values, same gradients."""
    torch.manual_seed(0)
    enc = Encoder(tiny(num_layers=3, **kw)).train(train)  # tiny has no dropout: train mode is deterministic
    ids = torch.randint(5, 50, (3, 9))
    mask = torch.ones(3, 9)
    mask[1, 6:] = 0
    rows = torch.tensor([[4, 0], [1, 2], [7, 7]])  # positions per sequence: any order, [CLS], a repeat
    full = enc(ids, attention_mask=mask)
    part = enc(ids, attention_mask=mask, rows=rows)
    wanted = full.hidden_states.gather(1, rows[:, :, None].expand(-1, -1, 32))
    torch.testing.assert_close(part.hidden_states, wanted, atol=1e-5, rtol=1e-5)
    if full.pooled is None:
        assert part.pooled is None
    else:
        torch.testing.assert_close(part.pooled, full.pooled, atol=1e-5, rtol=1e-5)
    if train:
        g_full = torch.autograd.grad(wanted.square().sum(), enc.layers[0].ffn_in.weight)
        g_part = torch.autograd.grad(part.hidden_states.square().sum(), enc.layers[0].ffn_in.weight)
        torch.testing.assert_close(g_part[0], g_full[0], atol=1e-5, rtol=1e-4)


def test_flops_count_the_last_layer_at_the_rows_only():
    enc = Encoder(tiny(num_layers=4, add_pooler=False))
    full, part = enc.flops_per_token(128), enc.flops_per_token(128, 0.15)
    h, i = 32, 4 * 32
    per_query = 2 * (2 * h * h + 2 * h * i) + 2 * 2 * 128 * h  # Q, output, FFN projections; QK^T and AV
    assert full - part == pytest.approx(3 * per_query * 0.85)  # the last layer at 85% fewer rows
    assert full == pytest.approx(3 * 4 * (2 * (4 * h * h + 2 * h * i) + 2 * 2 * 128 * h))
    with_pooler = Encoder(tiny(num_layers=4))
    assert with_pooler.flops_per_token(128, 0.15) > part  # plus the [CLS] rows


def test_architecture_options():
    shared = Encoder(tiny(share_layers=True))
    separate = Encoder(tiny())
    assert len(shared.layers) == 1 and len(separate.layers) == 2
    assert shared.num_parameters() < separate.num_parameters()
    fact = Encoder(tiny(embedding_size=8))
    assert fact.embeddings.word_embeddings.weight.shape == (50, 8) and fact.embedding_projection is not None
    assert Encoder(tiny(pre_layer_norm=True)).final_norm is not None
    assert Encoder(tiny(add_pooler=False))(torch.randint(0, 50, (1, 4))).pooled is None


def test_segment_ids_matter_and_long_inputs_are_refused():
    torch.manual_seed(0)
    enc = Encoder(tiny(max_position_embeddings=16)).eval()
    ids = torch.randint(5, 50, (1, 8))
    out0 = enc(ids, token_type_ids=torch.zeros_like(ids)).hidden_states
    out1 = enc(ids, token_type_ids=torch.ones_like(ids)).hidden_states
    assert not torch.allclose(out0, out1)
    with pytest.raises(ConfigError, match="exceeds model.max_position_embeddings=16"):
        enc(torch.randint(5, 50, (1, 17)))


# --- the CPU dropout -------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_cpu_dropout_drops_at_the_rate_and_keeps_the_expectation(p):
    from pretrainlab.model.encoder import dropout

    torch.manual_seed(0)
    x = torch.ones(1 << 22, requires_grad=True)  # 4M elements: a rate's standard error is < 0.00025
    y = dropout(x, p)
    dropped = y == 0
    expected = round(p * 2**16) / 2**16
    assert abs(dropped.float().mean().item() - expected) < 0.0015
    # each 16-bit slice of the 64-bit draws is uniform (a biased sign bit would show in one lane)
    lanes = dropped.view(-1, 4).float().mean(0)
    assert (lanes - expected).abs().max().item() < 0.003, lanes
    assert abs(y.mean().item() - 1.0) < 0.003  # kept values are scaled by 1 / keep probability
    assert torch.allclose(y[~dropped], torch.full_like(y[~dropped], 1 / (1 - expected)))
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach())  # the gradient goes through the kept elements only


def test_cpu_dropout_is_seeded_fresh_per_call_and_off_in_eval():
    from pretrainlab.model.encoder import Dropout

    x = torch.ones(4, 1000)
    layer = Dropout(0.3)
    torch.manual_seed(1)
    a, b = layer(x), layer(x)
    torch.manual_seed(1)
    assert torch.equal(layer(x), a) and not torch.equal(a, b)
    assert torch.equal(layer.eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        Dropout(1.0)


def test_cpu_attention_dropout_path_is_the_attention_math(monkeypatch):
    """In training on CPU attention is computed by hand (to use the cheap dropout); with that dropout
    made the identity it must equal scaled_dot_product_attention, padding mask included."""
    import pretrainlab.model.encoder as encoder_module

    torch.manual_seed(0)
    cfg = EncoderConfig(
        vocab_size=50, hidden_size=32, num_layers=2, num_heads=4, hidden_dropout=0.0, attention_dropout=0.2
    )
    enc = Encoder(cfg)
    ids = torch.randint(5, 50, (3, 9))
    mask = torch.ones(3, 9)
    mask[1, 6:] = 0
    reference = enc.eval()(ids, attention_mask=mask).hidden_states  # SDPA, no dropout
    monkeypatch.setattr(encoder_module, "dropout", lambda x, p, training=True: x)
    by_hand = enc.train()(ids, attention_mask=mask).hidden_states
    torch.testing.assert_close(by_hand, reference, atol=1e-5, rtol=1e-5)
    rows = torch.tensor([[3, 0], [0, 5], [8, 2]])  # the last layer at these rows only, queries included
    torch.testing.assert_close(
        enc(ids, attention_mask=mask, rows=rows).hidden_states,
        reference.gather(1, rows[:, :, None].expand(-1, -1, 32)),
        atol=1e-5,
        rtol=1e-5,
    )
    monkeypatch.undo()
    assert not torch.allclose(enc.train()(ids, attention_mask=mask).hidden_states, reference, atol=1e-3)


def test_the_cpu_fast_paths_are_chosen_in_eager_mode_on_a_cpu_only():
    """One predicate picks the CPU paths: true for an eager CPU tensor, false while torch.compile
    traces (the compiled graph must hold the fused path) and for a tensor on another device."""
    from pretrainlab.model.fastpath import eager_cpu

    x = torch.zeros(3)
    assert eager_cpu(x)
    traced = torch.compile(lambda t: t + (1.0 if eager_cpu(t) else 2.0), backend="eager", fullgraph=True)
    assert torch.equal(traced(x), torch.full((3,), 2.0))
    assert not eager_cpu(torch.zeros(3, device="meta"))


def _patterned(pre_ln=False, heads=4, layers=2, dropout=0.0):
    torch.manual_seed(0)
    cfg = EncoderConfig(
        vocab_size=60,
        hidden_size=32,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=64,
        pre_layer_norm=pre_ln,
        hidden_dropout=0.0,
        attention_dropout=dropout,
    )
    return Encoder(cfg).eval()


@pytest.mark.parametrize("pre_ln", [False, True])
def test_a_causal_pattern_hides_every_later_token_and_per_head_masks_act_per_head(pre_ln):
    enc = _patterned(pre_ln)
    ids = torch.randint(5, 60, (3, 10))
    causal = torch.ones(10, 10, dtype=torch.bool).tril().expand(3, 10, 10)
    out = enc(ids, attention_mask=causal).hidden_states
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 7) % 55 + 5
    again = enc(changed, attention_mask=causal).hidden_states
    torch.testing.assert_close(again[:, :6], out[:, :6], atol=1e-6, rtol=1e-6)  # positions 0-5 see 0-5 only
    assert not torch.allclose(again[:, 6:], out[:, 6:], atol=1e-3)
    # the same pattern for every head, given per head, is the same pattern
    per_head = causal[:, None].expand(3, 4, 10, 10)
    torch.testing.assert_close(enc(ids, attention_mask=per_head).hidden_states, out, atol=1e-6, rtol=1e-6)
    # a padding mask and the pattern it stands for give the same encoder
    pad = torch.ones(3, 10)
    pad[1, 7:] = 0
    as_pattern = pad.bool()[:, None, :].expand(3, 10, 10)
    torch.testing.assert_close(
        enc(ids, attention_mask=as_pattern).hidden_states[pad.bool()],
        enc(ids, attention_mask=pad).hidden_states[pad.bool()],
        atol=1e-6,
        rtol=1e-6,
    )
    # a head that may see everything and heads that are causal differ from all-causal
    mixed = per_head.clone()
    mixed[:, 0] = True
    assert not torch.allclose(enc(ids, attention_mask=mixed).hidden_states[:, :6], out[:, :6], atol=1e-4)
    with pytest.raises(ValueError, match=r"heads 1 or 4"):
        enc(ids, attention_mask=torch.ones(3, 2, 10, 10, dtype=torch.bool))


@pytest.mark.parametrize("shape", ["padding", "example", "head"])
def test_cpu_attention_fast_path_is_the_attention_math_for_every_mask_shape(monkeypatch, shape):
    import pretrainlab.model.encoder as attention_module

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 7, 8), torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8)
    full = torch.rand(2, 4, 7, 9) > 0.4
    full[..., 0] = True  # every query row sees a key
    mask = {"padding": full[:, :1, :1], "example": full[:, :1], "head": full}[shape]
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    monkeypatch.setattr(attention_module, "dropout", lambda x, p, training=True: x)
    torch.testing.assert_close(attention_module.attention(q, k, v, mask, 0.1), reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pre_ln", [False, True])
def test_the_query_stream_is_one_layer_of_the_encoder_by_hand(pre_ln):
    """A one-layer encoder: the query rows are the layer's own arithmetic on g with keys and values
    from the content stream, under their mask; the content stream is as without them."""
    import torch.nn.functional as F

    enc = _patterned(pre_ln, heads=2, layers=1)
    layer = enc.layers[0]
    ids = torch.randint(5, 60, (2, 6))
    g = torch.randn(2, 3, 32)
    seen = torch.rand(2, 3, 6) > 0.5
    seen[..., 0] = True
    out = enc(ids, queries=g, query_mask=seen)
    x = enc.embeddings(ids)
    a = layer.attention
    normed_x, normed_g = (layer.attention_norm(x), layer.attention_norm(g)) if pre_ln else (x, g)
    w, b = a.qkv.weight, a.qkv.bias
    q = F.linear(normed_g, w[:32], b[:32]).view(2, 3, 2, 16).transpose(1, 2)
    k = F.linear(normed_x, w[32:64], b[32:64]).view(2, 6, 2, 16).transpose(1, 2)
    v = F.linear(normed_x, w[64:], b[64:]).view(2, 6, 2, 16).transpose(1, 2)
    scores = (q @ k.transpose(-1, -2) / 4.0).masked_fill(~seen[:, None], float("-inf"))
    y = a.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 3, 32))
    if pre_ln:
        h = g + y
        h = h + layer.ffn(layer.ffn_norm(h))
        h = enc.final_norm(h)
    else:
        h = layer.attention_norm(g + y)
        h = layer.ffn_norm(h + layer.ffn(h))
    torch.testing.assert_close(out.queries, h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.hidden_states, enc(ids).hidden_states, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("train", [False, True])
def test_two_stream_attention_with_permutation_masks_never_lets_a_target_see_itself(train):
    """XLNet's masks (objectives.permutation) through the encoder: a target's query row depends on no
    token at or after its own place in the order, its own above all; a content row on none after its
    place. In training too (the CPU fast path), with dropout drawn alike for both inputs."""
    from pretrainlab.objectives.permutation import factorisation_order, two_stream_masks

    enc = _patterned(layers=3, dropout=0.1 if train else 0.0).train(train)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 60, (4, 12), generator=gen)
    pad = torch.ones(4, 12, dtype=torch.long)
    pad[2, 9:] = 0
    order = factorisation_order(pad.bool(), 0.5, gen)
    content, query = two_stream_masks(order, pad)
    targets = [(i, j) for i in range(4) for j in range(12) if order[i, j] >= 0]
    g = torch.randn(4, 12, 32)  # a query row per position; those of the context are not read

    def run(x):
        torch.manual_seed(5)
        return enc(x, attention_mask=content, queries=g, query_mask=query)

    out = run(ids)
    for i, j in targets[:6]:
        changed = ids.clone()
        later = order[i] >= order[i, j]  # its own place and every later one
        changed[i, later] = (changed[i, later] + 11) % 55 + 5
        again = run(changed)
        torch.testing.assert_close(again.queries[i, j], out.queries[i, j], atol=1e-5, rtol=1e-5)
        seen = order[i] < order[i, j]
        torch.testing.assert_close(again.hidden_states[i, seen], out.hidden_states[i, seen], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(again.hidden_states[i, j], out.hidden_states[i, j], atol=1e-4)  # content sees itself


def test_rows_and_queries_together_give_the_rows_of_the_full_forward():
    enc = _patterned(layers=2)
    ids = torch.randint(5, 60, (2, 8))
    causal = torch.ones(8, 8, dtype=torch.bool).tril().expand(2, 8, 8)
    g, seen = torch.randn(2, 3, 32), torch.ones(2, 3, 8, dtype=torch.bool).tril(diagonal=2)
    full = enc(ids, attention_mask=causal, queries=g, query_mask=seen)
    rows = torch.tensor([[7, 2], [0, 5]])
    part = enc(ids, attention_mask=causal, rows=rows, queries=g, query_mask=seen)
    torch.testing.assert_close(part.hidden_states, full.hidden_states.gather(1, rows[:, :, None].expand(-1, -1, 32)))
    torch.testing.assert_close(part.queries, full.queries)
    torch.testing.assert_close(part.pooled, full.pooled)
    with pytest.raises(ValueError, match="query_mask"):
        enc(ids, queries=g)

"""The vocabulary-sliced cross-entropy against the plain computation it replaces."""

import pytest
import torch
import torch.nn.functional as F

from pretrainlab.model.vocab_loss import linear_cross_entropy, plain_cross_entropy


def problem(n=300, d=24, vocab=1000, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(vocab, d, generator=g) * 0.3).requires_grad_()
    b = (torch.randn(vocab, generator=g) * 0.5).requires_grad_() if bias else None
    labels = torch.randint(0, vocab, (n,), generator=g)
    h = torch.randn(n, d, generator=g)
    h[: n // 2] += 6.0 * w.detach()[labels[: n // 2]]  # half the rows point at their label: accuracy is not 0
    return h.requires_grad_(), w, b, labels


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("slice_size", [128, 333, 4096])  # several slices, a ragged last one, a single one
def test_loss_accuracy_and_gradients_equal_the_plain_computation(bias, slice_size):
    h, w, b, labels = problem(bias=bias)
    logits = F.linear(h, w, b)
    ref_loss = F.cross_entropy(logits, labels)
    ref_acc = (logits.argmax(-1) == labels).float().mean()
    ref_grads = torch.autograd.grad(ref_loss * 3.0, [t for t in (h, w, b) if t is not None])

    loss, acc = linear_cross_entropy(h, w, b, labels, slice_size=slice_size)
    grads = torch.autograd.grad(loss * 3.0, [t for t in (h, w, b) if t is not None])
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert 0.2 < float(ref_acc) < 0.8 and float(acc) == float(ref_acc)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_large_logits_stay_finite():
    h, w, b, labels = problem(n=50)
    h = (h.detach() * 200).requires_grad_()  # logits in the thousands: a naive exp overflows
    loss, _ = linear_cross_entropy(h, w, b, labels, slice_size=128)
    torch.testing.assert_close(loss, F.cross_entropy(F.linear(h, w, b), labels), rtol=1e-5, atol=1e-3)
    loss.backward()
    assert torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all()


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_samples_follow_the_tempered_softmax_across_slices(temperature):
    probs = torch.tensor([0.3, 0.2, 0.15, 0.1, 0.08, 0.06, 0.05, 0.03, 0.02, 0.01])
    n = 40_000  # frequencies have a standard error below 0.0025
    h = probs.log().expand(n, 10).contiguous()
    w, labels = torch.eye(10), torch.zeros(n, dtype=torch.long)
    uniform = torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    _, _, samples = linear_cross_entropy(
        h, w, None, labels, temperature, uniform, slice_size=3
    )  # slices of 3, 3, 3 and 1 words
    tempered = probs ** (1 / temperature)
    freq = torch.bincount(samples, minlength=10).float() / n
    torch.testing.assert_close(freq, tempered / tempered.sum(), atol=0.01, rtol=0)
    again = linear_cross_entropy(h, w, None, labels, temperature, uniform.clone(), slice_size=3)[2]
    assert torch.equal(samples, again)  # the uniforms alone decide the draws
    _, _, plain = plain_cross_entropy(h, w, None, labels, temperature=temperature, uniform=uniform)
    assert (plain == samples).float().mean() > 0.999  # the full-logits path draws the same words


def test_under_bf16_autocast_the_loss_is_close_and_gradients_keep_their_dtype():
    h, w, b, labels = problem()
    ref = F.cross_entropy(F.linear(h, w, b), labels)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = linear_cross_entropy(h, w, b, labels, slice_size=128)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=0.02, atol=0.02)
    loss.backward()
    assert h.grad.dtype == w.grad.dtype == b.grad.dtype == torch.float32
    assert torch.isfinite(w.grad).all()


def test_shapes_are_checked():
    with pytest.raises(ValueError, match=r"hidden \(n, d\) and weight \(vocab, d\)"):
        linear_cross_entropy(torch.zeros(3, 4), torch.zeros(10, 5), None, torch.zeros(3, dtype=torch.long))


def test_the_plain_path_ignores_empty_slots_and_matches_the_sliced_one():
    """The GPU / torch.compile path (full logits, ignore_index) gives the sliced CPU path's loss,
    accuracy and gradients over the scored rows; empty slots count nowhere."""
    h, w, b, labels = problem()
    labels = labels.clone()
    labels[::5] = -100  # empty slots
    keep = labels != -100
    ref_loss, ref_acc = linear_cross_entropy(h[keep], w, b, labels[keep], slice_size=128)
    ref_grads = torch.autograd.grad(ref_loss, (h, w, b))
    loss, acc = plain_cross_entropy(h, w, b, labels)
    grads = torch.autograd.grad(loss, (h, w, b))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(acc, ref_acc)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
    assert not grads[0][~keep].any()  # nothing flows into an empty slot

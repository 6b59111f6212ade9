"""Cross-entropy over the vocabulary, computed a slice of the vocabulary at a time.

A masked-LM head ends in ``logits = hidden @ word_embeddings.T + bias`` followed by a softmax
cross-entropy. Written plainly, each step allocates several (rows x vocab) tensors (logits,
log-probabilities, their gradients): 74 MB each for 600 masked tokens and a 30k vocabulary.
Allocations that large are fresh memory every time (page faults on first touch), and a
(600 x 256) @ (256 x 30k) product streams a 74 MB result through the caches; on a CPU that costs
as much as the matmuls themselves.

``linear_cross_entropy`` computes the same loss and gradients over slices of the vocabulary:

    forward   per slice: logits = h @ W_s.T + b_s -> the label's logit where it falls in the
              slice, running max and running sum of exp (online softmax); the slice is kept as
              exp(logits - running max)
    backward  per slice: softmax = kept slice * exp(running max - logsumexp), then
              dh += softmax @ W_s, dW_s = softmax.T @ h, db_s = softmax.sum(0); the target term
              (-logit of the label) is added once, by index, for all rows

Each slice is a few MB, so it stays in cache between the matmul and the softmax and its memory is
reused from step to step. It also returns the accuracy (the label's logit is the largest), and can
draw one sample per row from softmax(logits / T) (ELECTRA's generator) by inverse CDF over the
kept slices, at one given uniform per row instead of a Gumbel variable per logit.

This is the CPU path. On a GPU, and under ``torch.compile``, ``plain_cross_entropy`` computes the
same from the full logits of the rows: no host synchronisation, no Python loop, and kernels the
compiler can fuse. Under autocast the
matmuls run in the autocast dtype, the softmax in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _slice_size(device: torch.device) -> int:
    # CPU: slices that stay in cache and under glibc's reuse threshold; GPU: few kernel launches
    return 2048 if device.type == "cpu" else 16384


def _sample(kept, maxes, masses, final_max, temperature, uniform, slice_size) -> torch.Tensor:
    """One draw per row from softmax(logits / T) by inverse CDF, from the kept slices
    exp(logits - max_j): first the slice (by its mass), then the word within it, one uniform per row."""
    n, device = final_max.shape[0], final_max.device
    # slice masses on a common scale: sum exp((logits - final max) / T)
    weights = torch.stack(masses, 1).double() * torch.exp(
        (torch.stack(maxes, 1).double() - final_max.double()[:, None]) / temperature
    )
    cdf = weights.cumsum(1)
    point = uniform.to(device, torch.float64) * cdf[:, -1]
    chosen = torch.searchsorted(cdf, point[:, None], right=True).squeeze(1).clamp_(max=len(kept) - 1)
    below = torch.where(chosen > 0, cdf.gather(1, (chosen - 1).clamp(min=0)[:, None]).squeeze(1), 0.0)
    within = ((point - below) / weights.gather(1, chosen[:, None]).squeeze(1)).clamp_(0.0, 1.0)
    samples = torch.empty(n, dtype=torch.long, device=device)
    for j, slice_ in enumerate(kept):
        rows = (chosen == j).nonzero().squeeze(1)
        if rows.numel() == 0:
            continue
        p = slice_[rows] if temperature == 1.0 else slice_[rows].pow(1.0 / temperature)
        c = p.double().cumsum(1)
        idx = torch.searchsorted(c, (within[rows] * c[:, -1])[:, None], right=True).squeeze(1)
        samples[rows] = idx.clamp_(max=p.shape[1] - 1) + j * slice_size
    return samples


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, uniform, slice_size):
        device = hidden.device.type
        mm_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        with torch.autocast(device, enabled=False):
            h, w = hidden.to(mm_dtype), weight.to(mm_dtype)
            b = bias.to(mm_dtype) if bias is not None else None
            n, vocab = h.shape[0], w.shape[0]
            f32 = dict(dtype=torch.float32, device=hidden.device)
            run_max = torch.full((n,), float("-inf"), **f32)
            sum_exp = torch.zeros(n, **f32)
            target = torch.empty(n, **f32)
            # the rows whose label falls in each slice, to read the label's logit there
            slice_of = torch.div(labels, slice_size, rounding_mode="floor")
            order = slice_of.argsort()
            counts = torch.bincount(slice_of, minlength=-(-vocab // slice_size)).tolist()
            rows_of = order.split(counts)
            kept, maxes, masses = [], [], []
            for i, start in enumerate(range(0, vocab, slice_size)):
                stop = min(start + slice_size, vocab)
                z = (h @ w[start:stop].t()).float()
                if b is not None:  # added in place: addmm would first copy the broadcast bias out
                    z.add_(b[start:stop])
                rows = rows_of[i]
                target[rows] = z[rows, labels[rows] - start]
                new_max = torch.maximum(run_max, z.amax(-1))
                z.sub_(new_max[:, None]).exp_()
                mass = z.sum(-1)
                sum_exp = sum_exp * torch.exp(run_max - new_max) + mass
                run_max = new_max
                kept.append(z)
                maxes.append(new_max)
                if temperature is not None:  # the slice's share of softmax(logits / T), up to a row factor
                    masses.append(mass if temperature == 1.0 else z.pow(1.0 / temperature).sum(-1))
            lse = run_max + sum_exp.log()
            loss = (lse - target).mean()
            accuracy = (target >= run_max).float().mean()  # the label's logit is the largest
            if temperature is not None:
                samples = _sample(kept, maxes, masses, run_max, temperature, uniform, slice_size)
        ctx.save_for_backward(h, w, labels, lse)
        ctx.kept, ctx.maxes, ctx.slice_size = kept, maxes, slice_size
        ctx.has_bias, ctx.in_dtypes = b is not None, (hidden.dtype, weight.dtype)
        if temperature is None:
            ctx.mark_non_differentiable(accuracy)
            return loss, accuracy
        ctx.mark_non_differentiable(accuracy, samples)
        return loss, accuracy, samples

    @staticmethod
    def backward(ctx, grad_loss, *_):
        h, w, labels, lse = ctx.saved_tensors
        n = h.shape[0]
        scale = grad_loss.float() / n
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros(h.shape, dtype=torch.float32, device=h.device) if need_h else None
        grad_w = torch.empty(w.shape, dtype=torch.float32, device=w.device) if need_w else None
        grad_b = torch.empty(w.shape[0], dtype=torch.float32, device=w.device) if need_b and ctx.has_bias else None
        with torch.autocast(h.device.type, enabled=False):
            for i, (p, m) in enumerate(zip(ctx.kept, ctx.maxes)):
                start = i * ctx.slice_size
                stop = start + p.shape[1]
                p.mul_((torch.exp(m - lse) * scale)[:, None])  # d loss / d logits, without the target term
                pm = p.to(h.dtype)
                if grad_h is not None:
                    grad_h += pm @ w[start:stop]
                if grad_w is not None:
                    if pm.dtype == grad_w.dtype:
                        torch.mm(pm.t(), h, out=grad_w[start:stop])  # contiguous rows: written in place
                    else:
                        grad_w[start:stop] = pm.t() @ h
                if grad_b is not None:
                    grad_b[start:stop] = p.sum(0)
            ctx.kept = ctx.maxes = None
            # the target term: d(-logit[label]) / d logits is -1 at the label
            minus = (-scale).expand(n)
            if grad_h is not None:
                grad_h += w[labels].float() * minus[:, None]
            if grad_w is not None:
                grad_w.index_add_(0, labels, h.float() * minus[:, None])
            if grad_b is not None:
                grad_b.index_add_(0, labels, minus)
        in_h, in_w = ctx.in_dtypes
        return (
            grad_h.to(in_h) if grad_h is not None else None,
            grad_w.to(in_w) if grad_w is not None else None,
            grad_b.to(in_w) if grad_b is not None else None,
            None,
            None,
            None,
            None,
        )


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    temperature: float | None = None,
    uniform: torch.Tensor | None = None,
    slice_size: int | None = None,
):
    """Mean cross-entropy of ``hidden @ weight.T + bias`` against ``labels``, and the accuracy of
    its argmax, without materialising the (rows x vocab) logits at once.

    hidden (n, d), weight (vocab, d), bias (vocab,) or None, labels (n,) in [0, vocab).
    Returns ``(loss, accuracy)``; with ``temperature``, ``(loss, accuracy, samples)`` where
    ``samples`` (n,) holds one draw per row from softmax(logits / temperature), by inverse CDF at
    ``uniform`` (n,) values in [0, 1). Gradients flow to hidden, weight and bias, as with
    ``F.cross_entropy``.
    """
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"expected hidden (n, d) and weight (vocab, d), got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    size = slice_size or _slice_size(hidden.device)
    return _LinearCrossEntropy.apply(hidden, weight, bias, labels, temperature, uniform, size)


def plain_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    ignore_index: int = -100,
    temperature: float | None = None,
    uniform: torch.Tensor | None = None,
):
    """As :func:`linear_cross_entropy`, from the full (rows x vocab) logits; rows labelled
    ``ignore_index`` count nowhere (their sample is ``ignore_index``). Every shape is the input's,
    nothing waits for the device: the path for GPUs and for ``torch.compile``."""
    logits = F.linear(hidden, weight, bias).float()
    valid = labels != ignore_index
    # the mean over the scored rows, and 0 (no gradient) for a batch with none, where the mean is 0/0
    loss = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum") / valid.sum().clamp(min=1)
    accuracy = ((logits.detach().argmax(-1) == labels) & valid).sum() / valid.sum().clamp(min=1)
    if temperature is None:
        return loss, accuracy
    if uniform is None:
        raise ValueError("sampling (temperature set) needs one uniform value per row: pass uniform=")
    samples = torch.where(valid, sample(logits, temperature, uniform), ignore_index)
    return loss, accuracy, samples


@torch.no_grad()
def sample(logits: torch.Tensor, temperature: float, uniform: torch.Tensor) -> torch.Tensor:
    """One draw per row of ``logits`` (n, vocab) from softmax(logits / temperature), by inverse CDF
    at ``uniform`` (n,) values in [0, 1)."""
    probs = torch.softmax(logits.detach() / temperature, dim=-1)
    cdf = probs.cumsum(-1)
    point = uniform.to(cdf.dtype)[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, point, right=True).squeeze(1).clamp_(max=cdf.shape[1] - 1)


__all__ = ["linear_cross_entropy", "plain_cross_entropy", "sample"]

"""Several encoders of one shape as one batched model: horizontal fusion of small runs.

Small encoders leave a GPU mostly idle: a ``model=mini`` step is a few hundred kernels, each too small
to fill the device. Runs whose encoders share one config can instead train as one model whose
parameters carry a leading run dimension, (runs, ...), on their batches folded into one, run-major
(run ``m``'s examples are rows ``m * batch : (m + 1) * batch``):

    StackedLinear     every run's linear layer as one batched matmul (``torch.baddbmm``)
    StackedLayerNorm  one normalisation, then each run's scale and shift
    StackedEmbeddings one lookup in the runs' tables side by side
    StackedEncoder    the encoder with those modules in place of its own; attention has no weights and
                      runs on the folded batch as it is, so ``Encoder.forward`` (masks, masked rows,
                      pooler) serves the group unchanged
    MemberView        what one run's loss reads of the group: its word embeddings (a tied head), its config

Each run keeps its own objective (collator, heads, losses): :meth:`StackedEncoder.forward` takes every
run's :class:`~pretrainlab.model.encoder.EncoderCall` and gives back every run's ``EncoderOutput``. The
gradient of the runs' summed losses is, in run ``m``'s slice of every parameter, run ``m``'s own
gradient: nothing mixes runs but the batching of their arithmetic (HFTA, Wang et al., MLSys 2021).

Calls that differ are made alike first: padding masks and attention patterns become one pattern per
example; rows (a masked LM's scored positions) are kept when every run asks for rows of one width,
otherwise the last layer computes every row and each run's are picked out (the same numbers, more
arithmetic in that layer). Token types left out are type 0, as the encoder reads them.
"""

from __future__ import annotations

import copy
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from pretrainlab.config import ConfigError
from pretrainlab.model.encoder import (
    Dropout,
    Embeddings,
    Encoder,
    EncoderCall,
    EncoderConfig,
    EncoderOutput,
    attention_pattern,
    gather_rows,
)


def _stack(tensors: list[torch.Tensor]) -> nn.Parameter:
    return nn.Parameter(torch.stack([t.detach() for t in tensors]))


class StackedLinear(nn.Module):
    """``runs`` linear layers of one shape: weight (runs, out, in), bias (runs, out). Input and output
    are folded run-major: (runs x n, ..., features)."""

    def __init__(self, layers: list[nn.Linear]):
        super().__init__()
        self.weight = _stack([layer.weight for layer in layers])
        self.bias = _stack([layer.bias for layer in layers])

    def _apply_to(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        runs = weight.shape[0]
        flat = x.reshape(runs, -1, x.shape[-1])
        y = torch.baddbmm(bias[:, None, :], flat, weight.transpose(1, 2))
        return y.view(*x.shape[:-1], weight.shape[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._apply_to(x, self.weight, self.bias)

    def part(self, x: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Outputs ``start:end`` (``encoder.linear_part``)."""
        return self._apply_to(x, self.weight[:, start:end], self.bias[:, start:end])


class StackedLayerNorm(nn.Module):
    """``runs`` LayerNorms of one width: one normalisation, then each run's scale and shift."""

    def __init__(self, norms: list[nn.LayerNorm]):
        super().__init__()
        self.weight = _stack([n.weight for n in norms])
        self.bias = _stack([n.bias for n in norms])
        self.eps = norms[0].eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        runs, width = self.weight.shape
        y = F.layer_norm(x, (width,), None, None, self.eps)
        shape = (runs, -1) + (1,) * (x.dim() - 2) + (width,)
        return (y.view(runs, -1, *x.shape[1:]) * self.weight.view(shape) + self.bias.view(shape)).view(y.shape)


class StackedEmbeddings(nn.Module):
    """``runs`` embedding modules (``encoder.Embeddings``) of one shape: word, position and segment
    tables (runs, entries, width), then each run's LayerNorm and the dropout."""

    def __init__(self, embeddings: list[Embeddings]):
        super().__init__()
        self.word = _stack([e.word_embeddings.weight for e in embeddings])
        self.position = _stack([e.position_embeddings.weight for e in embeddings])
        self.token_type = _stack([e.token_type_embeddings.weight for e in embeddings])
        self.norm = StackedLayerNorm([e.norm for e in embeddings])
        self.dropout = Dropout(embeddings[0].dropout.p)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        runs = self.word.shape[0]
        b, t = input_ids.shape
        run = torch.arange(runs, device=input_ids.device).repeat_interleave(b // runs)[:, None]  # (runs x batch, 1)
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        x = self.word[run, input_ids] + self.token_type[run, types]
        x = (x.view(runs, b // runs, t, -1) + self.position[:, None, :t]).view(b, t, -1)
        return self.dropout(self.norm(x))


def _replace(module: nn.Module, members: list[nn.Module]) -> None:
    """Replace, in ``module`` (a copy of ``members[0]``'s structure), every Linear and LayerNorm by its
    stacked form over the same submodule of every member."""
    for name, child in list(module.named_children()):
        peers = [getattr(m, name) for m in members]
        if isinstance(child, nn.Linear):
            setattr(module, name, StackedLinear(peers))
        elif isinstance(child, nn.LayerNorm):
            setattr(module, name, StackedLayerNorm(peers))
        elif child is not None and not isinstance(child, Dropout):
            _replace(child, peers)


def check_stackable(encoders: list[Encoder]) -> EncoderConfig:
    """The group's encoder config: every encoder's, which must be one (else a ConfigError naming the
    first field that differs)."""
    if not encoders:
        raise ValueError("a stacked encoder needs at least one encoder")
    first = encoders[0].config
    for other in encoders[1:]:
        for field, value in first.to_dict().items():
            theirs = other.config.to_dict()[field]
            if theirs != value:
                raise ConfigError(
                    f"runs of different encoder shapes cannot be fused: model.{field} is {value!r} in one and "
                    f"{theirs!r} in another. Fuse runs of one model config only (their objectives may differ)."
                )
    if first.share_layers:
        raise ConfigError("encoders with shared layers (model.share_layers=true, ALBERT's) cannot be fused")
    if any(e.embeddings is None for e in encoders):
        raise ConfigError("an encoder that borrows its embeddings (ELECTRA's generator) cannot be fused")
    return first


class StackedEncoder(nn.Module):
    """The encoders of several runs (one config) as one module: see the module docstring.

    Built from the runs' encoders (their weights copied in, run ``m`` at index ``m``); ``member(m)``
    gives run ``m``'s weights back as a plain :class:`Encoder` state dict."""

    def __init__(self, encoders: list[Encoder]):
        super().__init__()
        self.config = check_stackable(encoders)
        self.runs = len(encoders)
        template = Encoder.__new__(Encoder)
        nn.Module.__init__(template)
        template.config = self.config
        first = encoders[0]
        stacked: Any = template  # its modules, each given its stacked form (another type than Encoder declares)
        stacked.embeddings = StackedEmbeddings([cast(Embeddings, e.embeddings) for e in encoders])
        stacked.embedding_projection = (
            None if first.embedding_projection is None else StackedLinear([e.embedding_projection for e in encoders])  # type: ignore[misc]
        )
        layers = []
        for i in range(self.config.num_layers):
            layer = copy.deepcopy(first.layers[i]).to("meta")
            _replace(layer, [e.layers[i] for e in encoders])
            layers.append(layer)
        stacked.layers = nn.ModuleList(layers)
        stacked.final_norm = None if first.final_norm is None else StackedLayerNorm([e.final_norm for e in encoders])  # type: ignore[misc]
        stacked.pooler = None if first.pooler is None else StackedLinear([e.pooler for e in encoders])  # type: ignore[misc]
        self.encoder = template
        # which runs train each parameter (a pooler is frozen in runs whose objective does not use it)
        self.trained = {
            name: torch.tensor([dict(e.named_parameters())[_plain_name(name)].requires_grad for e in encoders])
            for name, _ in self.encoder.named_parameters()
        }

    def forward(self, calls: list[EncoderCall]) -> list[EncoderOutput]:
        """Every run's encoder call (one per run, in order) made at once; every run's output."""
        if len(calls) != self.runs:
            raise ValueError(f"{len(calls)} encoder calls for {self.runs} runs")
        b, t = calls[0].input_ids.shape
        for call in calls:
            if call.input_ids.shape != (b, t):
                raise ValueError(
                    f"fused runs need batches of one shape: {tuple(call.input_ids.shape)} beside {(b, t)} "
                    f"(fused runs pad every batch to max_seq_len: static shapes)"
                )
        ids = torch.cat([c.input_ids for c in calls])
        types = (
            None
            if all(c.token_type_ids is None for c in calls)
            else torch.cat(
                [torch.zeros_like(c.input_ids) if c.token_type_ids is None else c.token_type_ids for c in calls]
            )
        )
        masks = [attention_pattern(c.attention_mask, self.config.num_heads) for c in calls]
        mask = None
        if any(m is not None for m in masks):
            full = [torch.ones(b, 1, 1, t, dtype=torch.bool, device=ids.device) if m is None else m for m in masks]
            rows_q = max(m.shape[2] for m in full)
            heads = max(m.shape[1] for m in full)
            mask = torch.cat([m.expand(b, heads, rows_q, t) for m in full])
        widths = {None if c.rows is None else c.rows.shape[1] for c in calls}
        shared_rows = len(widths) == 1 and None not in widths
        rows = torch.cat([c.rows for c in calls]) if shared_rows else None  # type: ignore[misc]
        out = Encoder.forward(self.encoder, ids, types, mask, rows=rows)
        hidden = out.hidden_states.view(self.runs, b, *out.hidden_states.shape[1:])
        pooled = None if out.pooled is None else out.pooled.view(self.runs, b, -1)
        outputs = []
        for m, call in enumerate(calls):
            h = hidden[m]
            if call.rows is not None and not shared_rows:
                h = gather_rows(h, call.rows)
            outputs.append(EncoderOutput(h, None if pooled is None else pooled[m]))
        return outputs

    def member_state(self, m: int) -> dict[str, torch.Tensor]:
        """Run ``m``'s weights, named as a plain :class:`Encoder`'s state dict."""
        return {_plain_name(name): p[m].detach() for name, p in self.encoder.named_parameters()}

    def member(self, m: int) -> MemberView:
        return MemberView(self, m)


_PLAIN = {
    "embeddings.word": "embeddings.word_embeddings.weight",
    "embeddings.position": "embeddings.position_embeddings.weight",
    "embeddings.token_type": "embeddings.token_type_embeddings.weight",
}


def _plain_name(name: str) -> str:
    """A stacked parameter's name as the plain encoder names it."""
    return _PLAIN.get(name, name)


class _Table:
    def __init__(self, weight: torch.Tensor):
        self.weight = weight


class MemberView:
    """What one run's loss reads of the group (``Objective.loss_of``): its word embeddings (a tied
    head's decoder) and the encoder's config. Its slice of the stacked table: gradients reach it there."""

    def __init__(self, stacked: StackedEncoder, m: int):
        self.config = stacked.config
        assert isinstance(stacked.encoder.embeddings, StackedEmbeddings)
        self.word_embeddings = _Table(stacked.encoder.embeddings.word[m])


__all__ = [
    "MemberView",
    "StackedEmbeddings",
    "StackedEncoder",
    "StackedLayerNorm",
    "StackedLinear",
    "check_stackable",
]

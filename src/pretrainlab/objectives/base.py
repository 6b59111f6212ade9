"""The objective plugin contract.

An objective owns what is specific to it: how examples are built from documents, how batches are
corrupted (in the collator, with an explicit generator), its heads and losses, its metric names,
its cost per token, and how its heads look in the Hugging Face format. It never owns the encoder:
``forward`` receives it, so the encoder's weights live once, in the LightningModule, and the
exported encoder needs no objective code.

Adding an objective = one module here + one ``conf/objective/<name>.yaml`` whose ``_target_``
names the class. The YAML is the registry; there is no name -> class table. Masked-LM objectives
extend :class:`~pretrainlab.objectives.masked_lm.MaskedLM`, which brings the masking, the tied MLM
head, its loss, FLOPs and export.

    class MyObjective(Objective):
        def example_builder(self, max_seq_len) -> ExampleBuilder          # documents -> examples
        def collator(self, length=None) -> Collator                       # picklable, no weights
        def forward(self, encoder, batch) -> ObjectiveOutput              # loss + detached metrics
          # or, when the loss needs one encoder forward: the two halves of it (runs of such
          # objectives can be trained fused, pretraining.fused)
        def encoder_call(self, batch) -> EncoderCall                       # the encoder forward it needs
        def loss_of(self, encoder, batch, out) -> ObjectiveOutput          # the loss from that forward's output
        def flops_per_token(self, encoder_config, seq_len) -> float       # for compute-matched runs
        def sentence_scores(self, encoder, sequences) -> np.ndarray        # zero-shot log-likelihoods
        def tally(self, encoder, batch) -> Tally                          # held-out counts per head
        def learning(self, tally) -> (metrics, [HeadCheck])               # each head vs its trivial baseline
        @classmethod
        def hf_head(cls, state, arch) -> tuple[str, dict] | None          # its head for transformers

An objective whose batches change over the run (a masking rate that moves, a phase of causal
examples before masked ones) says ``scheduled``; its collator then has ``at(progress)``, the
collator of that point of the run (0 to 1, the optimizer step over the steps the budget plans), and
``settings_at(progress)`` puts its own settings there, so that ``flops_at`` (the FLOPs per token of
a step there) and ``mean_flops_per_token`` (over the run) follow the schedule.

A batch (what the collator returns and ``forward`` receives) is a dict of tensors. Every batch has
the keys of :data:`BATCH_KEYS`, which the training loop relies on; the rest are the objective's own
(``token_type_ids``, ``labels``, ``mlm_positions``, ``mlm_labels``, ...). Collators take a fixed
``length`` (``collator(length)``): then every batch has the same shapes, as CUDA graphs need.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np
import torch
from torch import nn

from pretrainlab.config import ConfigError
from pretrainlab.data.examples import Example, ExampleBuilder
from pretrainlab.model.encoder import Encoder, EncoderCall, EncoderConfig, EncoderOutput, flops_per_token
from pretrainlab.objectives.learning import HeadCheck, Tally
from pretrainlab.tokens import SpecialTokens

Batch = dict[str, torch.Tensor]

BATCH_KEYS = {
    "input_ids": "(batch, seq) int64 token ids, right-padded",
    "attention_mask": "(batch, seq) bool, True for real tokens",
    "n_tokens": "scalar: the real (non-padding) tokens of the batch, counted for budgets and throughput",
}


@dataclass
class ObjectiveOutput:
    """``loss`` drives the optimiser; ``metrics`` (detached scalars) are logged as ``stage/name``."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


class Collator(Protocol):
    """Turns a list of examples into a batch; all randomness comes from ``generator``."""

    def __call__(self, examples: list[Example], generator: torch.Generator) -> Batch: ...


class ScheduledCollator(Collator, Protocol):
    """The collator of a ``scheduled`` objective: ``at(progress)`` is the collator at that point of
    the run (0 to 1)."""

    def at(self, progress: float) -> Collator: ...


class Objective(nn.Module):
    """Base class of objective plugins. Subclasses call ``super().__init__(encoder_config, tokens, name)``.

    ``uses_pooler``: whether the loss goes through the encoder's pooled [CLS] output. When it does
    not, the pooler is frozen during pretraining (DDP requires every trained parameter to get a
    gradient) and fine-tuning trains it from its initialisation.

    ``hf_model_type``: the transformers model family its exported encoder must be (ELECTRA's
    discriminator: ``electra``); None lets the encoder's shape decide (BERT or ALBERT).

    ``hf_head_class``: whether ``transformers`` has a class for its pretraining head on this encoder
    (``hf_head`` maps it). An objective whose head has none (XLNet's query stream) says False: its
    encoder still exports, as the bare model.
    """

    uses_pooler: ClassVar[bool] = False
    hf_model_type: ClassVar[str | None] = None
    hf_head_class: ClassVar[bool] = True

    def __init__(self, encoder_config: EncoderConfig, tokens: SpecialTokens, name: str):
        super().__init__()
        self.encoder_config = encoder_config
        self.tokens = tokens
        self.name = name

    def example_builder(self, max_seq_len: int) -> ExampleBuilder:
        raise NotImplementedError

    def targets_per_sequence(self, max_seq_len: int) -> dict[str, float]:
        """The prediction targets a full sequence of ``max_seq_len`` tokens holds on average, by the
        setting that decides it (``{"objective.mask_rate=0.15": 19.2}``); {} for an objective that
        predicts every token. A setting that leaves too few is refused before training
        (:func:`check_targets`): most batches would hold nothing to predict."""
        return {}

    def collator(self, length: int | None = None) -> Collator:
        """The batch maker. ``length``: pad every batch to it (static shapes), else to its longest."""
        raise NotImplementedError

    def encoder_call(self, batch: Batch) -> EncoderCall | None:
        """The one encoder forward the loss on ``batch`` needs, named before the encoder runs; the loss
        is then :meth:`loss_of` its output. None (the default) for an objective whose loss needs more
        (ELECTRA: the generator's forward, then the discriminator's on its samples; XLNet: a query
        stream built from the embeddings), which implements ``forward`` itself. Runs of objectives
        that name their call can be trained fused, several runs of one encoder shape as one batched
        model (``pretraining.fused``): every call is then made at once."""
        return None

    def loss_of(self, encoder: Encoder, batch: Batch, out: EncoderOutput) -> ObjectiveOutput:
        """The loss and metrics from ``out``, the output of :meth:`encoder_call`'s forward. Reads
        nothing of ``encoder`` but ``word_embeddings.weight`` (a tied head) and ``config``: in a fused
        group it is one run's view of the batched model (``model.stacked.MemberView``)."""
        raise NotImplementedError

    def forward(self, encoder: Encoder, batch: Batch) -> ObjectiveOutput:
        call = self.encoder_call(batch)
        if call is None:
            raise NotImplementedError(f"objective {self.name}: implement forward, or encoder_call and loss_of")
        return self.loss_of(encoder, batch, call(encoder))

    def flops_per_token(self, encoder_config: EncoderConfig, seq_len: int) -> float:
        """Training FLOPs (forward + backward) per input token, at the objective's settings as they
        stand. Default: the encoder alone. A function of shapes only, so budgets are known before
        any weight exists."""
        return flops_per_token(encoder_config, seq_len)

    # --- settings that move over the run (see the module docstring) ------------------------------
    @property
    def scheduled(self) -> bool:
        """Whether its batches change over the run. Default: no."""
        return False

    @contextmanager
    def settings_at(self, progress: float) -> Iterator[None]:
        """Within the block, the objective's settings are those at ``progress`` (0 to 1) of the run."""
        yield

    def flops_at(self, encoder_config: EncoderConfig, seq_len: int, progress: float) -> float:
        """Training FLOPs per token of a step at ``progress`` (0 to 1) of the run."""
        with self.settings_at(progress):
            return self.flops_per_token(encoder_config, seq_len)

    def mean_flops_per_token(self, encoder_config: EncoderConfig, seq_len: int, points: int = 1000) -> float:
        """Training FLOPs per token over the whole run: what budgets plan with (the steps of a run
        take the same tokens, so its FLOPs are the steps' mean cost times its tokens)."""
        if not self.scheduled:
            return self.flops_per_token(encoder_config, seq_len)
        return float(np.mean([self.flops_at(encoder_config, seq_len, (i + 0.5) / points) for i in range(points)]))

    def sentence_scores(self, encoder: Encoder, sequences: list[np.ndarray], max_tokens: int = 8192) -> np.ndarray:
        """The zero-shot score of each sequence (``[CLS] ... [SEP]`` token ids), as the objective's
        pretraining defines a likelihood: the higher, the more the pretrained model takes it for
        natural text. Minimal pairs (BLiMP) compare these scores. ``max_tokens``: about how many
        tokens go through the encoder at once. Objectives are expected to run in eval mode, without
        gradients; those that define no likelihood raise NotImplementedError."""
        raise NotImplementedError(
            f"objective {self.name} defines no zero-shot sentence score: implement "
            f"sentence_scores to evaluate it on minimal pairs."
        )

    def tally(self, encoder: Encoder, batch: Batch) -> Tally:
        """What each head gets right on a held-out ``batch``, as sums that add over batches and ranks
        (``pretrainlab.objectives.learning``): counts by the kind of position, summed losses,
        histograms. Called without gradients, in eval mode. Default: nothing (no learning check)."""
        return {}

    def learning(self, tally: dict) -> tuple[dict[str, float], list[HeadCheck]]:
        """The metrics of a summed ``tally`` (its values as numbers and lists, ``learning.to_host``)
        and each head's verdict beside its trivial baseline (``learning.HeadCheck``), against the
        training text's ``token_counts`` where a baseline needs them."""
        return {}, []

    # How often each token occurs in the training examples ((vocab,) counts), for the baselines of
    # ``learning``; set by whoever builds the data (None: a streamed corpus). Not a weight: never saved.
    token_counts: np.ndarray | None = None

    @classmethod
    def hf_head(cls, state: dict[str, torch.Tensor], arch: str) -> tuple[str, dict[str, torch.Tensor]] | None:
        """The pretraining head in the Hugging Face format: (the transformers class that holds it,
        its tensors in that class's names), from a checkpoint's ``state_dict`` (``encoder.*``,
        ``objective.*``), for an encoder exported as ``arch`` (bert, albert, electra). None when
        there is no head to export."""
        return None


MIN_TARGETS = 0.5  # prediction targets a sequence must hold on average (8 tokens at RoBERTa's 15%: 0.9)


def check_targets(objective: Objective, max_seq_len: int) -> None:
    """Refuses settings under which a sequence of ``max_seq_len`` tokens holds less than
    :data:`MIN_TARGETS` prediction targets on average (:meth:`Objective.targets_per_sequence`), naming the setting."""

    for setting, targets in objective.targets_per_sequence(max_seq_len).items():
        if targets < MIN_TARGETS:
            raise ConfigError(
                f"{setting} (objective={objective.name}) leaves {targets:.2f} prediction targets in a sequence of "
                f"max_seq_len={max_seq_len} tokens on average (at least {MIN_TARGETS} are needed): most sequences "
                f"would hold nothing to predict. Predict "
                f"more of each sequence (raise the rate, or lower objective.partial_prediction), or raise max_seq_len."
            )


def loss_weight(name: str, value: float, objective: str) -> float:
    """A weight of one of an objective's losses, checked: a finite number >= 0 (0 turns that loss off;
    a negative weight would make training maximise it)."""
    import math

    try:
        weight = float(value)
    except (TypeError, ValueError):
        weight = math.nan
    if not (math.isfinite(weight) and weight >= 0):
        raise ConfigError(
            f"objective.{name}={value} (objective={objective}): a loss weight must be a finite number >= 0; "
            f"0 turns that loss off, and a negative weight would make training maximise it."
        )
    return weight


def by_length(sequences: list[np.ndarray]) -> dict[int, list[int]]:
    """Indices of ``sequences`` grouped by length: a group stacks without padding."""
    groups: dict[int, list[int]] = {}
    for i, seq in enumerate(sequences):
        groups.setdefault(len(seq), []).append(i)
    return dict(sorted(groups.items()))


def pseudo_log_likelihood(
    sequences: list[np.ndarray],
    special_ids: Iterable[int],
    device: torch.device,
    token_logits: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    max_tokens: int = 8192,
) -> np.ndarray:
    """Each sequence's sum, over its tokens (special tokens excepted), of log p(token | the rest) as
    ``token_logits(copies, positions)`` gives it: the vocabulary logits at ``positions[i]`` of
    ``copies[i]``. One copy of the sequence per scored token (``token_logits`` may change its copies,
    to mask the scored token, say); copies of one length are stacked without padding, about
    ``max_tokens`` tokens at a time."""
    special = torch.tensor(sorted(special_ids), device=device)
    scores = torch.zeros(len(sequences), dtype=torch.float64, device=device)
    for length, members in by_length(sequences).items():
        ids = torch.as_tensor(np.stack([sequences[i] for i in members]), dtype=torch.long, device=device)
        sentence, position = (~torch.isin(ids, special)).nonzero(as_tuple=True)  # one copy per scored token
        step = max(1, max_tokens // length)
        for start in range(0, len(sentence), step):
            s, p = sentence[start : start + step], position[start : start + step]
            copies = ids[s]  # indexing copies: the rows of ids stay as they are
            target = copies[torch.arange(len(p), device=device), p]
            logits = token_logits(copies, p).float()
            logp = torch.log_softmax(logits, dim=-1).gather(1, target[:, None]).squeeze(1)
            scores.index_add_(0, torch.as_tensor(members, device=device)[s], logp.double())
    return scores.cpu().numpy()


def pad_examples(examples: list[Example], pad_id: int, pad_to_multiple_of: int = 8, length: int | None = None) -> Batch:
    """Stack variable-length examples right-padded: ``input_ids``, ``attention_mask``,
    ``n_tokens``, and ``token_type_ids`` / ``labels`` when the examples have them. The width is the
    longest example rounded up to ``pad_to_multiple_of``, or ``length`` (every batch the same
    shape, as CUDA graphs need)."""
    longest = max(len(e["input_ids"]) for e in examples)
    if length is not None and longest > length:
        raise ValueError(f"an example of {longest} tokens does not fit the fixed length {length}")
    width = length or -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    ids = np.full((len(examples), width), pad_id, dtype=np.int64)
    types = np.zeros((len(examples), width), dtype=np.int64)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[i, :n] = e["input_ids"]
        if "token_type_ids" in e:
            types[i, :n] = e["token_type_ids"]
    batch = {"input_ids": torch.from_numpy(ids)}
    batch["attention_mask"] = batch["input_ids"] != pad_id
    if "token_type_ids" in examples[0]:
        batch["token_type_ids"] = torch.from_numpy(types)
    if "label" in examples[0]:
        batch["labels"] = torch.tensor([int(e["label"]) for e in examples], dtype=torch.long)
    batch["n_tokens"] = batch["attention_mask"].sum()
    return batch


__all__ = [
    "BATCH_KEYS",
    "Batch",
    "Collator",
    "Objective",
    "ObjectiveOutput",
    "ScheduledCollator",
    "by_length",
    "pad_examples",
    "pseudo_log_likelihood",
]

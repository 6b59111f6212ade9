"""The transformers peer of each objective, in one table (:data:`PEERS`): the model of our encoder's shape
that ``tools.bench`` times against ours and ``tools.reference`` trains on our run's batches.

    bert     BertForPreTraining          (masked LM + next-sentence prediction)
    albert   AlbertForPreTraining        (masked LM + sentence order; our encoder's shape, unshared layers)
    roberta  RobertaForMaskedLM          (the reference: BertForMaskedLM, RoBERTa's objective on BERT's
                                          architecture, as pretrainlab runs it)
    electra  ElectraForMaskedLM (generator, 1/4 width, sharing the embeddings) + ElectraForPreTraining

An objective without a row here has no peer: the bench says so and skips it, the reference refuses it.
Adding one is a row: its model, the keyword of its pair head's labels, its encoder body and its heads at
the masked positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def same_shape(config, vocab_size: int) -> dict:
    """The arguments of a transformers BERT-family config (``BertConfig``, ``RobertaConfig``, ...) that
    give our encoder config's shape: widths, depth, heads, positions, segments, dropout, LayerNorm eps."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        hidden_dropout_prob=config.hidden_dropout,
        attention_probs_dropout_prob=config.attention_dropout,
        layer_norm_eps=config.layer_norm_eps,
    )


class ElectraPair:
    """ELECTRA's two transformers models: the generator and the discriminator, embeddings shared."""

    def __init__(self, gen, disc):
        import torch

        self.gen, self.disc = gen, disc
        self.module = torch.nn.ModuleList([gen, disc])


@dataclass(frozen=True)
class Peer:
    """An objective's transformers peer. ``build(tf, config, common)``: the model (``tf`` the transformers
    module, ``common`` :func:`same_shape`'s arguments with the attention implementation); ``reference``: the
    reference's model where it is another; ``pair_label``: the keyword its pair head's labels take (None:
    no pair head); ``token_types``: whether it is given segment ids; ``body`` and ``heads``: its encoder's
    attribute and its heads on (hidden states at the masked positions, pooled output), for the reference's
    loss at the masked positions only (None: the reference computes its own, ELECTRA's)."""

    classes: str  # what the bench's report calls it
    build: Callable[[Any, Any, dict], Any]
    pair_label: str | None = None
    token_types: bool = True
    body: str | None = None
    heads: Callable[[Any, Any, Any], tuple] | None = None
    reference: Callable[[Any, Any, dict], Any] | None = None

    def model(self, config, vocab_size: int, reference: bool = False):
        """The peer of our encoder ``config``'s shape (``reference``: the reference's model)."""
        import transformers as tf

        common = {**same_shape(config, vocab_size), "attn_implementation": "sdpa"}
        build = self.reference if reference and self.reference is not None else self.build
        return build(tf, config, common)


def _electra(tf, config, common: dict) -> ElectraPair:
    g = config.scaled(0.25)  # the generator at 1/4 width, sharing the embeddings
    width = {"hidden_size": g.hidden_size, "num_attention_heads": g.num_heads, "intermediate_size": g.intermediate_size}
    gen = tf.ElectraForMaskedLM(tf.ElectraConfig(**{**common, **width}, embedding_size=config.embedding_size))
    disc = tf.ElectraForPreTraining(tf.ElectraConfig(**common, embedding_size=config.embedding_size))
    gen.electra.embeddings = disc.electra.embeddings  # shared token/position/segment embeddings
    return ElectraPair(gen, disc)


PEERS: dict[str, Peer] = {
    "bert": Peer(
        "BertForPreTraining",
        lambda tf, c, common: tf.BertForPreTraining(tf.BertConfig(**common)),
        pair_label="next_sentence_label",
        body="bert",
        heads=lambda m, hidden, pooled: (m.cls.predictions(hidden), m.cls.seq_relationship(pooled)),
    ),
    "albert": Peer(
        "AlbertForPreTraining",
        lambda tf, c, common: tf.AlbertForPreTraining(
            tf.AlbertConfig(
                **common, embedding_size=c.embedding_size, num_hidden_groups=c.num_layers, inner_group_num=1
            )
        ),
        pair_label="sentence_order_label",
        body="albert",
        heads=lambda m, hidden, pooled: (m.predictions(hidden), m.sop_classifier(pooled)),
    ),
    "roberta": Peer(
        "RobertaForMaskedLM",
        lambda tf, c, common: tf.RobertaForMaskedLM(tf.RobertaConfig(**common, pad_token_id=1)),
        token_types=False,
        body="bert",
        heads=lambda m, hidden, pooled: (m.cls(hidden), None),
        reference=lambda tf, c, common: tf.BertForMaskedLM(
            tf.BertConfig(**{k: v for k, v in common.items() if k != "attn_implementation"})
        ),
    ),
    "electra": Peer("ElectraForMaskedLM + ElectraForPreTraining", _electra),
}

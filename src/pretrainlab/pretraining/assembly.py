"""A pretraining run's model, assembled from its config as every tool builds it: the encoder's config
(sized from the tokenizer), the objective plugin on it, and the encoder as the objective trains it (its
pooler frozen when the objective does not use it). Training (``pretraining.run.assemble``), the slot's
calibration, the held-out checks and the benchmarks all build theirs here. Imports nothing of the training
stack (Lightning, the data pipeline): a benchmark's process memory is the model's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from pretrainlab.config import ConfigError
from pretrainlab.model.encoder import Encoder, EncoderConfig
from pretrainlab.objectives.base import Objective
from pretrainlab.runtime import hydra
from pretrainlab.tokens import SpecialTokens


@dataclass
class Model:
    """What a run trains: the encoder's config and the objective on it (its heads included)."""

    encoder_config: EncoderConfig
    objective: Objective

    def encoder(self) -> Encoder:
        """A new encoder of this config, as the objective trains it."""
        return build_encoder(self.encoder_config, self.objective)


def build_model(cfg: DictConfig, tokens: SpecialTokens) -> Model:
    """The run's encoder config (from ``cfg.model``, sized to ``tokens``' vocabulary) and its objective
    (``cfg.objective``)."""
    encoder_config = build_encoder_config(cfg, tokens.vocab_size)
    return Model(encoder_config, build_objective(cfg, encoder_config, tokens))


def build_encoder_config(cfg: DictConfig, vocab_size: int) -> EncoderConfig:
    model_vocab = cfg.model.get("vocab_size")
    if model_vocab is not None and model_vocab != vocab_size:
        raise ConfigError(
            f"the tokenizer has {vocab_size} tokens but model.vocab_size={model_vocab}. Set model.vocab_size=null "
            f"to size the embeddings from the tokenizer, or use a tokenizer with {model_vocab} tokens "
            f"(tokenizer.vocab_size={model_vocab} if the corpus has enough distinct words)."
        )
    return instantiate(cfg.model, vocab_size=vocab_size)


def build_objective(cfg: DictConfig, encoder_config: EncoderConfig, tokens: SpecialTokens) -> Objective:
    """The objective plugin named by ``cfg.objective._target_``. Late objects (encoder config,
    special tokens) go in through a partial, so Hydra passes them as they are."""
    try:
        return instantiate(cfg.objective, _partial_=True)(encoder_config=encoder_config, tokens=tokens)
    except TypeError as e:
        unexpected = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        if not unexpected:
            raise
        key, name = unexpected.group(1), cfg.objective.get("name", cfg.objective.get("_target_"))
        having = [
            o
            for o in hydra.options("objective")
            if key in (OmegaConf.load(hydra.CONF / "objective" / f"{o}.yaml") or {})
        ]
        raise ConfigError(
            f"objective.{key} is not a setting of objective={name} (conf/objective/{name}.yaml lists its settings); "
            + (f"objective.{key} belongs to {', '.join(having)}." if having else f"no objective has {key}.")
            + f" Drop objective.{key} from the command line, or choose an objective that has it."
        ) from None


def build_encoder(config: EncoderConfig, objective: Objective) -> Encoder:
    """A new encoder for ``objective`` to train: its pooler frozen when the objective does not use it (no
    gradient reaches it, and DDP needs every trained parameter to get one)."""
    encoder = Encoder(config)
    if encoder.pooler is not None and not objective.uses_pooler:
        encoder.pooler.requires_grad_(False)
    return encoder


__all__ = ["Model", "build_encoder", "build_encoder_config", "build_model", "build_objective"]

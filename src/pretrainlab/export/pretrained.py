"""The encoder an evaluation starts from: a pretraining run, an exported encoder, a Hugging Face
checkpoint (``hf:<dir>``), or any of them re-initialised (``init=scratch``: the same architecture and
tokenizer from random weights, the baseline that shows what pretraining bought); loaded with its
tokenizer (:func:`load_pretrained`), and its identity (:func:`encoder_identity`), by which results are
matched to it without loading it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from pretrainlab.config import ConfigError
from pretrainlab.data.hashing import file_digest, fingerprint
from pretrainlab.export.hf import encoder_config_from_hf, load_hf_encoder, model_name
from pretrainlab.export.native import CONFIG, TOKENIZER, WEIGHTS, ExportError, load_encoder, resolve_export_dir
from pretrainlab.model.encoder import Encoder, EncoderConfig
from pretrainlab.runtime.wandb_runs import read_wandb_id
from pretrainlab.tokens import SpecialTokens, special_tokens


@dataclass
class Pretrained:
    """An encoder to fine-tune, its tokenizer, and where it came from."""

    encoder: Encoder
    tokenizer: Tokenizer
    tokens: SpecialTokens
    label: str  # the row name in comparisons: the run's arm or objective, "scratch", "hf:<name>"
    source: dict  # provenance: path, objective, pretraining run, W&B id


def shape_name(cfg) -> str:
    """An encoder's shape in a few characters (L2-H128, L12-H768-E128-shared), for encoders whose
    model preset is not recorded."""
    name = f"L{cfg.num_layers}-H{cfg.hidden_size}"
    if cfg.embedding_size != cfg.hidden_size:
        name += f"-E{cfg.embedding_size}"
    return name + ("-shared" if cfg.share_layers else "")


def encoder_identity(pretrained: str, init: str = "pretrained") -> dict:
    """What identifies the encoder ``pretrained`` names, without loading it: ``encoder_id`` (the
    sha256 of its weights file; for ``init=scratch``, a hash of its architecture and tokenizer),
    ``weights_sha256``, ``model`` (the model preset it was pretrained with, or its shape) and
    ``pretrain_seed``; ``pretrain_flops`` and ``fraction`` (of its run's budget: below 1 for a
    snapshot, see ``pretrainlab.pretraining.snapshots``) when recorded. Finished GLUE results are keyed by ``encoder_id``: a run directory
    pretrained again holds another encoder, whatever its path."""
    if init not in ("pretrained", "scratch"):
        raise ConfigError(f"init={init!r}: expected pretrained or scratch.")
    if not pretrained or pretrained == "???":
        raise ConfigError("pretrained=<run directory or exported encoder> is required.")
    if str(pretrained).startswith("hf:"):
        d = Path(os.path.expanduser(str(pretrained)[3:]))
        weights = next((d / f for f in ("model.safetensors", "pytorch_model.bin") if (d / f).is_file()), None)
        if weights is None or not (d / "config.json").is_file():
            raise FileNotFoundError(
                f"hf:{d}: expected a transformers directory (config.json and model.safetensors or pytorch_model.bin)."
            )
        cfg, _ = encoder_config_from_hf(json.loads((d / "config.json").read_text()))
        tokenizer = next((d / f for f in ("tokenizer.json", "vocab.txt") if (d / f).is_file()), None)
        model, seed, pre = model_name(d), None, {}  # type: str, int | None, dict
    else:
        d = resolve_export_dir(pretrained)
        try:
            meta = json.loads((d / CONFIG).read_text())
            cfg = EncoderConfig.from_dict(meta["encoder"])
        except (ValueError, KeyError, TypeError) as e:
            raise ExportError(
                f"{d / CONFIG}: not an encoder's export record ({type(e).__name__}: {e}); it was damaged or "
                f"written by something else. Copy the export again from the run that made it, or pretrain again."
            ) from None
        pre = meta.get("pretraining") or {}
        weights, tokenizer = d / WEIGHTS, d / TOKENIZER
        if not weights.is_file():
            raise FileNotFoundError(
                f"{d} holds the encoder's {CONFIG} but not its weights ({WEIGHTS}): the export is incomplete (an "
                f"interrupted export, or a copy without the weights). Export the run again, or copy {WEIGHTS} beside it."
            )
        model = (pre.get("choices") or {}).get("model") or shape_name(cfg)
        seed = (pre.get("config") or {}).get("seed")
    digest = file_digest(weights)
    identity = {
        "weights_sha256": digest,
        "model": model,
        "pretrain_seed": seed,
        "encoder_id": digest,
        "pretrain_flops": pre.get("flops"),
        "fraction": pre.get("fraction"),
    }
    if init == "scratch":
        identity["encoder_id"] = fingerprint(
            {"scratch": cfg.to_dict(), "tokenizer": file_digest(tokenizer) if tokenizer else None}
        )
        identity.update(pretrain_seed=None, pretrain_flops=0.0, fraction=None)
    return identity


def load_pretrained(pretrained: str, init: str = "pretrained", seed: int = 0) -> Pretrained:
    identity = encoder_identity(pretrained, init)
    if str(pretrained).startswith("hf:"):
        encoder, tokenizer, tokens, source = load_hf_encoder(str(pretrained)[3:])
        label = f"hf:{source['name']}"
    else:
        path = resolve_export_dir(pretrained)
        encoder, tokenizer, meta = load_encoder(path)
        names = {role: tokenizer.id_to_token(i) for role, i in meta["special_tokens"].items()}
        tokens = special_tokens(tokenizer, names)
        pre = meta.get("pretraining", {})
        run_dir = pre.get("run_dir")
        wandb_id = read_wandb_id(Path(run_dir))[0] if run_dir else None
        wandb_group = ((pre.get("config") or {}).get("logger") or {}).get("group") or pre.get("objective")
        source = {
            "path": str(path.resolve()),
            "objective": pre.get("objective"),
            "run_dir": run_dir,
            "global_step": pre.get("global_step"),
            "tokens_seen": pre.get("tokens_seen"),
            "wandb_id": wandb_id,
            "wandb_group": wandb_group,
        }
        label = (
            (pre.get("config") or {}).get("arm") or pre.get("objective") or path.name
        )  # a study's arm, else its objective
    if init == "scratch":
        torch.manual_seed(seed)
        encoder = Encoder(encoder.config)
        label = "scratch"
    if encoder_identity(pretrained, init)["weights_sha256"] != identity["weights_sha256"]:
        raise RuntimeError(
            f"the encoder at {pretrained} changed while it was being loaded (is it being pretrained or "
            f"exported again?): its results could not be matched to it. Run again once it is written."
        )
    source.update(identity, init=init)
    return Pretrained(encoder, tokenizer, tokens, label, source)


__all__ = ["Pretrained", "encoder_identity", "load_pretrained", "shape_name"]

"""Hugging Face interoperability, without importing transformers (an optional extra).

Export (``python -m pretrainlab.export <run> --format hf <dir>``) writes a directory that
``transformers.AutoModel.from_pretrained`` loads with the same hidden states:

    BERT-shaped encoders (no factorisation, no sharing, post-LN)  -> BertForMaskedLM / BertModel
    ALBERT-shaped (shared layers, or factorised embeddings)       -> AlbertForMaskedLM / AlbertModel
    ELECTRA's discriminator                                       -> ElectraForPreTraining / ElectraModel

The pretraining heads come from the run's last checkpoint when there is one (MLM head, ELECTRA's
replaced-token head); an export directory alone gives the bare model.

Import (``pretrained=hf:<dir>``) reads a transformers BERT, ELECTRA or ALBERT checkpoint
(config.json, model.safetensors or pytorch_model.bin, tokenizer.json or vocab.txt) as our encoder.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from pretrainlab import atomic
from pretrainlab.data.tokenizer import load_tokenizer
from pretrainlab.export.native import check_output_dir, load_encoder, resolve_export_dir
from pretrainlab.model.encoder import Encoder, EncoderConfig
from pretrainlab.objectives.base import Objective
from pretrainlab.runtime.checkpoints import load_tensors
from pretrainlab.runtime.checkpoints import read as read_checkpoint
from pretrainlab.tokens import ROLES, SPECIALS, SpecialTokens, special_tokens, with_template

log = logging.getLogger("pretrainlab")


class HFFormatError(ValueError):
    """An encoder or checkpoint that the transformers format cannot represent, or vice versa."""


def architecture(cfg: EncoderConfig, preferred: str | None = None) -> str:
    """The transformers family an encoder exports as: ``preferred`` (the objective's
    ``hf_model_type``) where it can hold the encoder, else BERT, or ALBERT for shared layers or
    factorised embeddings."""
    if cfg.pre_layer_norm:
        raise HFFormatError(
            "pre-LN encoders (model.pre_layer_norm=true) have no transformers equivalent among "
            "BERT, ALBERT and ELECTRA (all post-LN); export them with the native format."
        )
    if preferred == "electra" and not cfg.share_layers:  # ELECTRA has no shared layers
        return "electra"
    if cfg.share_layers or cfg.embedding_size != cfg.hidden_size:
        return "albert"
    return "bert"


# --- parameter names ----------------------------------------------------------------------------------
def _layer_map(prefix: str, i: int, arch: str) -> dict[str, str]:
    """our layer parameter -> HF name (without weight/bias); qkv is split separately."""
    if arch == "albert":
        p = f"{prefix}encoder.albert_layer_groups.{i}.albert_layers.0."
        return {
            "attention.out": p + "attention.dense",
            "attention_norm": p + "attention.LayerNorm",
            "ffn_in": p + "ffn",
            "ffn_out": p + "ffn_output",
            "ffn_norm": p + "full_layer_layer_norm",
            "q": p + "attention.query",
            "k": p + "attention.key",
            "v": p + "attention.value",
        }
    p = f"{prefix}encoder.layer.{i}."
    return {
        "attention.out": p + "attention.output.dense",
        "attention_norm": p + "attention.output.LayerNorm",
        "ffn_in": p + "intermediate.dense",
        "ffn_out": p + "output.dense",
        "ffn_norm": p + "output.LayerNorm",
        "q": p + "attention.self.query",
        "k": p + "attention.self.key",
        "v": p + "attention.self.value",
    }


def _pairs(cfg: EncoderConfig, arch: str, prefix: str) -> list[tuple[str, str]]:
    """(our name, HF name) for every tensor but the fused qkv."""
    out = [
        (f"embeddings.{n}.weight", f"{prefix}embeddings.{n}.weight")
        for n in ("word_embeddings", "position_embeddings", "token_type_embeddings")
    ]
    out += [(f"embeddings.norm.{w}", f"{prefix}embeddings.LayerNorm.{w}") for w in ("weight", "bias")]
    if cfg.embedding_size != cfg.hidden_size or arch == "albert":
        proj = {
            "albert": f"{prefix}encoder.embedding_hidden_mapping_in",
            "electra": f"{prefix}embeddings_project",
            "bert": None,
        }[arch]
        if proj is None:
            raise HFFormatError("BERT has no embedding projection.")
        out += [(f"embedding_projection.{w}", f"{proj}.{w}") for w in ("weight", "bias")]
    n = 1 if cfg.share_layers else cfg.num_layers
    for i in range(n):
        m = _layer_map(prefix, i, arch)
        for ours in ("attention.out", "attention_norm", "ffn_in", "ffn_out", "ffn_norm"):
            out += [(f"layers.{i}.{ours}.{w}", f"{m[ours]}.{w}") for w in ("weight", "bias")]
    if cfg.add_pooler:
        pooler = f"{prefix}pooler" if arch == "albert" else f"{prefix}pooler.dense"
        out += [(f"pooler.{w}", f"{pooler}.{w}") for w in ("weight", "bias")]
    return out


def to_hf_state(state: dict[str, torch.Tensor], cfg: EncoderConfig, arch: str, prefix: str = "") -> dict:
    hf: dict[str, torch.Tensor] = {}
    for ours, theirs in _pairs(cfg, arch, prefix):
        if ours.startswith("embedding_projection") and ours not in state:  # ALBERT always projects
            h, e = cfg.hidden_size, cfg.embedding_size
            hf[theirs] = torch.eye(h, e) if ours.endswith("weight") else torch.zeros(h)
        else:
            hf[theirs] = state[ours].contiguous()
    h = cfg.hidden_size
    for i in range(1 if cfg.share_layers else cfg.num_layers):
        m = _layer_map(prefix, i, arch)
        for w in ("weight", "bias"):
            qkv = state[f"layers.{i}.attention.qkv.{w}"]
            for j, name in enumerate("qkv"):
                hf[f"{m[name]}.{w}"] = qkv[j * h : (j + 1) * h].contiguous()
    return hf


def from_hf_state(hf: dict[str, torch.Tensor], cfg: EncoderConfig, arch: str) -> dict[str, torch.Tensor]:
    prefix = {"bert": "bert.", "albert": "albert.", "electra": "electra."}[arch]
    if not any(k.startswith(prefix) for k in hf):
        prefix = ""
    state: dict[str, torch.Tensor] = {}
    for ours, theirs in _pairs(cfg, arch, prefix):
        if ours.startswith("embedding_projection") and cfg.embedding_size == cfg.hidden_size:
            continue  # ALBERT's projection of equal sizes: ours has none (only identity-free models load)
        if theirs not in hf:
            raise HFFormatError(f"the checkpoint has no tensor {theirs}: is it a {arch} model?")
        state[ours] = hf[theirs]
    for i in range(1 if cfg.share_layers else cfg.num_layers):
        m = _layer_map(prefix, i, arch)
        for w in ("weight", "bias"):
            state[f"layers.{i}.attention.qkv.{w}"] = torch.cat([hf[f"{m[n]}.{w}"] for n in "qkv"], 0)
    return state


# --- configs -----------------------------------------------------------------------------------------
def hf_config(cfg: EncoderConfig, arch: str, architectures: list[str], pad_id: int) -> dict:
    c = {
        "model_type": arch,
        "architectures": architectures,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "gelu",
        "hidden_dropout_prob": cfg.hidden_dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "max_position_embeddings": cfg.max_position_embeddings,
        "type_vocab_size": cfg.type_vocab_size,
        "initializer_range": cfg.initializer_range,
        "layer_norm_eps": cfg.layer_norm_eps,
        "pad_token_id": pad_id,
        "position_embedding_type": "absolute",
    }
    if arch in ("albert", "electra"):
        c["embedding_size"] = cfg.embedding_size
    if arch == "albert":
        c.update(
            num_hidden_groups=1 if cfg.share_layers else cfg.num_layers, inner_group_num=1, classifier_dropout_prob=0.1
        )
    return c


def encoder_config_from_hf(c: dict) -> tuple[EncoderConfig, str]:
    arch = c.get("model_type")
    if arch not in ("bert", "albert", "electra"):
        raise HFFormatError(f"model_type {arch!r}: pretrained=hf:<dir> reads BERT, ALBERT and ELECTRA checkpoints.")
    if c.get("hidden_act", "gelu") != "gelu":
        raise HFFormatError(f"hidden_act={c.get('hidden_act')!r}: this encoder uses exact (erf) GELU only.")
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise HFFormatError("only absolute position embeddings are supported.")
    if arch == "albert" and c.get("num_hidden_groups", 1) not in (1, c["num_hidden_layers"]):
        raise HFFormatError("ALBERT with layer groups other than 1 or one per layer is not supported.")
    share = arch == "albert" and c.get("num_hidden_groups", 1) == 1 and c["num_hidden_layers"] > 1
    cfg = EncoderConfig(
        vocab_size=c["vocab_size"],
        hidden_size=c["hidden_size"],
        num_layers=c["num_hidden_layers"],
        num_heads=c["num_attention_heads"],
        intermediate_size=c["intermediate_size"],
        max_position_embeddings=c["max_position_embeddings"],
        type_vocab_size=c.get("type_vocab_size", 2),
        embedding_size=c.get("embedding_size") or c["hidden_size"],
        share_layers=share,
        hidden_dropout=c.get("hidden_dropout_prob", 0.1),
        attention_dropout=c.get("attention_probs_dropout_prob", 0.1),
        layer_norm_eps=c.get("layer_norm_eps", 1e-12),
        add_pooler=arch != "electra",
        initializer_range=c.get("initializer_range", 0.02),
    )
    return cfg, arch


# --- tokenizer files ---------------------------------------------------------------------------------------
def write_tokenizer(tok: Tokenizer, specials: dict[str, str], out: Path, lowercase: bool = True) -> None:
    with_template(tok, specials["cls"], specials["sep"]).save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 512,
        "do_lower_case": lowercase,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
        **{f"{r}_token": specials[r] for r in ROLES},
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps({f"{r}_token": specials[r] for r in ROLES}, indent=2))


def read_tokenizer(d: Path) -> tuple[Tokenizer, dict[str, str]]:
    tcfg = json.loads((d / "tokenizer_config.json").read_text()) if (d / "tokenizer_config.json").is_file() else {}
    specials = {r: (tcfg.get(f"{r}_token") or SPECIALS[r]) for r in ROLES}
    specials = {r: (v["content"] if isinstance(v, dict) else v) for r, v in specials.items()}
    if (d / "tokenizer.json").is_file():
        tok = load_tokenizer(d / "tokenizer.json", "Replace it with the checkpoint's own tokenizer.json.")
        tok.no_padding()  # batches are padded by the pipeline, sequences truncated by task.max_seq_len
        tok.no_truncation()
        return tok, specials
    if (d / "vocab.txt").is_file():
        from tokenizers.implementations import BertWordPieceTokenizer

        lower = bool(tcfg.get("do_lower_case", True))
        wp = BertWordPieceTokenizer(str(d / "vocab.txt"), lowercase=lower, strip_accents=None if lower else False)
        return wp._tokenizer, specials
    raise FileNotFoundError(f"{d}: no tokenizer.json or vocab.txt.")


# --- export ----------------------------------------------------------------------------------------
def objective_class(meta: dict) -> type | None:
    """The objective class an export was pretrained with (its config's ``_target_``), or None."""
    from hydra.utils import get_class

    target = (((meta.get("pretraining") or {}).get("config") or {}).get("objective") or {}).get("_target_")
    try:
        return get_class(target) if target else None
    except Exception:  # noqa: BLE001 - an objective this installation does not have: no head
        log.warning("the export's objective %s cannot be imported: exported without its pretraining head", target)
        return None


def export_hf(path: str | Path, out_dir: str | Path, force: bool = False) -> Path:
    """A run directory or an export directory -> a transformers directory, written to a temporary
    directory and renamed into place. ``out_dir`` is checked first (``native.check_output_dir``):
    an earlier hf export there is replaced, any other non-empty directory only with ``force``.

    The model class follows the objective: its pretraining head, when the run's last checkpoint holds
    this encoder (``Objective.hf_head``), else the bare model."""
    out_dir = Path(out_dir)
    check_output_dir(out_dir, Path(path), "hf", force)
    export = resolve_export_dir(path)
    encoder, tokenizer, meta = load_encoder(export)
    cfg = encoder.config
    objective = objective_class(meta)
    arch = architecture(cfg, getattr(objective, "hf_model_type", None))
    specials = {r: str(tokenizer.id_to_token(i)) for r, i in meta["special_tokens"].items()}
    ours = encoder.state_dict()
    head = _head_from_checkpoint(export.parent / "checkpoints" / "last.ckpt", ours, objective, arch)
    base = {"bert": "BertModel", "albert": "AlbertModel", "electra": "ElectraModel"}[arch]
    state = to_hf_state(ours, cfg, arch, f"{arch}." if head else "")
    if head:
        state.update(head[1])
    config = hf_config(cfg, arch, [head[0] if head else base], meta["special_tokens"]["pad"])
    config["pretrainlab"] = {
        "objective": (meta.get("pretraining") or {}).get("objective"),
        "source": str(export.resolve()),
    }

    def build(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        save_file(
            {k: v.detach().float().clone() for k, v in state.items()},
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        write_tokenizer(tokenizer, specials, tmp)

    return atomic.build_dir(out_dir, build)


def _head_from_checkpoint(
    ckpt: Path, encoder_state: dict[str, torch.Tensor], objective: type[Objective] | None, arch: str
) -> tuple[str, dict[str, torch.Tensor]] | None:
    """(transformers class, head tensors) from the run's checkpoint, when it holds a head the
    objective can map and its encoder is the exported one (a checkpoint of another run, or of an
    earlier step, would put foreign heads on this encoder: then none is exported)."""
    if objective is None or not ckpt.is_file():
        return None
    state = read_checkpoint(ckpt)["state_dict"]
    foreign = [
        k
        for k, v in encoder_state.items()
        if f"encoder.{k}" not in state or not torch.equal(state[f"encoder.{k}"].float(), v.float())
    ]
    if foreign:
        log.warning(
            "%s holds another encoder than the export (%s differs): exported without the pretraining head",
            ckpt,
            foreign[0],
        )
        return None
    return objective.hf_head(state, arch)


# --- import -------------------------------------------------------------------------------------------
def model_name(d: Path) -> str:
    """A checkpoint directory's model name: the last part of config.json's ``_name_or_path``, or
    the directory's name."""
    config = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    return str(config.get("_name_or_path") or "").rstrip("/").split("/")[-1] or d.name


def _convert_advice(d: Path) -> str:
    """How to turn a pickled checkpoint whose source one trusts into safetensors, which holds tensors only."""
    src, dst = d / "pytorch_model.bin", d / "model.safetensors"
    return (
        "If you trust its source, convert it once to safetensors (tensors only, loaded without running code), "
        f'and pretrained=hf:{d} reads that instead:\n  python -c "import torch; from safetensors.torch import '
        f"save_file; s = torch.load('{src}', weights_only=False); save_file({{k: v.clone().contiguous() for k, v "
        f"in s.items() if isinstance(v, torch.Tensor)}}, '{dst}', metadata={{'format': 'pt'}})\""
    )


def load_hf_encoder(path: str | Path) -> tuple[Encoder, Tokenizer, SpecialTokens, dict]:
    """(encoder, tokenizer, special tokens, provenance) from a transformers checkpoint directory."""
    d = Path(os.path.expanduser(str(path)))
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"hf:{path}: no config.json; expected a transformers model directory.")
    hf_cfg = json.loads((d / "config.json").read_text())
    cfg, arch = encoder_config_from_hf(hf_cfg)
    if (d / "model.safetensors").is_file():
        hf = load_file(str(d / "model.safetensors"))
    elif (d / "pytorch_model.bin").is_file():
        hf = load_tensors(
            d / "pytorch_model.bin", unsafe_advice=_convert_advice(d), corrupt_advice="Download the checkpoint again."
        )
    else:
        raise FileNotFoundError(f"hf:{path}: no model.safetensors or pytorch_model.bin.")
    if arch == "albert" and cfg.embedding_size == cfg.hidden_size:
        raise HFFormatError("ALBERT checkpoints with embedding_size == hidden_size are not supported.")
    if arch == "bert" and not any(k.endswith("pooler.dense.weight") for k in hf):
        cfg.add_pooler = False
    encoder = Encoder(cfg)
    encoder.load_state_dict(from_hf_state(hf, cfg, arch))
    tokenizer, specials = read_tokenizer(d)
    tokens = special_tokens(tokenizer, specials)
    if tokens.vocab_size > cfg.vocab_size:
        raise HFFormatError(f"the tokenizer has {tokens.vocab_size} tokens, the model {cfg.vocab_size}.")
    return (
        encoder,
        tokenizer,
        tokens,
        {"path": str(d.resolve()), "objective": f"hf:{arch}", "format": "hf", "name": model_name(d)},
    )

"""Exported encoders: what fine-tuning loads, without any objective code.

An export directory holds

    config.json           {"encoder": EncoderConfig fields, "special_tokens": {...}, "pretraining": {...}}
    encoder.safetensors   the encoder's weights (for ELECTRA: the discriminator)
    tokenizer.json        the tokenizer the encoder was trained with

It is written to a temporary directory and renamed into place, so an interrupted export never
leaves a half-written directory where a complete one was.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from pretrainlab.model.encoder import Encoder, EncoderConfig
from pretrainlab.tokens import SpecialTokens

CONFIG, WEIGHTS, TOKENIZER = "config.json", "encoder.safetensors", "tokenizer.json"


def export_encoder(encoder: Encoder, tokenizer: Tokenizer, tokens: SpecialTokens, out_dir: str | Path,
                   pretraining: dict | None = None) -> Path:
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in encoder.state_dict().items()}
        save_file(state, str(tmp / WEIGHTS))
        tokenizer.save(str(tmp / TOKENIZER))
        specials = {"pad": tokens.pad_id, "unk": tokens.unk_id, "cls": tokens.cls_id, "sep": tokens.sep_id,
                    "mask": tokens.mask_id}
        meta = {"format": "pretrainlab-encoder/1", "encoder": encoder.config.to_dict(), "special_tokens": specials,
                "pretraining": pretraining or {}}
        (tmp / CONFIG).write_text(json.dumps(meta, indent=2, default=str))
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def resolve_export_dir(path: str | Path) -> Path:
    """An export directory, or a run directory containing ``encoder/``."""
    p = Path(os.path.expanduser(str(path)))
    if (p / "encoder" / CONFIG).is_file():
        p = p / "encoder"
    if not (p / CONFIG).is_file():
        raise FileNotFoundError(f"{path} is not an exported encoder (no {CONFIG}) nor a run directory with encoder/.")
    return p


def load_encoder(path: str | Path, map_location: str = "cpu") -> tuple[Encoder, Tokenizer, dict]:
    """(encoder, tokenizer, metadata) from an export directory or a run directory."""
    p = resolve_export_dir(path)
    meta = json.loads((p / CONFIG).read_text())
    encoder = Encoder(EncoderConfig.from_dict(meta["encoder"]))
    encoder.load_state_dict(load_file(str(p / WEIGHTS), device=map_location))
    return encoder, Tokenizer.from_file(str(p / TOKENIZER)), meta


def main(argv: list[str] | None = None) -> int:
    """python -m pretrainlab.export <run or export dir> --format hf <out dir>"""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pretrainlab.export", description=(
        "Export a pretrained encoder: --format hf writes a transformers directory (AutoModel.from_pretrained); "
        "--format native copies the pretrainlab export."))
    parser.add_argument("source", help="a pretraining run directory or its encoder/ export")
    parser.add_argument("out", help="the directory to write")
    parser.add_argument("--format", choices=["hf", "native"], default="hf")
    args = parser.parse_args(argv)
    if args.format == "hf":
        from pretrainlab.hf import export_hf

        out = export_hf(args.source, args.out)
    else:
        src = resolve_export_dir(args.source)
        out = Path(args.out)
        shutil.copytree(src, out, dirs_exist_ok=True)
    print(f"exported {args.source} -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

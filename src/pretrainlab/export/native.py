"""The native export: what fine-tuning loads, without any objective code.

An export directory holds

    config.json           {"encoder": EncoderConfig fields, "special_tokens": {...}, "pretraining": {...},
                          "tokenizer_sha256": the digest of tokenizer.json, checked when the export is loaded}
    encoder.safetensors   the encoder's weights (for ELECTRA: the discriminator)
    tokenizer.json        the tokenizer the encoder was trained with; encoding adds [CLS] ... [SEP]
                          as the encoder saw its inputs (add_special_tokens=False: the text alone)
    objective.safetensors the objective's own weights (heads, ELECTRA's generator), for zero-shot
                          evaluations that score text the way the objective does (load_objective)

It is written to a temporary directory and renamed into place, so an interrupted export never
leaves a half-written directory where a complete one was.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from pretrainlab import atomic
from pretrainlab.data.hashing import file_digest
from pretrainlab.data.tokenizer import load_tokenizer
from pretrainlab.model.encoder import Encoder, EncoderConfig
from pretrainlab.runtime.checkpoints import read
from pretrainlab.tokens import SpecialTokens, with_template

CONFIG, WEIGHTS, TOKENIZER, OBJECTIVE = "config.json", "encoder.safetensors", "tokenizer.json", "objective.safetensors"
FORMAT = "pretrainlab-encoder/1"


class ExportError(ValueError):
    """An export that would destroy something, or a source that is not an export."""


def is_export(path: Path, fmt: str) -> bool:
    """Whether ``path`` holds an export of format ``fmt`` (``native`` or ``hf``) written by pretrainlab."""
    try:
        config = json.loads((path / CONFIG).read_text())
    except (OSError, ValueError):
        return False
    if fmt == "native":
        return str(config.get("format", "")).startswith("pretrainlab-encoder/")
    return isinstance(config.get("pretrainlab"), dict)


def check_output_dir(out: Path, source: Path, fmt: str, force: bool = False) -> None:
    """Refuse an export into a directory it must not replace. Always: the working directory, the
    source (as given: a run directory or an export), the export it reads, any directory containing
    one of them, and any directory inside the export it reads. Unless ``force``: a non-empty
    directory that holds no earlier export of the same format."""
    target = out.resolve()
    read = resolve_export_dir(source).resolve()
    for keep, what in (
        (Path.cwd().resolve(), "the working directory"),
        (source.resolve(), f"the source {source}"),
        (read, f"the export {read}"),
    ):
        if target == keep or target in keep.parents:
            raise ExportError(
                f"{out} is {what} or contains it: an export replaces its output directory. Name a new "
                f"directory, e.g. {out / 'export'}."
            )
    if read in target.parents:
        raise ExportError(f"{out} lies inside the export it reads ({read}): name a directory outside it.")
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} is a file: name a directory.")
    if out.is_dir() and any(out.iterdir()) and not is_export(out, fmt) and not force:
        raise ExportError(
            f"{out} is not empty and holds no earlier {fmt} export: its files would be deleted. Name "
            f"a new or empty directory, or pass --force to replace it."
        )


def _float32(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in module.state_dict().items()}


def export_encoder(
    encoder: Encoder,
    tokenizer: Tokenizer,
    tokens: SpecialTokens,
    out_dir: str | Path,
    pretraining: dict | None = None,
    objective: torch.nn.Module | None = None,
) -> Path:
    """Write ``encoder`` (float32 weights), its tokenizer and metadata to ``out_dir``, and the
    ``objective``'s own weights when given, replacing an earlier export there in one rename."""
    state = _float32(encoder)
    meta = {
        "format": FORMAT,
        "encoder": encoder.config.to_dict(),
        "special_tokens": tokens.ids(),
        "pretraining": pretraining or {},
    }

    def build(tmp: Path) -> None:
        save_file(state, str(tmp / WEIGHTS))
        if objective is not None:
            save_file(_float32(objective), str(tmp / OBJECTIVE))
        cls, sep = tokenizer.id_to_token(tokens.cls_id), tokenizer.id_to_token(tokens.sep_id)
        assert cls is not None and sep is not None, "the special tokens are in the vocabulary"
        with_template(tokenizer, cls, sep).save(str(tmp / TOKENIZER))
        meta["tokenizer_sha256"] = file_digest(tmp / TOKENIZER)
        (tmp / CONFIG).write_text(json.dumps(meta, indent=2, default=str))

    return atomic.build_dir(out_dir, build)


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
    try:
        meta = json.loads((p / CONFIG).read_text())
        config = EncoderConfig.from_dict(meta["encoder"])
    except (ValueError, KeyError, TypeError) as e:
        raise ExportError(f"{p / CONFIG} is not a pretrainlab export config ({e}); export the run again.") from None
    encoder = Encoder(config)
    try:
        state = load_file(str(p / WEIGHTS), device=map_location)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError, an Exception
        raise ExportError(f"{p / WEIGHTS} cannot be read ({str(e).strip()[:200]}); export the run again.") from None
    encoder.load_state_dict(state)
    tokenizer = load_tokenizer(p / TOKENIZER, "The export is damaged: export the run again.")
    check_tokenizer(p, meta)  # a readable tokenizer, and the one the encoder was trained with
    return encoder, tokenizer, meta


def check_tokenizer(export: Path, meta: dict) -> None:
    """Refuse an export whose ``tokenizer.json`` is not the one its encoder was trained with (the digest
    its ``config.json`` records; exports written before they recorded it are not checked): its token
    ids would stand for other pieces of text, and every result on it would be of another encoder."""
    recorded = meta.get("tokenizer_sha256")
    path = export / TOKENIZER
    if recorded and path.is_file() and file_digest(path) != recorded:
        raise ExportError(
            f"{path} is not the tokenizer this encoder was trained with (its sha256 is {file_digest(path)[:12]}, "
            f"{export / CONFIG} records {str(recorded)[:12]}): the encoder's ids would mean other words. Put its own "
            f"tokenizer.json back (export the run again)."
        )


def load_objective(path: str | Path, encoder: Encoder, tokens: SpecialTokens, weights: bool = True):
    """The objective an export was pretrained with, built for ``encoder`` and ``tokens``, with its
    weights from the export's ``objective.safetensors`` (or, for exports written before it was,
    from the run's ``checkpoints/last.ckpt`` when that holds this encoder). ``weights=False``: freshly
    initialised (the scratch baseline). An ExportError says what is missing."""
    from hydra.utils import instantiate

    p = resolve_export_dir(path)
    meta = json.loads((p / CONFIG).read_text())
    target = ((meta.get("pretraining") or {}).get("config") or {}).get("objective")
    if not target or "_target_" not in target:
        raise ExportError(
            f"{p} records no pretraining objective (an encoder imported from elsewhere?): zero-shot "
            f"evaluations score text with the objective's own heads."
        )
    objective = instantiate(target, _partial_=True)(encoder_config=encoder.config, tokens=tokens)
    if not weights:
        return objective
    if (p / OBJECTIVE).is_file():
        objective.load_state_dict(load_file(str(p / OBJECTIVE)))
        return objective

    ckpt = p.parent / "checkpoints" / "last.ckpt"
    if ckpt.is_file():
        state = read(ckpt)["state_dict"]
        ours = encoder.state_dict()
        if all(torch.equal(state.get(f"encoder.{k}", torch.empty(0)).float(), v.float()) for k, v in ours.items()):
            objective.load_state_dict(
                {k[len("objective.") :]: v for k, v in state.items() if k.startswith("objective.")}
            )
            return objective
    raise ExportError(
        f"{p} has no {OBJECTIVE} (it was exported before exports held the objective's weights) and no "
        f"checkpoint of this encoder beside it: export the run again from its last checkpoint "
        f"(python train.py hydra.run.dir=<run> ckpt_path=last) to evaluate it zero-shot."
    )


def export_native(source: str | Path, out: str | Path, force: bool = False) -> Path:
    """Copy the export of a run (or an export directory) to ``out``."""
    src, out = resolve_export_dir(source), Path(out)
    check_output_dir(out, Path(source), "native", force)
    return atomic.build_dir(out, lambda tmp: shutil.copytree(src, tmp, dirs_exist_ok=True))


__all__ = [
    "CONFIG",
    "FORMAT",
    "OBJECTIVE",
    "TOKENIZER",
    "WEIGHTS",
    "ExportError",
    "check_output_dir",
    "export_encoder",
    "export_native",
    "is_export",
    "load_encoder",
    "load_objective",
    "resolve_export_dir",
]

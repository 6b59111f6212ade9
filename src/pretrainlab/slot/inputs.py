"""What a slot's study reads, in one compressed file that travels with the project to the machine it
runs on (``python -m pretrainlab.slot pack``):

    inputs/inputs.json          what is in it: every file's sha256, the settings it was packed for,
                                where each part came from, when, by which code
    inputs/corpus/              the pretraining corpus, tokenized (``data.packed``): the slot's
                                machine needs neither the text nor the time to tokenize it
    inputs/<block>/             every file the study's evaluations read, as released, in the layout of
                                its folder: inputs/glue/<Task>/{train,dev}.tsv, inputs/blimp/*.jsonl,
                                inputs/ner/{train,dev}.txt (a block is an evaluation's data settings)

Evaluation files are copied byte for byte, so their digests, which every result records, are those
of the files they came from. The archive is checked against a size limit when it is written, and
every file against its digest when it is unpacked.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

from omegaconf import DictConfig

from pretrainlab import atomic
from pretrainlab.data.hashing import file_digest, fingerprint
from pretrainlab.data.packed import pack_corpus
from pretrainlab.data.pipeline import PretrainData
from pretrainlab.evaluation.base import get, with_data
from pretrainlab.runtime.hydra import compose
from pretrainlab.slot.code import code_version
from pretrainlab.studies.work import study_tasks

log = logging.getLogger("pretrainlab")

MANIFEST = "inputs.json"
FORMAT = 1


class InputsError(ValueError):
    """Inputs that cannot be packed, or an archive that is not a slot's inputs."""


def _tokenizer_overrides(cfg: DictConfig) -> list[str]:
    """The study's pretraining overrides of the tokenizer (resolved)."""
    probe = cfg.copy()
    probe.budget_flops = 1.0  # not known yet, and not the tokenizer's
    return [str(o) for o in probe.pretrain if str(o).split("=", 1)[0].strip("+~").startswith("tokenizer")]


def evaluation_files(cfg: DictConfig, data_dirs: dict[str, Path]) -> dict[str, list[tuple[Path, Path]]]:
    """Every local file the slot study ``cfg`` evaluates on, by data block: (the file, its folder in
    ``data_dirs``), as each evaluation says it reads them (``Evaluation.data_files``)."""

    tasks = study_tasks(cfg)
    missing = sorted({get(t).data_block for t in tasks} - set(data_dirs))
    if missing:
        reads = {b: [t for t in tasks if get(t).data_block == b] for b in missing}
        raise InputsError(
            "the study evaluates on data it was not given: "
            + "; ".join(f"{', '.join(ts)} read {b} data" for b, ts in reads.items())
            + ". Give --data-dir "
            + " ".join(f"{b}=<folder>" for b in missing)
            + " (or --data, a folder in ../shared/data's layout)."
        )
    probe = cfg.copy()
    probe.budget_flops = 1.0  # not known yet, and not the evaluations'
    gcfg, _ = compose("suite", [*probe.suite.overrides, *(f'++{b}.data_dir="{d}"' for b, d in data_dirs.items())])
    out: dict[str, list[tuple[Path, Path]]] = {}
    for t in tasks:
        evaluation = with_data(t, gcfg)
        block = evaluation.data_block
        root = Path(data_dirs[block]).expanduser()
        if not root.is_dir():
            raise InputsError(f"--data-dir {block}={root}: no such folder ({t} reads {block} data).")
        try:
            files = evaluation.data_files()
        except (OSError, ValueError) as e:
            raise InputsError(
                f"{t}: {e}. The slot would fail on it after pretraining; fix the folder and pack again."
            ) from None
        if files is not None and not files:
            raise InputsError(
                f"{t}: no data file of it in {root} (the study evaluates on it). Give the folder that holds its "
                f"files (--data-dir {block}=<folder>), or leave it out of the study."
            )
        for f in files or []:
            out.setdefault(block, []).append((f, root))
    return {b: list(dict.fromkeys(fs)) for b, fs in out.items()}


def pack(
    cfg: DictConfig,
    out: str | Path,
    corpus: str | Path,
    data_dirs: dict[str, Path],
    max_mib: float = 32.0,
) -> dict:
    """Pack what the slot study ``cfg`` reads into the archive ``out`` (``.tar.xz``, at most ``max_mib``
    MiB; a file already there is refused, not replaced): its corpus, tokenized, and the files of its
    evaluations, from ``data_dirs`` (data block -> folder: ``glue``, ``ner``, ``blimp``, ...), kept in
    ``inputs/<block>/`` as they are laid out there. Returns the manifest."""
    from hydra.utils import instantiate

    out = Path(out)
    if out.exists():
        raise InputsError(f"{out} exists: pack into a new file (nothing is replaced).")
    if not str(out).endswith(".tar.xz"):
        raise InputsError(f"{out}: name the archive <name>.tar.xz.")
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise InputsError(f"--out {out}: {above} is a file, not a folder: give a path in a folder.")
    wanted = evaluation_files(cfg, data_dirs)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="pretrainlab-pack-") as tmp:
        root = Path(tmp) / "inputs"
        root.mkdir()
        files: dict[str, str] = {}
        for block, found in wanted.items():
            for src, folder in found:
                if not src.is_file():
                    raise InputsError(f"{src} does not exist: it is one of the files the study reads.")
                rel = f"{block}/{src.resolve().relative_to(folder.resolve()).as_posix()}"
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, root / rel)
                files[rel] = file_digest(root / rel)

        # the corpus, tokenized as the study's runs tokenize it
        train_cfg, _ = compose(
            "train", ["data=text", f"data.files=[{Path(corpus).resolve()}]", *_tokenizer_overrides(cfg)]
        )
        spec = instantiate(train_cfg.tokenizer)
        data = PretrainData(
            instantiate(train_cfg.data), spec, train_cfg.cache_dir, train_cfg.val_fraction, train_cfg.split_seed
        )
        pack_corpus(root / "corpus", data.tokenized, data.tokenizer, spec, data.corpus.key(), data.corpus.describe())
        for f in sorted((root / "corpus").iterdir()):
            files[f"corpus/{f.name}"] = file_digest(f)
        corpus_manifest = json.loads((root / "corpus" / "corpus.json").read_text())
        manifest: dict = {
            "format": FORMAT,
            "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "code": code_version(),
            "corpus": {k: corpus_manifest[k] for k in ("source_description", "tokenizer", "documents", "tokens")},
            "sources": {"corpus": str(corpus), **{b: str(data_dirs[b]) for b in wanted}},
            "files": dict(sorted(files.items())),
        }
        (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        log.info("packing %d files (%.1f MiB) into %s", len(files) + 1, _size(root) / 2**20, out)

        def write(tmp_out: Path) -> None:
            with tarfile.open(tmp_out, "w:xz", preset=9) as tar:
                tar.add(root, arcname="inputs")

        atomic.write_named(out, write)
    size = out.stat().st_size
    if size > max_mib * 2**20:
        out.unlink()
        raise InputsError(
            f"the inputs take {size / 2**20:.3g} MiB compressed, more than the {max_mib:g} MiB allowed: a smaller "
            f"corpus (fewer files in --corpus), or fewer evaluations (evals=...), or --max-mib."
        )
    log.info(
        "inputs -> %s: %.1f MiB (%d files; corpus %d documents, %.1fM tokens) in %.0f s",
        out,
        size / 2**20,
        len(files) + 1,
        corpus_manifest["documents"],
        corpus_manifest["tokens"] / 1e6,
        time.time() - t0,
    )
    return manifest


def _size(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def safe_extract(tar: tarfile.TarFile, into: Path, members: list[tarfile.TarInfo]) -> None:
    """Extract ``members`` (already checked to be plain files and folders inside the archive) into
    ``into``, with tarfile's ``data`` filter where this Python has it."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(into, members=members, filter="data")
    else:  # pragma: no cover - Python before 3.12 without the backported filters
        tar.extractall(into, members=members)


def digest(manifest: dict) -> str:
    """The identity of a slot's inputs: the digest of every file in them."""

    return fingerprint({"format": manifest.get("format"), "files": manifest.get("files")})


def unpack(archive: str | Path, into: str | Path) -> tuple[Path, dict]:
    """Unpack the inputs ``archive`` into ``into`` (its ``inputs/``), each file checked against the
    manifest; an ``inputs/`` already there of the same manifest is checked and kept. Returns the
    inputs directory and the manifest."""
    archive, into = Path(archive), Path(into)
    if not archive.is_file():
        raise InputsError(f"--inputs {archive}: no such file. Make it with `python -m pretrainlab.slot pack`.")
    root = into / "inputs"
    if (root / MANIFEST).is_file():
        try:
            with tarfile.open(archive, "r:*") as tar:
                member = tar.extractfile(f"inputs/{MANIFEST}")
                packed = json.loads(member.read()) if member is not None else None
        except (tarfile.TarError, KeyError, EOFError, OSError, ValueError) as e:
            raise InputsError(f"{archive} cannot be read as a slot's inputs archive ({e}).") from None
        if packed is None or digest(packed) != digest(json.loads((root / MANIFEST).read_text())):
            raise InputsError(
                f"{root} holds other inputs than {archive}: a slot's work directory is for one set of inputs. "
                f"Give another --work, or move {into} away."
            )
    else:
        if root.exists():
            raise InputsError(f"{root} exists but holds no {MANIFEST}: move it away, or unpack into another --work.")
        into.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".inputs-", dir=into) as tmp:
            try:
                with tarfile.open(archive, "r:*") as tar:
                    members = tar.getmembers()
                    bad = [m.name for m in members if not m.name.startswith("inputs") or ".." in Path(m.name).parts]
                    if bad or any(not (m.isfile() or m.isdir()) for m in members):
                        raise InputsError(f"{archive} is not a slot's inputs archive (it holds {bad[:3] or 'links'}).")
                    safe_extract(tar, Path(tmp), members)
            except (tarfile.TarError, EOFError, OSError) as e:
                raise InputsError(f"{archive} cannot be read as a .tar.xz ({e}); copy or pack it again.") from None
            os.replace(Path(tmp) / "inputs", root)
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise InputsError(f"{root / MANIFEST} cannot be read ({e}); pack the inputs again.") from None
    if manifest.get("format") != FORMAT:
        raise InputsError(f"{archive}: inputs format {manifest.get('format')}, this pretrainlab reads {FORMAT}.")
    for rel, expected in manifest["files"].items():
        f = root / rel
        if not f.is_file() or file_digest(f) != expected:
            raise InputsError(
                f"{f} is missing or differs from the file packed (sha256): the inputs are damaged. Copy the archive "
                f"again (and remove {root})."
            )
    listed = {MANIFEST, *manifest["files"]}
    extra = sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and str(p.relative_to(root)) not in listed
    )
    if extra:
        raise InputsError(
            f"{root} holds {len(extra)} file(s) that {MANIFEST} does not list ({', '.join(extra[:3])}"
            f"{', ...' if len(extra) > 3 else ''}): the study would read them (a BLiMP paradigm is scored by being "
            f"there) under the inputs' digest. Pack the inputs again with them, or remove them (and {root})."
        )
    return root, manifest


__all__ = ["InputsError", "digest", "evaluation_files", "pack", "safe_extract", "unpack"]

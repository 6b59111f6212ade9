"""Writing outputs so that no reader ever sees half of one, and a killed writer leaves nothing behind.

Every file and directory is built under a temporary name beside its destination and renamed into
place (one ``rename``, atomic on a POSIX file system). Temporary names say who made them
(``.<name>.tmp-<host>-<pid>-<random>``), so the next writer of the same destination removes what a
killed one left behind (:func:`remove_stale`) without touching another live writer's work.

Outputs get the permissions of any file the process creates (``0666`` / ``0777`` less the umask):
``tempfile`` makes its files ``0600`` and directories ``0700``, which would keep colleagues out of
a shared ``runs/`` and a second user out of a shared cache.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

_HOST = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:24] or "host"


def umask() -> int:
    """The process's umask (read without changing it where /proc allows)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def as_created(path: Path) -> None:
    """Give ``path`` the mode an ordinary ``open``/``mkdir`` would have given it."""
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask())


def _prefix(final: Path) -> str:
    return f".{final.name}.tmp-{_HOST}-{os.getpid()}-"


class WriteError(OSError):
    """An output that could not be written (a full disk, a quota, a file-size limit), naming it."""


def _failed(path: Path, e: BaseException) -> WriteError:
    """A :class:`WriteError` saying which output failed, why, and how much room its file system has."""
    if isinstance(e, OSError) and e.errno:
        reason = os.strerror(e.errno)
    else:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**20:,.0f} MiB free on its file system"
    except OSError:
        free = "free space unknown"
    error = WriteError(
        f"could not write {path}: {reason} ({free}). Nothing was replaced: the previous version, if "
        f"any, is intact. Make room there (a full disk, a quota or a file-size limit is the usual cause) or write to another disk, and run again."
    )
    error.errno = getattr(e, "errno", None)
    return error


def destination(path: str | Path) -> Path:
    """Where a write to ``path`` lands: the target of a symbolic link at ``path`` (a link to an
    earlier output is followed, so the output it points at is the one replaced, never the link
    turned into a copy while the real folder keeps a stale one), else ``path``."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def temporary_dir(final: Path) -> Path:
    """An empty directory beside ``final``, with ordinary permissions, to be renamed onto it."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=_prefix(final)))
    as_created(tmp)
    return tmp


def write_with(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(f)`` on a temporary file beside ``path``, then rename it onto ``path`` (onto
    the target of a link at ``path``: :func:`destination`)."""
    path = destination(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_prefix(path))
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        as_created(Path(tmp))
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, (OSError, RuntimeError)) and not isinstance(e, WriteError):
            raise _failed(path, e) from e  # torch.save reports a full disk as a RuntimeError without the path
        raise
    return path


def write_named(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` to create a file at a temporary path beside ``path`` (for writers that
    take a file name rather than a file object), then rename it onto ``path`` (:func:`destination`)."""
    path = destination(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{_prefix(path)}{os.urandom(4).hex()}")
    try:
        write(tmp)
        as_created(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, WriteError):
            raise _failed(path, e) from e
        raise
    return path


def write_bytes(path: str | Path, data: bytes) -> Path:
    return write_with(path, lambda f: f.write(data))


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def strict(data: Any) -> Any:
    """``data`` with every float that is not a number (NaN, inf) as None: JSON has no NaN, and strict
    parsers refuse the literal; a metric with nothing to measure (a head whose batch held none of a
    kind of position) is written ``null``."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: strict(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [strict(v) for v in data]
    return data


def json_text(data: Any, indent: int | None = 2) -> str:
    """Strict JSON of ``data`` (:func:`strict`): what every report and record of the project is written as."""
    return json.dumps(strict(data), indent=indent, default=str, allow_nan=False)


def write_json(path: str | Path, data: Any) -> Path:
    return write_text(path, json_text(data) + "\n")


def build_dir(final: str | Path, build: Callable[[Path], object], replace: bool = True) -> Path:
    """Build a directory with ``build(tmp)`` and rename it onto ``final``. Everything in it gets
    the ordinary permissions (some writers, safetensors among them, make their files private).

    ``replace=True``: an existing ``final`` is swapped out and deleted once the new one is in
    place (an export written again). ``replace=False``: an existing ``final`` wins and the new
    build is discarded (a cache entry built at the same time by another process). A link at
    ``final`` is followed (:func:`destination`)."""
    final = destination(final)
    remove_stale(final)
    tmp = temporary_dir(final)
    try:
        try:
            build(tmp)
        except (OSError, RuntimeError) as e:
            if isinstance(e, WriteError) or (isinstance(e, RuntimeError) and not _disk_error(e)):
                raise
            raise _failed(final, e) from e
        for p in tmp.rglob("*"):
            if not p.is_symlink():
                as_created(p)
        if not final.exists():
            try:
                os.replace(tmp, final)
                return final
            except OSError:  # another writer put it there in the meantime
                if not final.exists():
                    raise
        if replace:
            old = Path(tempfile.mkdtemp(dir=final.parent, prefix=_prefix(final)))
            os.replace(final, old / final.name)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _disk_error(e: RuntimeError) -> bool:
    """A RuntimeError from a writer (torch, safetensors) that reports a failed file write."""
    text = str(e).lower()
    return any(w in text for w in ("write", "space", "unexpected pos", "errno", "quota"))


def remove_stale(final: str | Path) -> list[Path]:
    """Remove the temporary files and directories that writers of ``final`` on this host left
    when they were killed (their process is gone). Returns what was removed."""
    final = Path(final)
    if not final.parent.is_dir():
        return []
    pattern = re.compile(rf"^\.{re.escape(final.name)}\.tmp-{re.escape(_HOST)}-(\d+)-")
    removed = []
    for entry in final.parent.iterdir():
        m = pattern.match(entry.name)
        if m is None or _alive(int(m.group(1))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


__all__ = [
    "WriteError",
    "as_created",
    "build_dir",
    "destination",
    "remove_stale",
    "temporary_dir",
    "umask",
    "write_bytes",
    "json_text",
    "strict",
    "write_json",
    "write_named",
    "write_text",
    "write_with",
]

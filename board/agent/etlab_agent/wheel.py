"""Unpack a wheel safely (`unpack`): no member may escape the destination, exec bits are kept, and the result
appears atomically (unpacked into a temporary folder, then renamed into place).

Standard library only: bootstrap.py uses this to unpack click before click is importable.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

from .errors import AgentError, BadInput
from .files import fsync_path, sha256_file, utc_now

MARKER_NAME = ".etlab_unpacked.json"


class UnsafeArchive(AgentError):
    """A member would land outside the destination (absolute path, '..', symlink)."""


def check_member(info: zipfile.ZipInfo) -> None:
    """Refuse names that could escape the destination folder, and links."""
    name = info.filename
    if "\x00" in name or "\\" in name:
        raise UnsafeArchive(f"refusing member {name!r}: NUL or backslash in its name", member=name)
    if name.startswith("/") or PurePosixPath(name).is_absolute():
        raise UnsafeArchive(f"refusing member {name!r}: absolute path", member=name)
    parts = PurePosixPath(name).parts
    if ".." in parts:
        raise UnsafeArchive(f"refusing member {name!r}: '..' escapes the destination", member=name)
    if parts and ":" in parts[0]:
        raise UnsafeArchive(f"refusing member {name!r}: drive-qualified path", member=name)
    if stat.S_ISLNK(info.external_attr >> 16):
        raise UnsafeArchive(f"refusing member {name!r}: symbolic link", member=name)


def select(name: str, member_prefixes: Sequence[str], strip_prefix: str | None) -> str | None:
    """The member's path below the destination, or None when it is not wanted."""
    if member_prefixes and not any(name.startswith(prefix) for prefix in member_prefixes):
        return None
    if strip_prefix:
        if not name.startswith(strip_prefix):
            return None
        name = name[len(strip_prefix) :]
    name = name.lstrip("/")
    return name or None


def _mode(info: zipfile.ZipInfo) -> int:
    unix_mode = (info.external_attr >> 16) & 0o777
    return 0o755 if unix_mode & 0o111 else 0o644


def _extract(archive: zipfile.ZipFile, info: zipfile.ZipInfo, root: Path, relative: str) -> int:
    target = root.joinpath(*PurePosixPath(relative).parts)
    # Defence in depth: the checks above already refused anything that could leave `root`.
    if os.path.commonpath([str(root.resolve()), str(target.parent.resolve())]) != str(root.resolve()):
        raise UnsafeArchive(f"refusing member {info.filename!r}: resolves outside the destination")
    if info.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    with archive.open(info) as source, open(str(target), "wb") as sink:
        shutil.copyfileobj(source, sink, 1 << 20)
    os.chmod(str(target), _mode(info))
    return info.file_size


def unpack_wheel(
    wheel: Path, dest: Path, member_prefixes: Sequence[str] = (), strip_prefix: str | None = None
) -> dict[str, Any]:
    """Unpack the selected members of `wheel` into `dest`, replacing it as a whole."""
    wheel = Path(wheel).expanduser()
    dest = Path(dest).expanduser().absolute()
    if not wheel.is_file():
        raise BadInput(f"wheel {wheel} does not exist or is not a file")
    if strip_prefix is not None and not strip_prefix:
        strip_prefix = None
    try:
        archive = zipfile.ZipFile(str(wheel))
    except (zipfile.BadZipFile, OSError) as exc:
        raise AgentError(f"{wheel} is not a readable wheel (zip): {exc}") from exc
    with archive:
        members = archive.infolist()
        for info in members:
            check_member(info)
        chosen = [(info, rel) for info in members for rel in [select(info.filename, member_prefixes, strip_prefix)]]
        chosen = [(info, rel) for info, rel in chosen if rel is not None]
        if not any(not info.is_dir() for info, _rel in chosen):
            wanted = ", ".join(member_prefixes) or strip_prefix or "(all)"
            raise AgentError(f"no file in {wheel.name} matches the member prefixes {wanted}")

        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".tmp-unpack-{dest.name}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(str(tmp))
        tmp.mkdir()
        try:
            total = 0
            for info, relative in chosen:
                total += _extract(archive, info, tmp, relative)
            summary = {
                "wheel": wheel.name,
                "wheel_sha256": sha256_file(wheel),
                "member_prefixes": list(member_prefixes),
                "strip_prefix": strip_prefix,
                "files": sum(1 for info, _rel in chosen if not info.is_dir()),
                "bytes": total,
                "unpacked_at": utc_now(),
            }
            (tmp / MARKER_NAME).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
            replaced = _swap_into_place(tmp, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                shutil.rmtree(str(tmp))
            raise
    return dict(summary, dest=str(dest), replaced=replaced)


def _swap_into_place(tmp: Path, dest: Path) -> bool:
    """Rename `tmp` to `dest`; an existing `dest` is moved aside first and deleted after."""
    old = None
    if dest.exists() or dest.is_symlink():
        old = dest.parent / f".old-unpack-{dest.name}-{os.getpid()}"
        if old.exists():
            shutil.rmtree(str(old))
        os.rename(str(dest), str(old))
    os.rename(str(tmp), str(dest))
    fsync_path(dest.parent)
    if old is not None:
        shutil.rmtree(str(old), ignore_errors=True)
    return old is not None

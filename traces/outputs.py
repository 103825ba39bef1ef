"""Output safety: every file xsim writes goes to a temporary name beside it and is renamed into place.

A reader (or a `kill -9` halfway) therefore sees the old file or the new one, never half of one; `os.replace`
replaces a directory entry, so nothing is ever written through a symbolic link, and a target that is a
symbolic link or the same file as an input is refused with one clear line.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable

from traces.errors import XsimError


class OutputError(XsimError):
    """An output path xsim refuses to write: a symbolic link, an input file, a folder holding another set."""


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_target(path: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]] = ()) -> str:
    """The path, after refusing a symbolic link, a folder, or one of `inputs` (compared as files)."""
    p = os.fspath(path)
    if os.path.islink(p):
        raise OutputError(f"{p}: is a symbolic link; xsim never writes through or over one (remove it first)")
    if os.path.isdir(p):
        raise OutputError(f"{p}: is a folder, cannot write a file there")
    if os.path.exists(p):
        for src in inputs:
            if os.path.exists(os.fspath(src)) and _same_file(p, os.fspath(src)):
                raise OutputError(
                    f"{p}: is an input of this run ({os.fspath(src)}); refusing to overwrite it"
                )
    return p


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, inputs: Iterable[str | os.PathLike[str]] = ()
) -> str:
    """Write `data` to a temporary file beside `path`, flush it, and rename it into place; returns the path."""
    p = check_target(path, inputs)
    parent = os.path.dirname(p) or "."
    os.makedirs(parent, exist_ok=True)
    import tempfile  # only when writing: a replay without outputs never loads it

    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(p)}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return p


def atomic_write_text(
    path: str | os.PathLike[str], text: str, inputs: Iterable[str | os.PathLike[str]] = ()
) -> str:
    """UTF-8 text through `atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"), inputs)


def install_files(
    staged: str, out_dir: str, owned: Iterable[str], inputs: Iterable[str | os.PathLike[str]] = ()
) -> list[str]:
    """Rename every file of folder `staged` into `out_dir`, then remove the `owned` names this run did not write.

    `owned` names the files a run of this kind can write: an earlier run's file that this run did not
    produce (a cost.json when this set has no deployment) is stale and goes, so the folder holds only this
    run's outputs; files of other kinds are left alone. Every target is checked first, so a refused one
    leaves the folder as it was.
    """
    inputs = [os.fspath(i) for i in inputs]
    os.makedirs(out_dir, exist_ok=True)
    names = sorted(os.listdir(staged))
    for name in names:
        check_target(os.path.join(out_dir, name), inputs)
    out = []
    for name in names:
        dst = os.path.join(out_dir, name)
        os.replace(os.path.join(staged, name), dst)
        out.append(dst)
    for name in sorted(set(owned) - set(names)):
        stale = os.path.join(out_dir, name)
        if os.path.islink(stale):
            raise OutputError(
                f"{stale}: stale output is a symbolic link; remove it (xsim does not follow links)"
            )
        if os.path.isfile(stale):
            os.unlink(stale)
    return out


_STAGING = ".xsim-staging."
# `.xsim-staging.<host>.<pid>.<random>`: whose run it is, so a later run can tell a dead one's folder.
_STAGING_OWNER = re.compile(r"^\.xsim-staging\.(?P<host>.+)\.(?P<pid>\d+)\.[^.]+$")


def _host() -> str:
    """This host's name as it can stand in a folder name."""
    import socket

    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def remove_stale_staging(out_dir: str) -> list[str]:
    """Remove staging folders in `out_dir` whose run was killed (SIGKILL, SIGTERM skip `finally`): this
    host's with a process gone, and the unowned ones (`.xsim-staging.<random>`) of runs before owners were
    named. Another host's (a Dask sweep on a shared file system) and live runs' stay. Returns what went."""
    import shutil

    try:
        names = os.listdir(out_dir)
    except OSError:
        return []
    host, gone = _host(), []
    for name in names:
        if not name.startswith(_STAGING):
            continue
        m = _STAGING_OWNER.match(name)
        if m and (m["host"] != host or _alive(int(m["pid"]))):
            continue
        path = os.path.join(out_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone


def staging_dir(out_dir: str) -> str:
    """A fresh hidden folder inside `out_dir` (same file system, so renames are atomic), named for this
    host and process; stale ones a killed run left there go first (`remove_stale_staging`)."""
    import tempfile

    os.makedirs(out_dir, exist_ok=True)
    remove_stale_staging(out_dir)
    return tempfile.mkdtemp(prefix=f"{_STAGING}{_host()}.{os.getpid()}.", dir=out_dir)


_SET_FILE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>\d+)\.et(?:\.gz)?$")


def other_set_files(out_dir: str, name: str, num_ranks: int) -> list[str]:
    """Trace files in `out_dir` that a set `<name>.0..N-1.et` written there would not replace."""
    out = []
    for p in sorted(glob.glob(os.path.join(glob.escape(out_dir), "*.et*"))):
        m = _SET_FILE.match(os.path.basename(p))
        if m is None:
            continue
        if m.group("prefix") != name or int(m.group("rank")) >= num_ranks or p.endswith(".gz"):
            out.append(p)
    return out


def prepare_set_folder(out_dir: str, name: str, num_ranks: int, force: bool) -> None:
    """Refuse (or with `force`, clear) a folder holding trace files of another set before writing one there."""
    others = other_set_files(out_dir, name, num_ranks)
    if not others:
        return
    if not force:
        shown = ", ".join(os.path.basename(p) for p in others[:3]) + (" ..." if len(others) > 3 else "")
        raise OutputError(
            f"{out_dir}: holds {len(others)} trace file(s) of another set ({shown}); writing {name}.<0..."
            f"{num_ranks - 1}>.et there would mix two sets: choose an empty folder or pass --force to replace them"
        )
    for p in others:
        if os.path.islink(p):
            raise OutputError(
                f"{p}: is a symbolic link; xsim does not remove or follow links (remove it first)"
            )
        os.unlink(p)

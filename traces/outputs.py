"""Output safety: every file xsim writes goes to a temporary name beside it and is renamed into place.

A reader (or a `kill -9` halfway) therefore sees the old file or the new one, never half of one; `os.replace`
replaces a directory entry, so nothing is ever written through a symbolic link, and a target that is a
symbolic link or the same file as an input is refused with one clear line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from xsim.traces.errors import XsimError


class OutputError(XsimError):
    """An output path xsim refuses to write: a symbolic link, an input file, a folder holding another set."""


# Fault injection (tests/test_faults.py, scripts/fault_campaign.py; docs/robustness.md): with
# XSIM_FAULT="POINT[@N]:FAULT" the Nth time (default the first) this process reaches POINT, FAULT happens
# there: KILL, TERM or INT (the signal to this process) or ENOSPC or EROFS (the OSError a full or
# read-only disk raises). Points: "file" (a file about to be written), "stage" (a folder's files all
# staged, before its swap), "aside" (between the two renames of a swap without RENAME_EXCHANGE).
# XSIM_RENAME_EXCHANGE=0 forces that two-rename swap. Unset, each check is one dictionary lookup.
FAULT_ENV = "XSIM_FAULT"
_fault_counts: dict[str, int] = {}


def fault_point(point: str, path: str = "") -> None:
    """Inject the fault XSIM_FAULT names when this is its point and count (a no-op without it)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    where, _, fault = spec.partition(":")
    name, _, nth = where.partition("@")
    if name != point:
        return
    _fault_counts[point] = _fault_counts.get(point, 0) + 1
    if _fault_counts[point] != (int(nth) if nth.isdigit() else 1):
        return
    import errno
    import signal

    if fault in ("KILL", "TERM", "INT"):
        os.kill(os.getpid(), getattr(signal, f"SIG{fault}"))
        if fault != "KILL":
            import time

            time.sleep(5)  # the handler raises in the main thread; a writer thread waits for it here
        return
    code = getattr(errno, fault, None)
    if isinstance(code, int):
        raise OSError(code, os.strerror(code), path or point)


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
    _refuse_set_member(p)
    if os.path.exists(p):
        for src in inputs:
            if os.path.exists(os.fspath(src)) and _same_file(p, os.fspath(src)):
                raise OutputError(
                    f"{p}: is an input of this run ({os.fspath(src)}); refusing to overwrite it"
                )
    return p


def _refuse_set_member(path: str) -> None:
    """Refuse a single-file output over a file of a trace set (a folder holding set.json): its rank files
    and metadata belong to the set, written whole or not at all."""
    import json

    folder, name = os.path.split(os.path.abspath(path))
    marker = os.path.join(folder, "set.json")
    if not os.path.isfile(marker):
        return
    try:
        with open(marker, encoding="utf-8") as fh:
            prefix = str(json.load(fh).get("prefix", ""))
    except (OSError, ValueError, AttributeError):
        prefix = ""
    meta = {"set.json", "deployment.json", "memory.json", "comm_group.json"}
    if name in meta or (prefix and name.startswith(f"{prefix}.")):
        raise OutputError(
            f"{path}: is a file of the trace set in {folder} (set.json); refusing to overwrite it: "
            f"write elsewhere"
        )


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
        fault_point("file", p)
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


# ---- whole folders: one writer, a fresh sibling, one rename ---------------------------------------------
#
# Every verb that writes a folder of files that belong together (a trace set, a replay's result tables)
# writes them into a fresh hidden sibling `.<name>.xsim-new.<host>.<pid>.<random>` and swaps it in for the
# folder with one rename (renameat2 RENAME_EXCHANGE where the file system has it), so a kill, a full disk or
# a crash leaves the earlier folder as it was: never a mix of two runs. An advisory lock on a sibling
# `.<name>.xsim-lock` (fcntl.flock) admits one writer per folder; the next waits a bounded time and is then
# refused in one line. Leftovers of a killed run (its staging sibling, or the earlier folder set aside by a
# two-rename swap) are cleared by the next writer of that folder, under the lock, said in one line.

LOCK_WAIT_ENV = "XSIM_LOCK_WAIT_S"
LOCK_WAIT_S = 10.0  # long enough for a sibling run to finish its rename; short enough to answer promptly
_NEW, _OLD = "xsim-new", "xsim-old"


def check_path_text(path: str) -> str:
    """The path, refused in one line when it is not valid UTF-8 (JSON outputs could not name it)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        shown = path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        raise OutputError(f"{shown}: output path is not valid UTF-8; choose another name") from None
    return path


def _inside(path: str, folder: str) -> bool:
    """Whether real path `path` is `folder` or lies under it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


@dataclass(frozen=True)
class FolderKind:
    """What a verb's output folder holds: a name for messages and the file names it writes there."""

    what: str  # "trace set", "replay result"
    owns: Callable[[str], bool]  # names this kind of run writes (an earlier run's are replaced, not refused)


def _sibling(out: str, tag: str) -> str:
    parent, base = os.path.split(out)
    return os.path.join(parent, f".{base}.{tag}.")


def _leftovers(out: str) -> tuple[list[str], list[str]]:
    """(staging folders, set-aside earlier folders) of runs on `out` that are gone (their pid dead, or
    another run's and unreadable: the caller holds the lock, so no live run of this host writes them)."""
    parent, base = os.path.split(out)
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return [], []
    host, new, old = _host(), [], []
    for name in sorted(names):
        for tag, into in ((_NEW, new), (_OLD, old)):
            head = f".{base}.{tag}."
            if not name.startswith(head):
                continue
            owner = name[len(head) :].split(".")
            if len(owner) >= 3 and owner[-3] == host and owner[-2].isdigit() and _alive(int(owner[-2])):
                continue  # a live run of this host (cannot hold the lock, but left alone all the same)
            into.append(os.path.join(parent, name))
    return new, old


def _tidy(out: str, say: Callable[[str], None]) -> None:
    """Clear a killed run's leftovers beside `out` (under the lock), restoring an earlier folder that a
    two-rename swap had set aside when the new one never arrived; one line says what went."""
    import shutil

    new, old = _leftovers(out)
    restored = ""
    if old and not os.path.lexists(out):
        os.rename(old.pop(), out)  # the kill fell between the two renames: the earlier folder comes back
        restored = f"; restored {out} from before it"
    for p in new + old:
        shutil.rmtree(p, ignore_errors=True)
    if new or old or restored:
        say(
            f"xsim: removed {len(new) + len(old)} leftover folder(s) of an interrupted run beside {out}"
            f"{restored}"
        )


class _Lock:
    """An exclusive advisory lock (fcntl.flock) on `.<name>.xsim-lock` beside a folder."""

    def __init__(self, out: str, wait_s: float) -> None:
        self.path = _sibling(out, "xsim-lock").rstrip(".")
        self.out, self.wait_s, self.fd = out, wait_s, -1

    def __enter__(self) -> _Lock:
        import fcntl
        import time

        deadline = time.monotonic() + self.wait_s
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() >= deadline:
                    holder = self._holder()
                    raise OutputError(
                        f"{self.out}: another xsim run{holder} is writing this folder (waited "
                        f"{self.wait_s:g} s; {LOCK_WAIT_ENV} sets the wait): try again when it is done"
                    ) from None
                time.sleep(0.05)
                continue
            except BaseException:
                os.close(fd)
                raise
            # The holder before us may have unlinked the file after we opened it: lock the one on disk.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path, follow_symlinks=False))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            self.fd = fd
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return self

    def _holder(self) -> str:
        try:
            with open(self.path, encoding="utf-8") as fh:
                pid = fh.read(32).strip()
        except OSError:
            return ""
        return f" (pid {pid})" if pid.isdigit() else ""

    def __exit__(self, *exc: object) -> None:
        try:
            os.unlink(self.path)  # still held: a waiter that opened it re-checks and opens the new one
        except OSError:
            pass
        os.close(self.fd)


@contextmanager
def folder_lock(out: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the writers' lock of folder `out` (as whole_folder does) for a longer job: a sweep writing many
    plan folders under it; a second writer waits XSIM_LOCK_WAIT_S, then is refused in one line."""
    target = os.path.abspath(check_path_text(os.fspath(out)))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    wait = float(os.environ.get(LOCK_WAIT_ENV, LOCK_WAIT_S) or LOCK_WAIT_S)
    with _Lock(target, wait):
        yield


def _exchange(a: str, b: str) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2  # <fcntl.h> AT_FDCWD, <linux/fs.h> RENAME_EXCHANGE
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    import errno

    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False  # this file system cannot exchange: the two-rename swap below
    raise OSError(err, os.strerror(err), a)


def _swap_in(stage: str, out: str) -> None:
    """Make `stage` the folder `out`; the earlier `out`, if any, goes."""
    import shutil
    import tempfile

    if not os.path.lexists(out):
        os.rename(stage, out)
        return
    if os.environ.get("XSIM_RENAME_EXCHANGE", "1") != "0" and _exchange(stage, out):
        shutil.rmtree(stage, ignore_errors=True)  # now the earlier folder
        return
    parent, base = os.path.split(out)
    aside = tempfile.mkdtemp(prefix=f".{base}.{_OLD}.{_host()}.{os.getpid()}.", dir=parent or ".")
    os.rmdir(aside)
    os.rename(out, aside)  # a kill here leaves `aside`, which the next writer renames back (_tidy)
    fault_point("aside", out)
    os.rename(stage, out)
    shutil.rmtree(aside, ignore_errors=True)


def _xsim_subfolder(path: str) -> bool:
    """A folder an earlier run wrote inside this one (`--annotate RES/annotated` beside `--out RES`): it
    holds a set.json or a result's source.json, and is replaced with the folder."""
    return os.path.isdir(path) and any(
        os.path.isfile(os.path.join(path, n)) for n in ("set.json", "source.json")
    )


def _foreign(out: str, kind: FolderKind) -> list[str]:
    """Entries of an existing `out` that this kind of run does not write."""
    try:
        names = sorted(os.listdir(out))
    except OSError as exc:
        raise OutputError(f"{out}: cannot read the output folder: {exc.strerror or exc}") from None
    # A symbolic link is never ours: xsim writes none (a folder of links to the inputs is the user's).
    out_names = []
    for n in names:
        if os.path.islink(os.path.join(out, n)):
            out_names.append(f"{n} (a symbolic link)")
        elif not n.startswith(_STAGING) and not kind.owns(n) and not _xsim_subfolder(os.path.join(out, n)):
            out_names.append(n)
    return out_names


@contextmanager
def whole_folder(
    out: str | os.PathLike[str],
    kind: FolderKind,
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    force: bool = False,
    say: Callable[[str], None] | None = None,
    label: str | None = None,
) -> Iterator[str]:
    """Yield a fresh staging folder beside `out`; when the block ends without an error, swap it in.

    Refused in one line, before anything is written: a path that is not UTF-8, a symbolic link, a file,
    a folder that is or holds an input of the run, a folder holding files `kind` does not write (unless
    `force`: the folder is then replaced as a whole); a second writer waits `XSIM_LOCK_WAIT_S` seconds.
    """
    import shutil
    import sys
    import tempfile

    def _say(line: str) -> None:
        print(line, file=sys.stderr)

    say = say or _say
    raw = check_path_text(os.fspath(out))
    label = label or raw  # what the user typed (an import's PREFIX, whose folder this is)
    target = os.path.abspath(raw)
    if os.path.islink(target):
        raise OutputError(
            f"{raw}: is a symbolic link; xsim never writes through or over one (remove it first)"
        )
    if os.path.lexists(target) and not os.path.isdir(target):
        raise OutputError(f"{label}: cannot write {kind.what}: {raw} is a file, not a folder")
    real = os.path.realpath(target)
    if _inside(os.path.realpath(os.getcwd()), real):
        # The folder is replaced whole: the working folder (or one above it) would vanish under the run.
        raise OutputError(
            f"{label}: cannot write {kind.what}: it is the current folder or holds it, and xsim replaces "
            f"output folders whole: choose a folder of its own (e.g. {os.path.join(raw, 'out')})"
        )
    for src in inputs:
        s = os.path.realpath(os.fspath(src))
        if _inside(s, real):
            raise OutputError(
                f"{raw}: holds an input of this run ({os.fspath(src)}); writing {kind.what} there would "
                f"replace it: choose another folder"
            )
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{label}: cannot write {kind.what}: {exc.strerror or exc}") from None
    wait = float(os.environ.get(LOCK_WAIT_ENV, LOCK_WAIT_S) or LOCK_WAIT_S)
    with _Lock(target, wait):
        _tidy(target, say)
        if os.path.isdir(target) and not force:
            alien = _foreign(target, kind)
            if alien:
                shown = ", ".join(alien[:3]) + (f" and {len(alien) - 3} more" if len(alien) > 3 else "")
                raise OutputError(
                    f"{raw}: holds {len(alien)} file(s) this command did not write ({shown}); writing "
                    f"{kind.what} there would replace them: choose an empty folder or pass --force to "
                    f"replace the folder as a whole"
                )
        base = os.path.basename(target)
        stage = tempfile.mkdtemp(prefix=f".{base}.{_NEW}.{_host()}.{os.getpid()}.", dir=parent)
        try:
            try:
                yield stage
            except XsimError as exc:  # name the folder the user asked for, not the hidden staging one
                if stage not in str(exc):
                    raise
                raise OutputError(str(exc).replace(stage, raw)) from None
            except OSError as exc:
                if not (isinstance(exc.filename, str) and exc.filename.startswith(stage)):
                    raise
                raise OSError(exc.errno, exc.strerror, raw + exc.filename[len(stage) :]) from None
            fault_point("stage", target)
            os.chmod(stage, 0o755)
            _swap_in(stage, target)
        finally:
            if os.path.lexists(stage):
                shutil.rmtree(stage, ignore_errors=True)

"""Files in and out: bounded reads of regular files (the one reader of every input file: never a
stream or device, never past a limit), output files written atomically and only ever replacing
regular files, and finding the project's pyproject.toml. Light: no import beyond the stdlib and
``errors``."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO

from traceml_ci.errors import InputError


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask sets it, which
    other threads of a training process could race with)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` via a temp file in the same folder and ``os.replace``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp makes the file 0600; give it the mode a plain open() would (0666 - umask).
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target


#: Names of this process's own descriptors (``-o /dev/stdout``): written through that
#: descriptor, after what was already printed to it -- whatever it is, even a regular file the
#: shell opened (``> out.txt``, ``>> log.txt``), which replacing would cut loose from the
#: redirection.
_STD_NAMES = {"/dev/stdout": 1, "/dev/stderr": 2}


def _own_descriptor(absolute: str) -> int | None:
    if absolute in _STD_NAMES:
        return _STD_NAMES[absolute]
    for folder in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
        rest = absolute.removeprefix(folder)
        if rest != absolute and rest.isdigit():
            return int(rest)
    return None


def write_output(path: str | os.PathLike[str], text: str) -> Path:
    """Write a command's output file (``-o/--output``), replacing only what is a regular file.

    - a missing path or an existing regular file: written atomically (temp file + rename);
    - a symbolic link: its final target is written atomically in its own folder, and the link
      stays a link (``report.html -> site/report.html``);
    - ``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``: written to that descriptor, as printing
      would (a closed one is an error);
    - an existing non-regular file (``/dev/null``, a terminal, a named pipe, or a link to one):
      opened and written *through*, never replaced (a named pipe waits for its reader, as with a
      shell's ``>``);
    - a directory, or a path that cannot be written: InputError (one line, exit 2).

    Returns the path written (the link's target for a link)."""
    given = str(path)
    try:
        fd = _own_descriptor(os.path.abspath(given))
        if fd is not None:
            for stream in (sys.stdout, sys.stderr):
                if stream is not None and not stream.closed:
                    stream.flush()  # what was printed before comes first
            _write_all(fd, text)
            return Path(given)
        target = Path(os.path.realpath(given))  # a link's final target (a dangling one too)
        try:
            info: os.stat_result | None = os.stat(target)
        except FileNotFoundError:
            info = None
        if info is not None and stat.S_ISDIR(info.st_mode):
            raise InputError(given, "cannot write: it is a directory (give a file name)")
        if info is not None and not stat.S_ISREG(info.st_mode):
            fd = os.open(target, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))  # never O_TRUNC
            try:
                _write_all(fd, text)
            finally:
                os.close(fd)
            return target
        if info is not None and not os.access(target, os.W_OK):
            raise InputError(given, "cannot write: the file is read-only")
        return atomic_write_text(target, text)
    except BrokenPipeError:
        raise  # the reader went away: the CLI's broken-pipe ending, not bad input
    except OSError as exc:
        raise InputError(given, f"cannot write: {exc.strerror or exc}") from None


def _write_all(fd: int, text: str) -> None:
    view = memoryview(text.encode("utf-8"))
    while view:
        written = os.write(fd, view)
        view = view[written:]


#: File types that are not regular files, as a message names them.
_NOT_REGULAR = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_text(path: str | os.PathLike[str], max_bytes: int) -> str:
    """A UTF-8 regular file of at most ``max_bytes``; InputError(path, problem) when it is
    missing, a directory, a stream or device (never read: ``/dev/zero`` would never end), too big
    (checked before reading, and again while reading), unreadable or not UTF-8."""
    p = Path(path)
    try:
        # Non-blocking, so opening a FIFO without a writer returns at once; the type check on
        # the open descriptor (not the name) leaves no window for a swap.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise InputError(str(p), "is a directory, not a file") from None
    except OSError as exc:
        raise InputError(str(p), f"cannot read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise InputError(str(p), "is a directory, not a file")
        for is_kind, kind in _NOT_REGULAR:
            if is_kind(info.st_mode):
                raise InputError(str(p), f"is {kind}, not a regular file; save it to a file first")
        size = info.st_size
        if size <= max_bytes:
            raw = _read_at_most(fd, max_bytes + 1)  # +1: a file that grew (or /proc's size 0)
            size = max(size, len(raw))
    except OSError as exc:
        raise InputError(str(p), f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise InputError(str(p), f"file is {_size(size)}, over the {_size(max_bytes, 0)} limit")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(str(p), "not UTF-8 text") from None


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _size(n: int, digits: int = 1) -> str:
    """Bytes for a message: ``104.9 MB``, ``64.5 KB``, ``16 bytes`` (a limit: ``digits=0``)."""
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n} bytes"


def read_stream_text(stream: BinaryIO, name: str, max_bytes: int) -> str:
    """What a stream (stdin) holds, UTF-8, at most ``max_bytes``: an endless one (``< /dev/zero``)
    is refused once past the limit, never read to the end. InputError names ``name``."""
    try:
        raw = stream.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(name, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:
        raise InputError(name, f"more than {_size(max_bytes, 0)}, over the limit")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(name, "not UTF-8 text") from None


def is_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder (through links). Never raises: a path that cannot be looked
    at (under a folder the user may not traverse, a link loop) is no folder here, and the reader
    that opens it next says why in one line (pathlib's ``is_dir`` raises PermissionError)."""
    return os.path.isdir(path)


def is_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file (through links); never raises, as :func:`is_dir`."""
    return os.path.isfile(path)


def missing(path: str | os.PathLike[str]) -> bool:
    """Whether nothing is at ``path`` (a dangling link counts as nothing). False where it cannot
    be looked at (permission denied, a link loop): something may be there, and reading it says
    what is wrong, never "no such file"."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except (OSError, ValueError):
        return False
    return False


def find_pyproject(start: str | os.PathLike[str] | None = None) -> Path | None:
    """The nearest pyproject.toml at or above ``start`` (default: the working directory): its
    ``[tool.traceml-ci]`` table holds the gate's tolerance rules."""
    here = Path(start) if start is not None else Path.cwd()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None

"""Files the commands write.

A target is checked before any input is read: a folder, a device, a pipe or
a socket is refused, since moving a finished file over it would replace it
with a regular file; a symbolic link is written through (its target gets the
content and the link stays a link). The content goes to a temporary file
with a unique name beside the target and is moved over it in one step
(``os.replace``) only once the command has finished, so a command that fails
leaves every existing file as it was, and a file may be both a command's
input and its output.

``-``, or a path naming the process's own standard output or error (such as
``/dev/stdout``), is that stream: written directly, when the command is done.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from typing import TextIO

from ..errors import CallerError

__all__ = ["Output", "OutputError", "UsageError"]


class UsageError(Exception):
    """A command line that cannot work as given (exit status 2)."""


class OutputError(CallerError):
    """An output that cannot be written (exit status 1)."""


def _standard_stream(path: str) -> int | None:
    """1 or 2 when ``path`` is the file this process's standard output or
    error is (``/dev/stdout``, say), else None."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    for fd in (1, 2):
        try:
            std = os.fstat(fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (std.st_dev, std.st_ino):
            return fd
    return None


class Output:
    """One file a command writes, checked on creation.

    ``option`` names the command-line option in messages; ``streams=False``
    refuses standard output and error (for binary output that would mix with
    the command's report).
    """

    def __init__(self, path: str, option: str = "-o", *, streams: bool = True) -> None:
        self.path = path
        self._fd = 1 if path == "-" else _standard_stream(path)
        self._temp: str | None = None
        self._existing: os.stat_result | None = None
        self.target = ""
        """The path the content is moved to: ``path`` with its symbolic links
        resolved."""
        if self._fd is not None:
            if not streams:
                where = "standard output" if self._fd == 1 else "standard error"
                raise UsageError(f"{option} {path}: this command writes a file, not to {where}")
            return
        if not path:
            raise UsageError(f"{option} needs a file name")
        self.target = os.path.realpath(path)
        try:
            self._existing = os.stat(self.target)
        except FileNotFoundError:
            self._existing = None
        except (OSError, ValueError) as e:
            raise OutputError(f"cannot write {path}: {getattr(e, 'strerror', None) or e}") from None
        if self._existing is not None:
            mode = self._existing.st_mode
            if stat.S_ISDIR(mode):
                raise UsageError(f"{option} {path}: is a folder; name a file")
            if not stat.S_ISREG(mode):
                raise UsageError(f"{option} {path}: is not a regular file (a device, a pipe or a socket); "
                                 "name a file")
        folder = os.path.dirname(self.target)
        if not os.path.isdir(folder):
            raise OutputError(f"cannot write {path}: no such folder {folder}")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise OutputError(f"cannot write {path}: permission denied (folder {folder})")

    @property
    def stream(self) -> TextIO | None:
        """The standard stream this output is, or None for a file."""
        if self._fd is None:
            return None
        return sys.stdout if self._fd == 1 else sys.stderr

    def temporary(self) -> str:
        """A new empty file beside the target, for the content; :meth:`commit`
        moves it over the target, :meth:`discard` removes it."""
        if self._fd is not None:
            raise ValueError("a standard stream has no temporary file")
        self.discard()
        folder, name = os.path.split(self.target)
        try:
            fd, self._temp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        except OSError as e:
            raise OutputError(f"cannot write {self.path}: {e.strerror or e}") from None
        os.close(fd)
        return self._temp

    def commit(self) -> None:
        """Move the temporary file over the target, with the target's
        permissions (or, for a new file, those ``open`` would give)."""
        tmp = self._temp
        if tmp is None:
            raise ValueError("nothing to commit")
        try:
            old = self._existing
            if old is not None:
                os.chmod(tmp, stat.S_IMODE(old.st_mode))
                mine = (os.getuid(), os.getgid()) if hasattr(os, "getuid") else None
                if mine is not None and (old.st_uid, old.st_gid) != mine:
                    with contextlib.suppress(OSError):  # only root may give a file away
                        os.chown(tmp, old.st_uid, old.st_gid)
            else:
                os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, self.target)
        except OSError as e:
            raise OutputError(f"cannot write {self.path}: {e.strerror or e}") from None
        self._temp = None

    def discard(self) -> None:
        """Remove the temporary file, if there is one."""
        if self._temp is not None:
            with contextlib.suppress(OSError):
                os.remove(self._temp)
            self._temp = None

    def write_text(self, text: str) -> None:
        """Write ``text`` as UTF-8: the whole of it or, on any error, nothing."""
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as e:
            # A lone surrogate, from a \\ud800 escape in JSON input.
            bad = text[e.start]
            raise OutputError(f"cannot write {self.path if self.path != '-' else 'the output'}: it holds "
                              f"U+{ord(bad):04X}, a lone surrogate, which UTF-8 cannot encode") from None
        stream = self.stream
        if stream is not None:
            binary = getattr(stream, "buffer", None)
            if binary is None:
                stream.write(text)
            else:
                stream.flush()
                binary.write(data)
                binary.flush()
            return
        try:
            tmp = self.temporary()
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            self.commit()
        except OSError as e:
            raise OutputError(f"cannot write {self.path}: {e.strerror or e}") from None
        finally:
            self.discard()


def _umask() -> int:
    # The only portable way to read the umask is to set it; nothing else of
    # this process creates files at the moment this runs.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask

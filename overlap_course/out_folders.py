"""The folder a command writes its output into: made for it (and removed again when the
command ends in an exception: :class:`made_folder`) and locked for it (:class:`locked`).
:mod:`overlap_course.command_line` offers both to every command."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from overlap_course.safe_json import quoted

__all__ = ["made_folder", "locked", "FolderLost", "cannot_write", "unwritable", "PATH_CHARS"]

#: The most characters of a path that a message quotes (then "..." and its length).
PATH_CHARS = 200

#: The errors of a disk (or a quota) that is full.
FULL = (errno.ENOSPC, errno.EDQUOT)

#: How many times :class:`locked` makes and locks a folder removed under it before refusing.
TRIES = 5


def cannot_write(path, err: OSError) -> ValueError:
    """The refusal of ``path`` when the system would not write it (or make its folder); a full
    disk (or quota) is told to free space: choosing a folder one may write was no help there."""
    fix = ("free space on its disk, or choose a path on another" if err.errno in FULL
           else "choose a path in a directory you can write")
    return ValueError(f"cannot write {quoted(str(path), PATH_CHARS)}: {err.strerror or err}; {fix}")


def unwritable(folder) -> OSError | None:
    """Why files cannot be made in the existing ``folder`` (a read-only mount, no permission),
    or None: asked before the work, as such a folder passed every other check and the command
    failed only when it wrote, after recording or executing for minutes."""
    if os.access(folder, os.W_OK):
        return None
    code = errno.EROFS if os.statvfs(folder).f_flag & os.ST_RDONLY else errno.EACCES
    return OSError(code, os.strerror(code), os.fspath(folder))


class FolderLost(ValueError):
    """The folder a command locked was removed or replaced while it held it
    (:meth:`locked.still_held`): refused input, though found late."""


class made_folder:
    """``folder`` made with its missing parents, in a ``with`` block; the folders it made are
    removed again if the block ends in an exception (refused input, a failed run, Ctrl-C, a
    kill): a command that wrote nothing leaves nothing.  Each is noted as made, by its real
    path, as it is made: ``a/../b`` makes ``a`` and ``b``, and ``a/..`` is no folder to remove."""

    def __init__(self, folder: Path):
        self._made = []
        try:
            for path in (*reversed(folder.parents), folder):
                try:
                    os.mkdir(path)
                except OSError:  # there already (made by another, or not ours to make)
                    if not os.path.isdir(path):
                        raise
                    continue
                self._made.append(os.path.realpath(path))
        except OSError:  # the folders made before a deeper one failed (a full disk) go too
            self._remove_made()
            raise

    def _remove_made(self) -> None:
        for path in reversed(self._made):  # deepest first; one something wrote into stays
            try:
                os.rmdir(path)
            except OSError:
                continue

    def __enter__(self):
        return self

    def __exit__(self, kind, value, trace):
        if kind is not None:
            self._remove_made()


class locked(made_folder):
    """``folder`` made (:class:`made_folder`: removed again if the block ends in an exception)
    and locked for this command, before any work, in a ``with`` block: an ``flock`` on the folder
    itself, so nothing is left in it.  A folder that cannot be made (``/proc/1/x``) is a
    ``ValueError`` naming ``shown`` (:func:`cannot_write`), as is one there that cannot be written
    (:func:`unwritable`: it was found only at the end); another command holding it, one
    saying ``busy``.  Two writing one output at once each announced a result the
    other had half replaced (a site's pages deleted while Sphinx read them, a trace pair from
    two runs).  A folder one may write into but not list (mode ``-wx``) cannot be opened to
    lock: the command goes on unlocked, as it did before the lock, rather than be refused as
    unwritable.

    Only the holder of the lock removes the folders it made, and before it lets the lock go.
    The one refused removes nothing: the folder it made is the holder's to write into (removing
    it lost the holder's recording).  A lock got on a folder removed meanwhile (by the holder
    before, who made it) holds nothing: the folder is made and locked again.  One removed (or
    replaced) while held is no longer this command's: :meth:`still_held` before writing."""

    def __init__(self, folder: Path, busy: str, shown: Path | None = None):
        self._folder = folder
        for _ in range(TRIES):
            try:
                super().__init__(folder)
            except OSError as err:
                raise cannot_write(folder if shown is None else shown, err) from None
            if self._lock(folder, busy):
                self._writable(folder if shown is None else shown)
                return
        raise ValueError(busy)  # made and removed under it every time: others at work there

    def _lock(self, folder: Path, busy: str) -> bool:
        """Whether ``folder`` is locked (or cannot be: ``-wx``); False if it was removed."""
        try:
            self._fd = os.open(folder, os.O_RDONLY)
        except PermissionError:  # no read permission on the folder: no lock can be had
            self._fd = None
            return True
        except FileNotFoundError:  # removed by the holder that made it, since made here
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another holds it: what was made here is in its use
            os.close(self._fd)
            raise ValueError(busy) from None
        if self._at_its_path():
            return True
        os.close(self._fd)  # removed (or replaced) before the lock: made (or refused) again
        return False

    def _writable(self, shown) -> None:
        """Refuse the folder locked if it cannot be written (:func:`unwritable`: one there
        already, read-only), letting go of it and of what was made."""
        err = unwritable(self._folder)
        if err is not None:
            self.__exit__(ValueError, None, None)
            raise cannot_write(shown, err)

    def _at_its_path(self) -> bool:
        """Whether the folder locked is the one at its path now."""
        try:
            return os.path.samestat(os.fstat(self._fd), os.stat(self._folder))
        except OSError:  # gone, or a parent replaced by a file
            return False

    def still_held(self, what: str) -> None:
        """A :class:`FolderLost` naming ``what`` (``OUT's folder``) unless the folder locked is
        still the one at its path.  Removed under the lock (a learner's ``rm -rf``), it may have
        been made again and locked by another command: a run that re-made it (``mkdir``) wrote
        into that command's folder while it held it, or, a file there, blamed its own file.
        A folder that could not be locked (``-wx``) is taken as held, as at the start."""
        if self._fd is not None and not self._at_its_path():
            raise FolderLost(f"{what} {quoted(str(self._folder), PATH_CHARS)} was removed or "
                             f"replaced while this run held it: nothing written; run it again")

    def __exit__(self, kind, value, trace):
        if self._fd is None or self._at_its_path():  # else the folders there are another's
            super().__exit__(kind, value, trace)  # removed while still locked: no one writes there
        if self._fd is not None:
            os.close(self._fd)

"""What every command of the course does with bad input and closed pipes.

A command answers bad input with one line, ``PROG: error: WHAT (see --help)``, and exit
status 2 -- argparse's own errors included (it prints its usage first, which can fill a
screen above the one line that matters).  Ctrl-C ends it with one line too,
``PROG: interrupted``, and exit status 130 -- from its first line of course code (its imports:
torch takes seconds) to the end of the interpreter's finalizers (:mod:`overlap_course.ctrl_c`).
Output cut short by its reader (``... | head``) ends the command quietly instead of with a
``BrokenPipeError`` traceback, by its own exit status if it had one -- where the output is the
product; a command whose product is files goes on with its work (:func:`progress`).  Output
that cannot be written at all (a full disk, ``> /dev/full``) is one line and exit status 2.
Every command's ``__main__`` goes through :func:`run`, so no command can forget one of these.
"""

from __future__ import annotations

import argparse
import errno
import functools
import math
import os
import sys
from pathlib import Path

from overlap_course import ctrl_c
from overlap_course.ctrl_c import INTERRUPTED, importing, interrupted, interruptible
from overlap_course.out_folders import PATH_CHARS, FolderLost, cannot_write, locked, made_folder
from overlap_course.safe_json import message_line, printable, quoted

__all__ = ["Parser", "fail", "interrupted", "one_line", "whole_number", "finite_number", "emit",
           "progress", "exit_quietly_on_broken_pipe", "out_file", "not_an_input", "out_folder",
           "in_a_folder", "made_folder", "locked", "FolderLost", "cannot_write", "os_problem",
           "interruptible", "importing", "run"]

#: The exit status of a command refused its input (argparse's too).
USAGE_ERROR = 2


def one_line(text) -> str:
    """``text`` on one line: a line break it quotes (from an argument, a file name) written as
    ``\\n``, and every other character a terminal would not show as itself (an escape such as
    ``ESC[31m``, a lone surrogate) written as its Python escape, and a long quoted excerpt (a
    100 KB argument argparse quotes whole) cut: :func:`safe_json.message_line`."""
    return message_line(text)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (its subcommands' too)."""

    def error(self, message: str):
        self.exit(USAGE_ERROR, f"{self.prog}: error: {one_line(message)} (see --help)\n")


def fail(prog: str, message) -> int:
    """Say what is wrong in one line on stderr; the exit status of bad input (even where the
    line cannot be written: ``2>/dev/full``)."""
    try:
        print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
    except (OSError, ValueError):
        pass
    return USAGE_ERROR


def whole_number(minimum: int, maximum: int | None = None):
    """An argparse ``type``: an integer in ``[minimum, maximum]``."""

    def parse(text: str) -> int:
        bound = f"at least {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number {bound}, "
                                             f"got {text[:40]!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text[:40]}")
        return value

    return parse


def finite_number(minimum: float, maximum: float):
    """An argparse ``type``: a finite number in ``[minimum, maximum]`` (not nan, not 1e400)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text[:40]!r}") from None
        if not math.isfinite(value) or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be a finite number from {minimum:g} to "
                                             f"{maximum:g}, got {text[:40]}")
        return value

    return parse


def _path(text) -> str:
    """A path as a message quotes it: its repr, at most :data:`PATH_CHARS` characters of it."""
    return quoted(str(text), PATH_CHARS)


def _not_under_a_file(path: Path, name: str, itself: bool = False) -> None:
    """The nearest path above ``path`` that is there (or ``path``, with ``itself``) is a folder:
    not a file, nor a symbolic link to nowhere (making it failed "File exists", after the work)."""
    for parent in (path, *path.parents) if itself else path.parents:
        if not os.path.lexists(parent):
            continue
        if not os.path.exists(parent):  # a link: a loop is its OSError (_not_a_loop)
            _not_a_loop(parent)
            where = "is" if parent == path else f"goes through {_path(parent)},"
            raise ValueError(f"{name} {_path(path)} {where} a symbolic link to "
                             f"{_path(os.readlink(parent))}, which is not there: make that "
                             f"folder, or name another {name}")
        if not parent.is_dir():
            raise ValueError(f"{name} {_path(path)} is under {_path(parent)}, which is a "
                             f"file, not a directory")
        return


def _not_a_loop(path: Path) -> None:
    """The ``OSError`` of a path that is (or is under) a symbolic link loop, which ``exists()``
    reads as a new file: ``resolve()`` then raised ``RuntimeError`` (a traceback, or a line
    with no ``PROG: error:``)."""
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise


def _os_errors_named(check):
    """``check(text, name, ...)`` with an ``OSError`` met while looking at the path (a name too
    long for the system, a folder it may not search) refused as a ``ValueError`` naming it."""

    @functools.wraps(check)
    def checked(text: str, name: str, *args):
        try:
            return check(text, name, *args)
        except OSError as err:
            raise ValueError(f"{name} {_path(text)} cannot be used: {err.strerror or err}; "
                             f"name another path") from None

    return checked


def in_a_folder(text: str, name: str) -> None:
    """A ``ValueError`` for a relative path ``text`` to write when the current folder was
    removed under the terminal: the system said only "No such file or directory" (with no
    path, or naming ``text``), after the work (``ctrl_c.folder_deleted``)."""
    if os.path.isabs(text):
        return
    try:
        os.getcwd()
    except FileNotFoundError:
        raise ValueError(f"{name} {_path(text)}: "
                         f"{ctrl_c.folder_deleted('nothing can be written there')}") from None


def out_file(text: str, name: str = "OUT", example: str = "trace.json") -> Path:
    """``text`` as a file to write, refused before any work if it cannot be one: empty, a pipe
    or a device (an output is a new file renamed into its place, which would replace
    ``/dev/null`` for root), a folder (``newdir/`` too, which ``Path`` would read as a file
    ``newdir``), under a file, a symbolic link loop, or a path the system refuses to look at."""
    return _out_file(text, name, example)


@_os_errors_named
def _out_file(text: str, name: str, example: str) -> Path:
    if not text.strip():
        raise ValueError(f"{name} is empty: name the file to write, e.g. {example}")
    in_a_folder(text, name)
    out = Path(text)
    if out.exists() and not out.is_dir() and not out.is_file():
        raise ValueError(f"{name} {_path(text)} is a pipe or a device, not a file: the output is "
                         f"written as a new file renamed into its place, which replaces what is "
                         f"there rather than writing to it; name a file")
    if text.endswith(("/", os.sep)) or out.is_dir():
        raise ValueError(f"{name} {_path(text)} names a folder: name a file in it, e.g. "
                         f"{_path(out / example)}")
    _not_under_a_file(out, name)
    _not_a_loop(out)
    return out


def not_an_input(text: str, name: str, inputs: dict) -> None:
    """Refuse the output file ``text`` (passed by :func:`out_file`: no link loop) if it is one of
    the files the command reads, ``inputs`` (path -> what it is, for the message), by any
    spelling: ``./x``, a symbolic link.  A hard link is another name of the file: the output is
    written under a new name and renamed into place, so the input stays whole."""
    target = Path(text).resolve()
    for path, what in inputs.items():
        if target == Path(path).resolve():
            raise ValueError(f"{name} {_path(text)} names {what}, which the command reads: "
                             f"writing it would overwrite that; choose another name")


def out_folder(text: str, name: str = "--out") -> Path:
    """``text`` as a folder to write into (made if missing), refused before any work if it is
    empty, an existing file, under a file, a symbolic link loop, or a path the system refuses
    to look at."""
    return _out_folder(text, name)


@_os_errors_named
def _out_folder(text: str, name: str) -> Path:
    if not text.strip():
        raise ValueError(f"{name} is empty: name the folder to write into")
    in_a_folder(text, name)
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{name} {_path(text)} is a file, not a folder: name a folder")
    _not_under_a_file(out, name, itself=True)
    _not_a_loop(out)
    return out


def os_problem(err: OSError) -> str:
    """What an ``OSError`` says, in one line that names the path (not a traceback), or says it
    was standard output that could not be written (:class:`_Stdout`)."""
    what = err.strerror or err
    if getattr(err, "on_stdout", False):
        return f"cannot write to standard output ({what}): what the command printed is incomplete"
    return f"{what}: {_path(err.filename)}" if err.filename else printable(what)


def emit(text: str) -> None:
    """Print ``text`` to stdout; a reader that closed the pipe early stops it quietly."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        exit_quietly_on_broken_pipe()


def progress(text: str) -> None:
    """Print a progress line of a command whose product is files (``executing a.ipynb``).  A
    reader that closed the pipe (``| head -1``) does not stop the work: what is printed from
    then on is dropped, and the command ends by its work's result.  Ending quietly there, as
    :func:`emit` does for a command whose output is its product, skipped the rest of the files
    and exited 0."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _point_stdout_at_devnull()


def exit_quietly_on_broken_pipe() -> None:
    """Point stdout at /dev/null (so the interpreter's last flush cannot fail) and exit 0: the
    reader took what it wanted."""
    _point_stdout_at_devnull()
    raise SystemExit(0)


class _Stdout:
    """``sys.stdout`` while a command runs: an ``OSError`` writing it is marked as stdout's, so
    that ``> /dev/full`` is not reported as a problem with the command's own files (the stream
    drops what it could not write: flushing again afterwards succeeds and tells nothing).  The
    first such error is kept in :attr:`lost`: argparse's ``--help`` swallows it."""

    def __init__(self, stream):
        self._stream = stream
        self.lost: OSError | None = None

    def _marked(self, call, *args):
        try:
            return call(*args)
        except OSError as err:
            err.on_stdout = True
            self.lost = self.lost or err
            raise

    def write(self, text):
        return self._marked(self._stream.write, text)

    def flush(self):
        return self._marked(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _Stderr:
    """``sys.stderr`` while a command runs: a line that cannot be written (``2>/dev/full``, a
    reader gone) is dropped.  Raising would end the command with exit status 1 (or 0, the
    ``BrokenPipeError`` taken for stdout's reader leaving) after work half done, although the
    exit status alone can still say what happened."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _standard_streams() -> None:
    """stdout and stderr as :func:`run` needs them.  Characters the streams cannot encode
    (``PYTHONIOENCODING=ascii``, a Latin-1 locale and a CJK folder) are written as backslash
    escapes instead of a ``UnicodeEncodeError`` after the work is done (or blamed on the input).
    A descriptor closed at start (``cmd >&-``: Python makes the stream ``None``) is pointed at
    /dev/null, so that output is dropped (as Python does) and no file the command opens takes
    descriptor 1 or 2 and receives what is printed -- nor a child's (:func:`_devnull_at`)."""
    for fd in (1, 2):  # both before a stream is opened: one took the other's descriptor
        try:
            os.fstat(fd)
        except OSError:
            _devnull_at(fd)
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))
        try:
            getattr(sys, name).reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):  # no real text stream (captured in-process)
            pass
    if not isinstance(sys.stdout, _Stdout):
        sys.stdout = _Stdout(sys.stdout)
    if not isinstance(sys.stderr, _Stderr):
        sys.stderr = _Stderr(sys.stderr)


def _devnull_at(fd: int) -> None:
    """Descriptor ``fd`` open on /dev/null and inherited by the command's children.  With ``fd``
    closed, ``os.open`` returns ``fd`` itself, close-on-exec, and ``dup2(fd, fd)`` changed
    nothing: a Jupyter kernel started with stdout or stderr closed and died in its start-up."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    if devnull != fd:
        os.dup2(devnull, fd)
        os.close(devnull)
    os.set_inheritable(fd, True)


def _point_stdout_at_devnull() -> None:
    """So that the interpreter's last flush cannot fail again at exit."""
    try:
        _devnull_at(sys.__stdout__.fileno())
    except (OSError, ValueError, AttributeError):  # no real file (captured in-process)
        pass


def run(prog: str, main) -> None:
    """A command's ``__main__``: ``main()``'s exit status, its output flushed while the command
    can still say what went wrong.  What ``main`` did not catch ends in one line, not a
    traceback: a reader that closed the pipe, quietly (exit 0, or ``main``'s status); a stdout
    that cannot be written (``> /dev/full``), naming it (exit 2); any other ``OSError`` (a
    socket path too long for the system, a file gone mid-read), naming it (exit 2); Ctrl-C
    (exit 130), even one that something ``main`` called swallowed, or one while the
    interpreter's finalizers run after it; SIGTERM or SIGHUP, by that signal once ``main``'s
    ``finally`` blocks have cleaned up (:mod:`overlap_course.ctrl_c`).  A closed or unwritable
    stderr, a closed stdout and a character the terminal cannot encode change none of this:
    :func:`_standard_streams`."""
    _standard_streams()
    ctrl_c.running(prog)
    try:
        try:
            status = main()
        except SystemExit as done:  # argparse's --help: its output is flushed below, or refused
            status = done.code
        finally:
            ctrl_c.ending()
        try:
            sys.stdout.flush()
        except BrokenPipeError:  # the reader took what it wanted; main's status still stands
            _point_stdout_at_devnull()
        lost = getattr(sys.stdout, "lost", None)
        if isinstance(lost, BrokenPipeError):  # a reader gone is no failure of the command
            lost = None
        if lost is not None and status in (0, None):  # a write that failed and was swallowed
            raise lost
        if ctrl_c.pressed() and status != INTERRUPTED:  # swallowed on its way up: still a Ctrl-C
            status = interrupted(prog)
        if ctrl_c.killed():  # a kill swallowed on its way up: the command still ends by it
            ctrl_c.die_of(ctrl_c.killed())
    except ctrl_c.Killed as kill:  # its ``finally`` blocks have cleaned up: now end as killed
        ctrl_c.die_of(kill.signum)
    except BrokenPipeError:
        exit_quietly_on_broken_pipe()
    except KeyboardInterrupt:
        status = interrupted(prog)
    except OSError as err:
        if getattr(err, "on_stdout", False):
            _point_stdout_at_devnull()
        status = fail(prog, os_problem(err))
    raise SystemExit(status)

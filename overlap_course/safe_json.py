"""One reader for JSON the course did not write: trace files, the progress service's request
bodies, the lines of a learner's progress record.

``json.loads`` alone trusts its input: a file of 100,000 ``[`` exhausts the recursion limit
(``RecursionError``), a 400-digit integer becomes a Python int that ``float()`` cannot hold
(``OverflowError`` later, far from the file), ``1e400`` becomes ``inf`` and ``NaN`` is read
although it is not JSON.  :func:`loads` bounds all of that before anything else sees the data,
and every refusal is a :class:`JSONRefused` (a ``ValueError``) that names what was read.

Standard library only, importing nothing from the course: ``progress.py`` and the service use
it where the hub has only these files (docs/jupyterhub.md).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import signal
import stat
import tempfile

__all__ = ["MAX_DEPTH", "MAX_NUMBER_CHARS", "JSONRefused", "loads", "dumps", "NotAFile",
           "open_regular", "refuse_unwritable", "write_whole", "whole_set", "signals_held",
           "write_file", "read_text",
           "printable", "clipped", "quoted", "message_line", "utf8_text", "name_text",
           "EXCERPT_CHARS", "MAX_MESSAGE_CHARS"]

#: Deepest nesting of arrays and objects read (a Kineto trace nests 4 deep, a verdict 1).
MAX_DEPTH = 64
#: Longest number literal read (a nanosecond timestamp has 19 digits).
MAX_NUMBER_CHARS = 40

# A JSON string (escapes included): removed before brackets are counted, so "[" in a name
# is not nesting.  The closing quote is optional: a string never closed is matched to the end
# of the text at once (json refuses it after), instead of the search failing and starting
# again at each later quote, which took quadratic time on '"' followed by many '\\"'.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")


#: The most characters of an input that a message quotes (then "..." and its length).
EXCERPT_CHARS = 60


def printable(text) -> str:
    """``str(text)`` with every character that is not printable -- a line break, a terminal
    escape (``ESC[31m``), a lone surrogate that UTF-8 cannot encode -- written as its Python
    escape (``\\n``, ``\\x1b``, ``\\ud800``): shown on a terminal, it cannot forge a line or
    colour one, and it always encodes."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def clipped(text, limit: int) -> str:
    """A field (a category, a path) as a view shows it: at most ``limit`` characters, then
    ``...``, with what is not printable escaped (:func:`printable`: no forged row)."""
    text = str(text)
    return printable(text[:limit]) + ("..." if len(text) > limit else "")


def quoted(value, limit: int = EXCERPT_CHARS) -> str:
    """``value`` as a message quotes it: its ``repr`` if a str (escapes included), else its
    ``str``, at most ``limit`` characters of it, then ``...`` and how long it was.  A value
    nested too deep for ``str`` (a tuple in a tuple 100,000 times) is named by its type."""
    try:
        text = value if isinstance(value, str) else str(value)
    except RecursionError:
        return f"a {type.__dict__['__name__'].__get__(type(value))} nested too deep to show"
    head = text[:limit]
    shown = repr(head) if isinstance(value, str) else printable(head)
    return shown if len(text) <= limit else f"{shown}... ({len(text)} characters)"


#: The longest message line written (a refusal quoting a 100 KB argument is cut to this).
MAX_MESSAGE_CHARS = 1000
_LONG_QUOTE = re.compile(r"'([^'\\]{200})[^']{50,}'")


def message_line(text, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` as one line of a message: not printable characters escaped (:func:`printable`,
    so no line break), a quoted span longer than 250 characters cut to its first 200 and
    ``...`` (argparse quotes a bad argument whole), and a line still longer than ``limit``
    cut in the middle."""
    text = _LONG_QUOTE.sub(lambda m: f"'{m.group(1)}'...", printable(text))
    if len(text) > limit:
        text = f"{text[: limit - 200]} ... {text[-150:]}"
    return text


class JSONRefused(ValueError):
    """JSON that :func:`loads` will not read; the message says which input and why."""


def _outside_strings(text: str) -> str:
    """``text`` without its string literals.  With no backslash there is no escaped quote, so
    the strings lie between the 1st and 2nd quote, the 3rd and 4th...: a split, about twice as
    fast as the regex on a trace (most have no backslash at all)."""
    if "\\" not in text:
        return "".join(text.split('"')[::2])
    return _STRING.sub("", text)


def _depth(text: str, limit: int) -> int:
    """The deepest nesting of ``[`` and ``{`` in ``text`` outside strings, or ``limit + 1`` if
    deeper: each pass removes the innermost pairs (one regex pass per level, not a Python loop
    per character); brackets that do not pair up (a file cut short) are counted one by one."""
    brackets = _NOT_BRACKET.sub("", _outside_strings(text))
    levels = 0
    while brackets and levels <= limit:
        inner = _INNERMOST.sub("", brackets)
        if len(inner) == len(brackets):
            break
        brackets, levels = inner, levels + 1
    depth = deepest = 0
    for ch in brackets[: 2 * limit + 2]:  # what is left: unpaired, so json will refuse it anyway
        depth += 1 if ch in "[{" else -1
        deepest = max(deepest, depth)
    return min(levels + deepest, limit + 1)


def _number_reader(what: str, max_chars: int):
    """``parse_int`` / ``parse_float`` hooks that refuse long literals and infinite values."""

    def check(literal: str) -> str:
        if len(literal) > max_chars:
            raise JSONRefused(f"{what} has a number {len(literal)} characters long "
                              f"({literal[:12]}...); at most {max_chars} are read")
        return literal

    def read_int(literal: str) -> int:
        return int(check(literal))

    def read_float(literal: str) -> float:
        value = float(check(literal))
        if not math.isfinite(value):
            raise JSONRefused(f"{what} has the number {literal}, too large for a float")
        return value

    return read_int, read_float


def _constant(what: str):
    def refuse(name: str):
        raise JSONRefused(f"{what} has {name}, which is not JSON (a number must be finite)")

    return refuse


def loads(data: str | bytes, what: str = "the JSON", *, max_depth: int = MAX_DEPTH,
          max_number_chars: int = MAX_NUMBER_CHARS):
    """``data`` (text, or UTF-8 bytes) parsed as JSON, refused with a :class:`JSONRefused`
    naming ``what`` when it is not UTF-8, not JSON, nested deeper than ``max_depth``, or has a
    number longer than ``max_number_chars`` characters, infinite, or ``NaN``."""
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise JSONRefused(f"{what} is not UTF-8 text (byte {exc.start}): not JSON") from None
    if not isinstance(data, str):
        raise TypeError(f"loads reads str or bytes, got {type(data).__name__}")
    depth = _depth(data, max_depth)
    if depth > max_depth:
        raise JSONRefused(f"{what} nests arrays/objects more than {max_depth} deep, deeper than "
                          f"this course reads")
    read_int, read_float = _number_reader(what, max_number_chars)
    try:
        return json.loads(data, parse_int=read_int, parse_float=read_float,
                          parse_constant=_constant(what))
    except json.JSONDecodeError as exc:  # "Unterminated string starting at": not "at at line"
        raise JSONRefused(f"{what} is not valid JSON ({re.sub(' at:?$', '', exc.msg)} at line "
                          f"{exc.lineno}, column {exc.colno})") from None


def utf8_text(text: str) -> str:
    """``text`` as UTF-8 can encode it: a lone surrogate (``\\udcff``, which Python holds for a
    file name's byte 0xff that is not UTF-8) written as its Python escape, as messages write it
    (:func:`printable`, :func:`quoted`).  JSON holding a lone surrogate is not interchangeable
    (RFC 8259 sec. 8.2): strict parsers refuse it.  File names: :func:`name_text`."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return "".join(repr(c)[1:-1] if "\ud800" <= c <= "\udfff" else c for c in text)


def name_text(name) -> str:
    """A file name as the course's JSON writes it: a backslash as ``\\\\`` and a byte that is
    not UTF-8 as ``\\udcff`` (:func:`utf8_text`), as :func:`quoted` writes both.  With the byte
    alone escaped, ``b'a\\xffb'`` was written as the name ``a\\xffb``, another file's."""
    return utf8_text(os.fspath(name).replace("\\", "\\\\"))


def _utf8_strings(value):
    """``value`` with every string in it (a key too) :func:`utf8_text`."""
    if isinstance(value, str):
        return utf8_text(value)
    if isinstance(value, dict):
        return {_utf8_strings(k): _utf8_strings(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_utf8_strings(v) for v in value]
    return value


def dumps(value, what: str = "the output", **kwargs) -> str:
    """``json.dumps`` that refuses NaN and infinities (they are not JSON) with a message naming
    ``what``, instead of writing them, and writes no lone surrogate (:func:`utf8_text`; a file
    name in it is the caller's :func:`name_text`)."""
    try:
        return json.dumps(_utf8_strings(value), allow_nan=False, **kwargs)
    except ValueError:
        raise JSONRefused(f"{what} has a number that is not finite (NaN or infinity), "
                          f"which JSON cannot hold") from None


class NotAFile(ValueError):
    """A path to read that is a folder, a pipe or a device."""


def open_regular(path, what: str):
    """``path`` opened for reading in binary, if it is a regular file; anything else is a
    ``ValueError`` naming ``what``: a FIFO would block the open until a writer came, and a
    device such as ``/dev/zero`` never ends.  Opened without blocking, then asked what it is."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotAFile(f"{what} is not a file (a folder, a pipe or a device)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _not_a_file_to_write(what: str) -> NotAFile:
    return NotAFile(f"{what} is not a file (a folder, a pipe or a device): writing there would "
                    f"wait for a reader or fail; remove it or write elsewhere")


def refuse_unwritable(path, what: str) -> None:
    """A ``NotAFile`` naming ``what`` if ``path`` exists and is not a regular file (a FIFO would
    block whoever writes it, another program included); a missing path is fine."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise _not_a_file_to_write(what)


def write_whole(path, write) -> None:
    """``write(part)`` makes the new file at ``part`` (a new folder beside ``path``, the same
    name: torch names an archive's records after it), then ``part`` replaces ``path`` in one
    rename.  Writing in place left a full disk's or a Ctrl-C's half-written file; this way
    ``path`` is whole or as it was, no folder is left, and an ``OSError`` names ``path``.
    Making the folder and removing it are held from Ctrl-C and kills (:class:`signals_held`):
    one arriving there left the folder, made but not yet named, or half removed."""
    path = os.fspath(path)
    folder = None
    try:
        with signals_held():
            folder = tempfile.mkdtemp(dir=os.path.dirname(path) or ".",
                                      prefix=f".{os.path.basename(path)[:100]}.", suffix=".partial")
        part = os.path.join(folder, os.path.basename(path))
        write(part)
        os.replace(part, path)
    except OSError as exc:  # the temporary's name would send the reader to the wrong file
        raise OSError(exc.errno, exc.strerror, path) from None
    finally:
        with signals_held():
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


#: Held around renames that must happen together: Ctrl-C, ``kill`` and a closed terminal.
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class signals_held:
    """Ctrl-C, SIGTERM and SIGHUP held while the block runs, delivered when it ends: around
    renames that must happen together (a new file and its partner, a new folder in the old
    one's place), one between them would leave one new beside one old, or no site at all.  A
    handler that notes the signal, not a blocked signal: the kernel gives a process's signal to
    any thread that does not block it (torch's), and Python's handler then runs in the main
    thread all the same.  Main thread only; elsewhere a no-op."""

    def __enter__(self):
        self._got, self._before = [], {}
        for signum in HELD_SIGNALS:
            before = signal.getsignal(signum)
            if before is None:  # a handler set outside Python, which could not be put back
                continue
            try:
                signal.signal(signum, self._note)
            except ValueError:  # not the main thread: signals are not its to handle
                break
            self._before[signum] = before
        return self

    def _note(self, signum, frame) -> None:
        self._got.append(signum)

    def __exit__(self, *exc):
        for signum, before in self._before.items():
            signal.signal(signum, before)
        for signum in dict.fromkeys(self._got):  # each, now, to whoever handled it before
            signal.raise_signal(signum)


class whole_set:
    """A set of files written all or none (a trace pair; two profiles and their summary), in a
    ``with`` block: each is written beside its target under a new name (:meth:`part`), and they
    are renamed into place only when the block ends without an exception, together, under
    :class:`signals_held`; otherwise their temporary files are removed and no target is touched.
    Each written in place as it was made, a Ctrl-C or a failure before the last left one run's
    file beside another run's.  An ``OSError`` names the target, not its temporary file.
    ``check`` (``out_folders.locked.still_held``), if given, is called before each file is made
    and before the renames: it raises if they must not happen."""

    def __init__(self, check=None):
        self._parts: dict[str, str] = {}
        self._check = check or (lambda: None)

    def __enter__(self):
        return self

    def part(self, path, suffix: str = "") -> str:
        """A new empty file beside ``path`` to write its content into, ending in ``suffix``
        (``.json.gz``: gzip goes by the name); a folder, a pipe or a device at ``path`` is a
        ``NotAFile``.  The name is random: a fixed one was taken by a ``kill -9``'s leftover
        (or a pipe).  ``path``'s name is cut to 100 characters, so that the new one fits."""
        path = os.fspath(path)
        self._check()
        refuse_unwritable(path, quoted(path, 200))
        folder, name = os.path.split(path)
        with signals_held():  # made and noted together: a Ctrl-C between them left the file
            while True:
                part = os.path.join(folder or ".", f".{name[:100]}.{secrets.token_hex(6)}"
                                                   f".partial{suffix}")
                try:
                    os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                    break
                except FileExistsError:
                    continue
                except OSError as exc:
                    raise OSError(exc.errno, exc.strerror, path) from None
            self._parts[path] = part
        return part

    def __exit__(self, kind, value, trace):
        try:
            if kind is None:
                with signals_held():  # a Ctrl-C or a kill between two renames: one new, one old
                    self._check()
                    for path, part in list(self._parts.items()):
                        try:
                            os.replace(part, path)
                        except OSError as exc:
                            raise OSError(exc.errno, exc.strerror, path) from None
                        del self._parts[path]
        finally:
            with signals_held():
                for part in self._parts.values():
                    try:
                        os.remove(part)
                    except FileNotFoundError:
                        pass
        if isinstance(value, OSError) and isinstance(value.filename, (str, os.PathLike)):
            targets = {part: path for path, part in self._parts.items()}  # a part's write failed
            path = targets.get(os.fspath(value.filename))
            if path is not None:
                raise OSError(value.errno, value.strerror, path) from None


def write_file(path, data, what: str) -> None:
    """``data`` (bytes, or text written as UTF-8) written whole to the regular file ``path``
    (:func:`write_whole`); a FIFO or a folder there is a ``NotAFile`` naming ``what``."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    refuse_unwritable(path, what)

    def write(part):
        with open(part, "xb") as f:
            f.write(data)
    write_whole(path, write)


def read_text(path, what: str, max_bytes: int) -> str:
    """The UTF-8 text of the regular file ``path``, of at most ``max_bytes``; anything else is
    a ``ValueError`` naming ``what``: a folder, a FIFO or a device refused without waiting for
    it (:func:`open_regular`), a longer file (``/dev/zero`` is never read), bytes that are not
    UTF-8, a path the system cannot open.  A missing file is a ``FileNotFoundError``."""
    try:
        with open_regular(path, what) as f:
            data = f.read(max_bytes + 1)
    except (FileNotFoundError, NotAFile):
        raise
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise ValueError(f"{what} cannot be read: {getattr(exc, 'strerror', None) or exc}"
                         ) from None
    if len(data) > max_bytes:
        raise ValueError(f"{what} has more than {max_bytes} bytes, more than it may have")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} is not UTF-8 text (byte {exc.start})") from None

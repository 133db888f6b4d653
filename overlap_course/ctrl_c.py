"""Ctrl-C in a course command, from its first line of course code to its end: one line,
``PROG: interrupted``, and exit status 130 -- never a ``KeyboardInterrupt`` traceback, never a
command that runs on or exits 0.  (The progress service, which its hub stops with SIGINT, stops
cleanly instead: exit status 0, no line.)

Tiny on purpose: it imports only modules Python loaded at its start (``_signal``, not
``signal``), so that it takes over before anything else is imported.  ``python -m
overlap_course.X`` runs the package's ``__init__`` first, then X's parent packages (the kineto
package imports its readers, ``measure`` torch), then X: the ``__init__`` holds SIGINT back (a
Ctrl-C waits) while it imports this module and calls :func:`from_the_start`.  A script
(``site/build.py``, ``scripts/run_tests.py``) calls :func:`interruptible` on its first line, as
every command's module does (where it starts when run another way, by ``runpy``); a script
blocks SIGINT before it imports this module and hands the mask to it.  Before all this,
Python's own start (``site``, about 10 ms) is under Python's default.
Every command passes here first, so this is also where a command started in a folder removed
under its terminal learns it (:class:`_NoFolderForTorch`: torch's import refused in one line).

A command's Ctrl-C, phase by phase:

* starting (:func:`interruptible`), its imports: the line, and the process ends at once
  (``os._exit``): nothing has started that needs closing, and an exception could be swallowed
  (torch's import clears any exception raised while it imports numpy);
* running (:func:`running`, from ``command_line.run``): a ``KeyboardInterrupt``, which the
  command catches to close its engines, remembered in case something swallows it (:class:`_CtrlC`);
* ending (:func:`ending`, once ``main`` returned or raised): the interpreter's finalizers (threads
  joined; ``atexit`` callbacks: torch's, multiprocessing's, an engine's ``close``) run to their
  end, then the line and exit status 130 (:func:`_last`, the ``atexit`` callback registered
  first, so run last); a second Ctrl-C ends the process at once;
* finished (after :func:`_last`): ignored -- the command ended with its own exit status (Python
  would otherwise drop the handler and die of the signal without a word).

A SIGTERM (``kill``, ``timeout``) or SIGHUP (a closed terminal) while a command runs is a
:class:`Killed`, so that its ``finally`` blocks remove what it half-wrote (a
``.NAME.XXXX.partial`` folder), then the command ends by that signal (:func:`die_of`), as by
default; held like Ctrl-C around renames that must happen together (``safe_json.signals_held``).
"""

import _signal
import os
import sys

__all__ = ["INTERRUPTED", "KILLS", "Killed", "interrupted", "interruptible", "from_the_start",
           "importing", "running", "ending", "pressed", "killed", "die_of"]

#: The exit status of a command stopped by Ctrl-C (128 + SIGINT, what a shell reports).
INTERRUPTED = 130
#: Modules their hub stops with SIGINT: a clean stop, exit status 0 and no line.
_SERVICES = frozenset({"overlap_course.progress_service"})

_prog = "python"  # the command's name in its line
_last_registered = False
_said = False  # the line is written
_presses = 0  # Ctrl-Cs once main returned


def interrupted(prog: str) -> int:
    """Say in one line that Ctrl-C stopped the command (instead of a ``KeyboardInterrupt``
    traceback from deep in torch or multiprocessing); the caller has closed its engines on the
    way out.  The exit status a shell gives a SIGINT."""
    global _said
    _said = True
    try:
        sys.stderr.write(f"{prog}: interrupted\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # no stderr (``2>&-``), or it cannot be written
        pass
    return INTERRUPTED


def interruptible(module: str, prog: str, held=None) -> None:
    """A command's first line, before its heavy imports: run as ``__main__``, a Ctrl-C from here
    until ``command_line.run`` takes over (torch takes seconds to import) says ``PROG:
    interrupted`` and ends the process with 130.  A Ctrl-C the process ignores (started in the
    background, ``nohup``) stays ignored; imported as a module (a notebook, a test) nothing
    changes.  ``held``: the signal mask a script had before it blocked SIGINT for its import of
    this module, restored once the handler is set (a Ctrl-C held meanwhile lands then)."""
    global _prog, _last_registered
    try:
        if module != "__main__":
            return
        _NoFolderForTorch.watch(prog)
        handler = _signal.getsignal(_signal.SIGINT)
        if handler not in (_signal.default_int_handler, _stop_now):
            return
        _prog = prog
        _signal.signal(_signal.SIGINT, _stop_now)
        if not _last_registered:
            import atexit  # here: an import, interruptible now

            atexit.register(_last)
            _last_registered = True
    finally:
        if held is not None:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, held)


def folder_deleted(why: str) -> str:
    """What a command started in a folder removed under its terminal says (``why``: what fails
    there): torch's import (:class:`_NoFolderForTorch`), an output named relative to it
    (``command_line.in_a_folder``), where the system's own words named no folder."""
    return f"the current folder was deleted ({why}): cd to a folder that exists and run it again"


class _NoFolderForTorch:
    """An import finder, set by a command started in a folder removed under its terminal: torch's
    import is refused with one line naming that, exit status 2.  Torch cannot load there (MKL
    dies, blaming ``libtorch_cpu.so``: a false reason); a command that needs no torch (``trace
    summary``) still runs."""

    def __init__(self, prog: str):
        self._prog = prog

    @classmethod
    def watch(cls, prog: str) -> None:
        try:
            os.getcwd()
        except FileNotFoundError:
            if not any(isinstance(f, cls) for f in sys.meta_path):
                sys.meta_path.insert(0, cls(prog))

    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            try:
                sys.stderr.write(f"{self._prog}: error: "
                                 f"{folder_deleted('torch cannot load there')}\n")
                sys.stderr.flush()
            except (AttributeError, OSError, ValueError):  # no stderr, or it cannot be written
                pass
            raise SystemExit(2)
        return None


def from_the_start() -> None:
    """Called by the package's ``__init__`` while Python locates the module X of ``python -m X``:
    X's rule from here, before X's parent packages import anything (:func:`_module_run`)."""
    name = _module_run()
    if not name.startswith("overlap_course."):
        return
    if name in _SERVICES:
        if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
            _signal.signal(_signal.SIGINT, _stop_cleanly)
        return
    interruptible("__main__", f"python -m {name}")


def _module_run() -> str:
    """X of ``python -m X`` while Python locates it: ``sys.argv`` is then ``["-m", ARG, ...]``
    and ends ``sys.orig_argv``, where X is the argument before the ARGs (``X``, or ``-mX``,
    ``-PmX``: options that take no value, then ``m``)."""
    named = sys.orig_argv[-len(sys.argv)]
    return named[named.index("m") + 1:] if named.startswith("-") else named


def _stop_now(signum, frame) -> None:
    interrupted(_prog)
    os._exit(INTERRUPTED)


def _stop_cleanly(signum, frame) -> None:
    """The progress service's rule (its own first lines install the same): the hub's stop."""
    sys.exit(0)


class _CtrlC:
    """While a command runs, Ctrl-C is a ``KeyboardInterrupt`` as by default, which the command
    catches to close its engines on the way out -- and it is remembered, because code the
    command calls can swallow it: torch's first import clears any exception its import of
    numpy raised (measured here: a site build given Ctrl-C 0.25-0.32 s into staging, while
    torch imported, ran on to the end and exited 0 in 6 of 8 tries).  A command that ran on
    says so at the end."""

    pressed = False

    def __call__(self, signum, frame):
        self.pressed = True
        raise KeyboardInterrupt


_CTRL_C = _CtrlC()  # the handler itself: a handler is recognised by identity


def running(prog: str) -> None:
    """From ``command_line.run`` on, Ctrl-C is a ``KeyboardInterrupt`` (:class:`_CtrlC`): while
    the command started, it ended the process.  A Ctrl-C the process ignores stays ignored."""
    global _prog
    _prog = prog
    if _signal.getsignal(_signal.SIGINT) in (_stop_now, _signal.default_int_handler):
        _signal.signal(_signal.SIGINT, _CTRL_C)
    _KILL.pid = os.getpid()
    for signum in KILLS:  # one ignored (``nohup``) or handled by whoever imported us: kept
        if _signal.getsignal(signum) == _signal.SIG_DFL:
            _signal.signal(signum, _KILL)


#: What ``kill``/``timeout`` (SIGTERM) and a closed terminal (SIGHUP) send: they end a command.
KILLS = (_signal.SIGTERM, _signal.SIGHUP)


class Killed(BaseException):
    """A SIGTERM or SIGHUP while a command ran: raised so that its ``finally`` blocks remove
    what it half-wrote (the default ended the process there and then), then the command ends
    by that signal (:func:`die_of`).  Not an ``Exception``: nothing that handles errors
    catches it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _Kill:
    """The SIGTERM/SIGHUP handler while a command runs: a :class:`Killed`, remembered as a
    Ctrl-C is (:class:`_CtrlC`).  A child forked from the command (multiprocessing) inherits
    the handler but is not the command: there the signal ends it as by default (``terminate``
    sends SIGTERM).  A second kill while the command cleans up ends it at once."""

    def __init__(self):
        self.pid, self.signum = None, None

    def __call__(self, signum, frame):
        if os.getpid() != self.pid or self.signum:
            die_of(signum)
        self.signum = signum
        raise Killed(signum)


_KILL = _Kill()


def die_of(signum: int) -> None:
    """End the process by ``signum`` as its default would (exit status -SIGNUM to a parent,
    what a shell reports as 128 + SIGNUM), once what must be cleaned up is."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    _signal.signal(signum, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # not reached: the signal ends the process


def killed() -> int | None:
    """The SIGTERM or SIGHUP that reached the running command, even one something swallowed."""
    return _KILL.signum


def pressed() -> bool:
    """Whether a Ctrl-C reached the running command, even one that something swallowed."""
    return _CTRL_C.pressed


def ending() -> None:
    """Once ``main`` returned or raised: a Ctrl-C waits for the interpreter's finalizers, then
    ends the command (:func:`_last`); a second one ends it at once."""
    if _last_registered and _signal.getsignal(_signal.SIGINT) is _CTRL_C:
        _signal.signal(_signal.SIGINT, _late)
    for signum in KILLS:  # nothing left half-written: a kill ends the process at once again
        if _signal.getsignal(signum) is _KILL:
            _signal.signal(signum, _signal.SIG_DFL)


def _late(signum, frame) -> None:
    global _presses
    _presses += 1
    if _presses > 1:
        _stop_now(signum, frame)


def _last() -> None:
    """The ``atexit`` callback registered first, so the last to run: a Ctrl-C pressed while the
    finalizers ran ends the command now, with its output written, the line (once) and 130.
    Otherwise the command has finished: a Ctrl-C from here changes nothing."""
    if _presses:
        _signal.signal(_signal.SIGINT, _stop_now)  # a second one while the output is written
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):  # none, closed, or a reader gone
                pass
        if not _said:
            interrupted(_prog)
        os._exit(INTERRUPTED)
    if _signal.getsignal(_signal.SIGINT) in (_stop_now, _CTRL_C, _late):
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)


class importing:
    """Around a command's late import of torch (``trace export`` imports the engine only when
    it runs): Ctrl-C ends the process at once, as while it started (:func:`interruptible`) --
    torch would swallow a ``KeyboardInterrupt`` (:class:`_CtrlC`).  Nothing may be open or
    half-written in the block.  Imported as a module: nothing changes."""

    def __init__(self, prog: str):
        self._prog = prog
        self._ours = False

    def __enter__(self):
        global _prog
        self._ours = _signal.getsignal(_signal.SIGINT) is _CTRL_C
        if self._ours:
            _prog = self._prog
            _signal.signal(_signal.SIGINT, _stop_now)
        return self

    def __exit__(self, *exc) -> None:
        if self._ours:
            _signal.signal(_signal.SIGINT, _CTRL_C)

"""What keeps a check fair when the learner's code misbehaves: a time limit, and the
toy's modules, classes and shared engines restored to what they were.

A check runs code that may loop forever, catch ``BaseException``, or have patched the
toy in an earlier cell (``toy_engine.kernels.correct_seqlens_qk = stub``,
``toy_engine.engine.NUM_SLOTS = 1``, ``Engine.process_outputs = ...``).  None of that
may hang the notebook, or make a later, correct answer fail with a message that blames
its author: the limit stops the code and says where it was, and what an earlier cell
changed is put back and named in the verdict.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import sysconfig
import time
import types

import toy_engine

TIME_LIMIT_S = 30.0
_PACKAGE_DIR = os.path.dirname(os.path.abspath(toy_engine.__file__))
_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})


class TimeUp(BaseException):
    """Raised in the learner's own code once a check's time is up.  A BaseException, and
    raised again at every line of that code, so no ``except`` can keep it running."""

    def __init__(self, seconds: float, function: str, line: int):
        super().__init__(f"still running after {seconds:.0f} s, at line {line} of `{function}`")
        self.seconds, self.function, self.line = seconds, function, line


@functools.lru_cache(maxsize=512)
def _is_learners(filename: str) -> bool:
    """Code that is neither the toy's nor a library's: a notebook cell, an exercise, a test corpus."""
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    return not (path.startswith(_PACKAGE_DIR) or path.startswith(_LIBRARY_DIRS))


@contextlib.contextmanager
def time_limit(seconds: float = TIME_LIMIT_S):
    """Raise ``TimeUp`` in the learner's frames once ``seconds`` have passed.  The toy's
    own frames are never interrupted (they are not traced at all), so the engine is
    always between two of its calls when the limit strikes, as after an Interrupt."""
    deadline = time.monotonic() + seconds

    def in_learners_frame(frame, event, arg):
        if time.monotonic() > deadline:
            raise TimeUp(seconds, frame.f_code.co_name, frame.f_lineno)
        return in_learners_frame

    def on_call(frame, event, arg):
        return in_learners_frame(frame, event, arg) if _is_learners(frame.f_code.co_filename) else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(previous)


def _public_state(module: types.ModuleType) -> dict:
    return {name: value for name, value in vars(module).items() if not name.startswith("__")}


def _toy_modules() -> list[types.ModuleType]:
    return [m for name, m in sorted(sys.modules.items())
            if m is not None and (name == "toy_engine" or name.startswith("toy_engine."))
            and name.rsplit(".", 1)[-1] not in ("checkers", "practice", "sandbox")]


class Pristine:
    """The toy's modules and classes as they were when the checkers were imported."""

    def __init__(self) -> None:
        self.modules = {m.__name__: (m, _public_state(m)) for m in _toy_modules()}
        self.classes = {(name, cls_name): (cls, dict(vars(cls)))
                        for name, (m, state) in self.modules.items()
                        for cls_name, cls in state.items()
                        if isinstance(cls, type) and cls.__module__ == name}

    def restore(self) -> list[str]:
        """Put back every changed or added module attribute and class attribute; returns
        their names (``toy_engine.engine.NUM_SLOTS``) for the verdict."""
        changed = []
        for name, (module, state) in self.modules.items():
            now = vars(module)
            for attr, value in state.items():
                if now.get(attr, _MISSING) is not value:
                    changed.append(f"{name}.{attr}")
                    setattr(module, attr, value)
        for (name, cls_name), (cls, state) in self.classes.items():
            now = dict(vars(cls))
            for attr in now.keys() - state.keys():
                if attr.startswith("__"):
                    continue  # Python's own caches, e.g. copyreg's __slotnames__
                changed.append(f"{name}.{cls_name}.{attr}")
                delattr(cls, attr)
            for attr, value in state.items():
                if now.get(attr, _MISSING) is not value:
                    changed.append(f"{name}.{cls_name}.{attr}")
                    setattr(cls, attr, value)
        return changed


_MISSING = object()


def restored_note(changed: list[str]) -> str:
    """The sentence a verdict adds when an earlier cell had patched the toy."""
    if not changed:
        return ""
    names = ", ".join(f"`{n}`" for n in changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
    return (f" (Note: an earlier cell replaced {names}; it was restored for this check. Restart the kernel to "
            f"undo it everywhere.)")

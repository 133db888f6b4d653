"""The learner's kernel under ``nbgrader autograde``, fenced before its first cell.

The kernel runs the submission's cells first, as the grader's user, with no judge around it:
round six's cheat read the solution there and left it in ``/tmp`` for the judge's run of the
same cell, and round seven's would leave it in ``/dev/shm``, which the judge's engine must
share.  Fenced by Landlock (:mod:`overlap_course.build.landlock`) from the course's
``nbgrader_config.py`` (``c.Execute.extra_arguments``), the kernel reads the installation, the
system's folders and its own notebook's folder, and writes that folder, a temporary folder of
its own and shared memory: not the checkout's ``solutions/`` and ``source/``, the gradebook or other
learners' submissions.  Where the system has no Landlock it says so once and runs unfenced.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from overlap_course.build import landlock
from overlap_course.build.graded import ROOT

__all__ = ["fence", "KERNEL_ARGUMENTS"]

#: What the course's nbgrader_config.py gives the kernel: nbgrader's default (no history file)
#: and the fence, run by IPython before the first cell.
KERNEL_ARGUMENTS = ["--HistoryManager.hist_file=:memory:",
                    "--IPKernelApp.exec_lines=from overlap_course.build.kernel_fence import fence;"
                    " fence()"]


def fence() -> None:
    """Fence this kernel (and what it starts) to the installation and its own folder."""
    from overlap_course.build.judge_process import _protected_folders

    here = os.getcwd()
    # A temporary folder of its own: the shared one may hold anything (a course laid out there)
    tempfile.tempdir = os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="overlap-kernel-")
    readable = [*map(str, _protected_folders(ROOT)), *landlock.SYSTEM_READS,
                *landlock.SYSTEM_RUNS, *filter(None, sys.path)]
    writable = [here, tempfile.tempdir, *landlock.SYSTEM_WRITES]
    why_not = landlock.restrict([p for p in readable if not _holds_private(p)], writable)
    if why_not:
        print(f"overlap_course: the grading kernel runs unfenced: {why_not}", file=sys.stderr)


def _holds_private(path: str) -> bool:
    """A folder above the checkout's private ones (a path entry such as the checkout itself, or
    '' for the current folder) would open them all."""
    try:
        folder = Path(path).resolve()
    except OSError:
        return True
    return any((ROOT / name).resolve().is_relative_to(folder) for name in ("solutions", "source"))

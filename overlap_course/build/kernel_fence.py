"""The learner's kernel under ``nbgrader autograde``, fenced before it starts.

The kernel runs the submission's cells first, as the grader's user, with no judge around it:
round six's cheat read the solution there and left it in ``/tmp`` for the judge's run of the
same cell, and round seven's would leave it in ``/dev/shm``, which the judge's engine must
share.  Fenced by Landlock (:mod:`overlap_course.build.landlock`) as it starts (the course's
autograde steps run :func:`fenced_execute`), the kernel reads the installation, the system's
folders and its own notebook's folder, and writes that folder, a temporary folder of its own
and shared memory: not the checkout's ``solutions/`` and ``source/``, the gradebook or other
learners' submissions.  Where the system has no Landlock it says so once and runs unfenced.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from overlap_course.build import landlock
from overlap_course.build.graded import ROOT

__all__ = ["fence", "fenced_execute", "launch"]

# The kernel's command: ``python -I`` (nothing of the submission's folder on sys.path, no user
# site, no PYTHON* variables) running :func:`launch`, instead of ``python -m ipykernel_launcher``
_BOOT = "from overlap_course.build.kernel_fence import launch\nlaunch()\n"


def fenced_execute():
    """nbgrader's ``Execute`` with the kernel started fenced (the course's autograde steps).

    The fence was set by the kernel's ``exec_lines``, after ipykernel had started its threads:
    Landlock holds for the thread that asks and what it starts later, and round 31's cell
    queued code on ipykernel's IOPub thread, which read the solution and rewrote the gradebook
    from a process of its own; and ``-m ipykernel_launcher`` put the submission's folder first
    on sys.path, so a submitted ``ipykernel_launcher.py`` ran before any fence."""
    from jupyter_client import AsyncKernelManager
    from nbgrader.preprocessors import Execute

    class FencedKernelManager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            cmd = super().format_kernel_cmd(extra_arguments)
            if "ipykernel_launcher" not in cmd:
                raise RuntimeError(f"grade with the Python kernel (ipykernel), not: {cmd}")
            return [sys.executable, "-I", "-c", _BOOT, *cmd[cmd.index("ipykernel_launcher") + 1:]]

    class FencedExecute(Execute):
        def __init__(self, *args, **kwargs):
            kwargs["kernel_manager_class"] = FencedKernelManager  # nbgrader sets its own
            super().__init__(*args, **kwargs)

    return FencedExecute


def launch() -> None:
    """The grading kernel: fenced while it is this one thread, then ipykernel, given the
    arguments (``-f CONNECTION_FILE``, nbgrader's ``--HistoryManager.hist_file=:memory:``)."""
    if len(os.listdir("/proc/self/task")) != 1:
        raise SystemExit("overlap_course: the grading kernel has threads before its fence")
    connection = sys.argv[sys.argv.index("-f") + 1]
    os.environ["IPYTHONDIR"] = tempfile.mkdtemp(prefix="overlap-ipython-")  # writable below
    fence([connection, os.environ["IPYTHONDIR"]])
    sys.path.append(os.getcwd())  # a module beside the notebook, found after installed ones
    from ipykernel import kernelapp
    kernelapp.launch_new_instance()


def fence(own: list[str] = ()) -> None:
    """Fence this kernel (and what it starts) to the installation, its own folder and ``own``."""
    from overlap_course.build.judge_folders import protected

    here = os.getcwd()
    # A temporary folder of its own: the shared one may hold anything (a course laid out there)
    tempfile.tempdir = os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="overlap-kernel-")
    readable = [*map(str, protected(ROOT)), *landlock.SYSTEM_READS,
                *landlock.SYSTEM_RUNS, *filter(None, sys.path)]
    writable = [here, tempfile.tempdir, *own, *landlock.SYSTEM_WRITES]
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

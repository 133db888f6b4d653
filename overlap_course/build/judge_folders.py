"""The folders a judge process may read and write, and those its Landlock rules open to C code:
the installation (read, never written), the system's own folders, its own empty folder, and the
folders modules are imported from, but never the course's folder itself, which holds
``solutions/`` and ``source/``."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from overlap_course.build import landlock


def protected(root: Path) -> list[Path]:
    """What no judge process may write: the course, the toy, and the folders of the modules and
    start-up hooks (``*.pth``, ``sitecustomize``) the next ``python -I`` loads, and of the
    interpreter itself (a venv's ``bin/python`` replaced made every later judge a forger)."""
    paths = sysconfig.get_paths()
    folders = {root / "overlap_course", root / "toy_engine"}
    folders |= {Path(paths[k]) for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    folders |= {Path(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix,
                                  sys.base_exec_prefix, os.path.dirname(sys.executable))}
    return sorted({Path(os.path.realpath(f)) for f in folders})


def module_folders(root: Path) -> list[str]:
    """The folders modules are imported from (``sys.path``), but none at or above the course's
    folder: a ``.pth`` that names it (a path-based editable install: setuptools' compat mode,
    ``conda develop``) let C code in a cell read ``solutions/`` there (``torch.from_file``;
    Landlock's rules only allow, so no subfolder can be taken back).  The judge imports only
    the course's two packages from that folder, and those are readable by name."""
    root = root.resolve()
    return [p for p in filter(None, sys.path) if not root.is_relative_to(Path(p).resolve())]


def readable(protected: list[Path]) -> list[Path]:
    """What a judge process may read: the installation (what it may not write), the system's
    own folders, and its own empty folder.  Nothing else, so that no file another process left
    -- the learner's kernel, which ran the same cells first, unguarded, and could copy the
    solution to ``/tmp`` -- reaches the submission's cells in the judge."""
    return [*protected, Path(os.getcwd()).resolve(),
            *(Path(os.path.realpath(f)) for f in landlock.SYSTEM_READS)]

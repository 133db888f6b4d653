"""The files submitted beside a notebook (a helper module, a data file), which each judge finds
in its folder as the learner's kernel found them in the notebook's (round 39: a right loop that
the notebook imported from a submitted ``helpers.py`` scored 0, the judge's folder being empty).

They are read as nbgrader copied them, before the learner's kernel runs: the kernel may write
its folder, and without Landlock read the solution, so what it leaves there never reaches a
judge.  Only plain files at the top of the folder, not notebooks, and only those that were
plain files in ``submitted/`` too, or links to one beside them: nbgrader's copy follows a link,
and round 40's link to the instructor's source notebook arrived as a file holding the solution.
Up to a size: past it none are copied, and a verdict that did not pass says why."""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_FILES, MAX_BYTES = 100, 20 * 2**20  # a helper module or a data file, not a data set
NBGRADERS = frozenset({"timestamp.txt"})  # nbgrader's own, not the learner's: not counted
_KEY = "overlap_beside"  # where in nbgrader's resources they wait for the judge


def read_step():
    """nbgrader's preprocessor that reads them, placed before the kernel runs."""
    from nbgrader.preprocessors import NbGraderPreprocessor

    class ReadFilesBeside(NbGraderPreprocessor):
        def preprocess(self, nb, resources):
            from nbgrader.coursedir import CourseDirectory

            folder = resources.get("metadata", {}).get("path")  # nbgrader's: the notebook's
            who = resources.get("nbgrader", {})
            if not (folder and who.get("student") and who.get("assignment")):
                resources[_KEY] = ({}, "")
                return nb, resources
            course = CourseDirectory(config=self.config)
            submitted = course.format_path(course.submitted_directory, who["student"],
                                           who["assignment"])
            resources[_KEY] = read(Path(folder), Path(submitted))
            return nb, resources
    return ReadFilesBeside


def read(folder: Path, submitted: Path) -> tuple[dict[str, bytes], str]:
    """``{name: bytes}`` of the plain files beside the notebook that were submitted as such
    (in ``submitted``, as plain files with the same bytes), and why none are copied."""
    files, size, folders = {}, 0, []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False) and (submitted / entry.name).is_dir() and not (
                entry.name == "__pycache__" or entry.name.startswith(".")):
            folders.append(f"{entry.name}/")  # round 40: a package folder, left out unsaid
        if entry.name.endswith(".ipynb") or entry.name in NBGRADERS or not (
                entry.is_file(follow_symlinks=False) and _submitted(submitted / entry.name)):
            continue  # a folder, a link out of the submission, a notebook, nbgrader's own
        size += entry.stat(follow_symlinks=False).st_size
        if len(files) == MAX_FILES or size > MAX_BYTES:
            over = (f"more than {MAX_FILES} files" if len(files) == MAX_FILES else
                    f"{size / 2**20:.1f} MB or more, over {MAX_BYTES // 2**20} MB")
            return {}, (f"the files submitted beside the notebook were not copied to the "
                        f"judge's folder: {over} (a helper module or a data file fits; submit "
                        f"fewer or smaller files)")
        data = Path(entry.path).read_bytes()
        if data == (submitted / entry.name).read_bytes():  # not one the course put there
            files[entry.name] = data
    return files, (f"the folders submitted beside the notebook ({', '.join(folders[:3])}) are "
                   f"not copied to the judge's folder: put their code in plain files beside "
                   f"it" if folders else "")


def _plain(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _submitted(path: Path) -> bool:
    """A plain file as submitted, or a link to one beside it (the learner's own file)."""
    real = Path(os.path.realpath(path))
    return real.parent == Path(os.path.realpath(path.parent)) and _plain(real)


def given(resources: dict) -> tuple[dict[str, bytes], str]:
    return resources.get(_KEY, ({}, ""))


def write(files: dict[str, bytes], folder: str) -> None:
    """The files into a judge's folder, before it starts."""
    for name, data in files.items():
        with open(os.path.join(folder, name), "xb") as f:
            f.write(data)

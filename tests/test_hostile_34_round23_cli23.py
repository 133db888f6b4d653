"""Round 23, command lines: run.sh's setup lock on NFS, on a filesystem that cannot lock and
across a pull; its stamp and a read-only clone; outputs that cannot be written, refused before
the work; and three refusals that named the wrong thing.

The run.sh tests never set anything up: they run round 22's stand-in copy of run.sh, whose
.venv's python is this one and whose pip, jupyter and torch installer only log that they ran.
A filesystem is copied with an LD_PRELOAD shim around flock(2) (needs a C compiler).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from overlap_course.build import setup_cell
from test_hostile_34_round22_cli22 import _env, _set_up, _stand_in, needs_bash

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

# flock(2) as on NFS (flock(2) man page: "in order to place an exclusive lock, the file must be
# opened for writing"): LOCK_EX on a regular file open read-only is EBADF.  A folder keeps the
# kernel's local lock: nfs_dir_operations has no .flock.  FLOCK_ERRNO=ENOLCK|ENOTSUP: every
# flock fails so (no lock daemon, an SMB share).
SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
int flock(int fd, int op) {
    const char *e = getenv("FLOCK_ERRNO");
    struct stat st;
    if (e && !strcmp(e, "ENOLCK")) { errno = ENOLCK; return -1; }
    if (e && !strcmp(e, "ENOTSUP")) { errno = ENOTSUP; return -1; }
    int fl = fcntl(fd, F_GETFL);
    if ((op & LOCK_EX) && fl >= 0 && (fl & O_ACCMODE) == O_RDONLY && fstat(fd, &st) == 0
            && S_ISREG(st.st_mode)) { errno = EBADF; return -1; }
    int (*real)(int, int) = (int (*)(int, int))dlsym(RTLD_NEXT, "flock");
    return real(fd, op);
}
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or sys.platform != "linux":
        pytest.skip("the flock(2) shim needs a C compiler and Linux")
    folder = tmp_path_factory.mktemp("shim")
    (folder / "shim.c").write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(folder / "shim.so"),
                    str(folder / "shim.c"), "-ldl"], check=True, timeout=120)
    return str(folder / "shim.so")


def _no_flock(tmp_path: Path) -> str:
    """A PATH with every tool of /usr/bin and /bin but util-linux's flock (as on macOS)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
        for name in os.listdir(folder) if os.path.isdir(folder) else ():
            if name != "flock" and not (tools / name).exists():
                (tools / name).symlink_to(Path(folder) / name)
    return str(tools)


def _run_sh(repo: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["./run.sh", *args], cwd=repo, env={**_env(repo), **env},
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def _change_an_input(repo: Path) -> None:
    with open(repo / "pyproject.toml", "a") as f:
        f.write("\n# changed by a pull\n")


# -- cases 1-3: the setup lock --

@needs_bash
def test_on_nfs_run_sh_takes_its_lock_without_a_stray_line(tmp_path, shim):
    """run.sh locked itself through a read-only descriptor: NFS answers EBADF, and every
    command began with "flock: 8: Bad file descriptor", unlocked.  The folder's lock is taken:
    two setups at once run one after the other."""
    repo, log = _set_up(tmp_path)
    done = _run_sh(repo, "lab", LD_PRELOAD=shim)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    _change_an_input(repo)
    env = {**_env(repo), "LD_PRELOAD": shim}
    log.write_text("")
    slow = repo / ".venv" / "bin" / "pip"
    slow.write_text(slow.read_text().replace("sleep 0", "sleep 2"))
    runs = [subprocess.Popen(["./run.sh", "setup"], cwd=repo, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    said = [r.communicate(timeout=60) for r in runs]
    assert [r.returncode for r in runs] == [0, 0], said
    assert log.read_text().split() == ["install_torch", "pip-start", "pip-end"], said
    assert "flock" not in "".join(err for _, err in said), said


@needs_bash
@pytest.mark.parametrize("error", ["ENOLCK", "ENOTSUP"])
@pytest.mark.parametrize("with_flock", [True, False], ids=["flock(1)", "python"])
def test_a_filesystem_that_cannot_lock_is_no_wait_for_another_run_sh(tmp_path, shim, error,
                                                                     with_flock):
    """Python's fallback exited 1 for any error, as for "held": run.sh said "another ./run.sh
    is setting up .venv; waiting for it to finish" with none running (flock(1): its warning).
    Now: unlocked, said once, and only when it sets up."""
    repo, log = _set_up(tmp_path)
    env = {"LD_PRELOAD": shim, "FLOCK_ERRNO": error}
    if not with_flock:
        env["PATH"] = _no_flock(tmp_path)
    done = _run_sh(repo, "setup", **env)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    _change_an_input(repo)
    done = _run_sh(repo, "setup", **env)
    lines = done.stderr.splitlines()
    assert done.returncode == 0 and len(lines) == 2, done.stderr
    assert "changed since .venv was set up: pyproject.toml - setting up again" == lines[0][8:]
    assert "cannot be locked here" in lines[1] and "another" not in done.stderr, lines
    assert log.read_text().split() == ["install_torch", "pip-start", "pip-end"]


@needs_bash
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/PID/fd")
def test_python_s_lock_is_not_held_by_the_command_run_sh_starts(tmp_path):
    """Without flock(1) (macOS) as with it: a lab left running would hold the setup lock."""
    repo, log = _set_up(tmp_path)
    done = _run_sh(repo, "lab", PATH=_no_flock(tmp_path))
    assert done.returncode == 0 and log.read_text().split() == ["lab"], done.stderr


@needs_bash
def test_a_pull_that_replaces_run_sh_during_setup_does_not_start_a_second_one(tmp_path):
    """The lock was on run.sh's inode, which `git pull` replaces: a ./run.sh started then
    locked the new one and ran a second pip into .venv beside the first."""
    repo = tmp_path / "clone"
    log = _stand_in(repo, pip_seconds=4)
    first = subprocess.Popen(["./run.sh", "setup"], cwd=repo, env=_env(repo), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 50
    while not (log.exists() and "pip-start" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)  # the first is in pip, holding the lock
    new = repo / ".run.sh.new"  # git: a new file renamed into place
    new.write_text((repo / "run.sh").read_text() + "# a line the pull added\n")
    new.chmod(0o755)
    os.replace(new, repo / "run.sh")
    second = _run_sh(repo, "setup")
    first.communicate(timeout=60)
    assert (first.returncode, second.returncode) == (0, 0), second.stderr
    assert log.read_text().split() == ["install_torch", "pip-start", "pip-end"], second.stderr


# -- cases 4, 5: the stamp's folder, a read-only clone --

@needs_bash
def test_a_stamp_naming_this_folder_through_a_link_is_not_set_up_again(tmp_path):
    """run.sh before round 22 recorded the folder it was reached by (/home/u/clone, /home/u ->
    /data/u); the new one records the physical one, and set the clone up again for it."""
    repo, log = _set_up(tmp_path)
    (tmp_path / "home").symlink_to(repo.parent)
    stamp = repo / ".venv" / ".run-sh-setup"
    via = tmp_path / "home" / repo.name
    stamp.write_text(stamp.read_text().replace(f"folder {repo}\n", f"folder {via}\n"))
    assert f"folder {via}\n" in stamp.read_text()
    done = _run_sh(repo, "setup")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert "nothing to install" in done.stdout and log.read_text() == ""
    other = tmp_path / "other"  # another folder is another clone's: set up again
    other.mkdir()
    stamp.write_text(stamp.read_text().replace(f"folder {via}\n", f"folder {other}\n"))
    done = _run_sh(repo, "setup")
    assert "changed since .venv was set up: folder - setting up again" in done.stderr
    assert log.read_text().split() == ["install_torch", "pip-start", "pip-end"]


def _as_a_user() -> list[str]:
    """Root passes every permission check: drop that, or run as the user one is."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: no permission check to meet")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@needs_bash
def test_a_read_only_clone_whose_inputs_changed_says_so_in_one_line(tmp_path):
    """It said "changed since .venv was set up: pyproject.toml - setting up again", then rm's
    "cannot remove '.venv/.run-sh-setup'", exit 1."""
    repo, log = _set_up(tmp_path)
    _change_an_input(repo)
    for folder in (repo / ".venv", repo):
        folder.chmod(0o555)
    try:
        done = subprocess.run([*_as_a_user(), "./run.sh", "lab"], cwd=repo, env=_env(repo),
                              capture_output=True, text=True, timeout=60)
    finally:
        for folder in (repo, repo / ".venv"):
            folder.chmod(0o755)
    lines = done.stderr.splitlines()
    assert (done.returncode, len(lines)) == (2, 1), done.stderr
    assert lines[0].startswith("run.sh: changed since .venv was set up: pyproject.toml, but "
                               f"{repo} cannot be written here"), lines
    assert "setting up again" not in lines[0] and log.read_text() == ""


# -- cases 6-8: an output folder that cannot be written, refused before the work --

RECORD = """import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("record_traces", sys.argv[1])
rt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rt)
recorded = []
rt._record_all = lambda args, targets: recorded.append(1) or []
code = rt.main(sys.argv[2:])
print(json.dumps([code, recorded]))"""

EXPORT = """import json, sys
from overlap_course.traces.kineto import cli
recorded = []
cli._record = lambda mode, args: recorded.append(mode) or sys.exit(3)
code = cli.main(sys.argv[1:])
print(json.dumps([code, recorded]))"""


def _read_only(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        return subprocess.run([*_as_a_user(), sys.executable, *argv], cwd=tmp_path, env=ENV,
                              capture_output=True, text=True, timeout=300)
    finally:
        ro.chmod(0o755)


def test_record_traces_refuses_an_out_it_cannot_write_before_recording(tmp_path):
    """An existing --out one cannot write passed every check: every run was recorded (minutes)
    and then "Permission denied: 'ro/cpu_serial.json'"."""
    done = _read_only(tmp_path, "-c", RECORD, str(ROOT / "scripts" / "record_traces.py"),
                      "--modes", "serial", "--host-overheads", "0", "--out", "ro")
    assert json.loads(done.stdout.splitlines()[-1]) == [2, []], done.stderr
    assert done.stderr == "record_traces: error: cannot write 'ro': Permission denied; choose " \
                          "a path in a directory you can write\n"


def test_trace_export_refuses_an_out_it_cannot_write_before_recording(tmp_path):
    """Both runs were recorded (30 s for 64 prompts), then "cannot write 'ro/x_serial.json'"."""
    done = _read_only(tmp_path, "-c", EXPORT, "export", "ro/x.json")
    assert json.loads(done.stdout.splitlines()[-1]) == [2, []], done.stderr
    assert done.stderr.splitlines() == [
        "python -m overlap_course.traces.kineto: error: cannot write 'ro/x.json': Permission "
        "denied; choose a path in a directory you can write"], done.stderr


def test_notebooks_execute_refuses_a_notebook_in_a_folder_it_cannot_write_before_running(
        tmp_path):
    """It executed the notebook whole, then named a temporary file never made:
    "Permission denied: '.../rodir/.nb.ipynb.w_3hhqqs.partial'"."""
    ran, ro = tmp_path / "ran", tmp_path / "ro"
    ro.mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell(f"open({str(ran)!r}, 'w').close()")]),
                   ro / "nb.ipynb")
    ro.chmod(0o555)
    try:
        done = subprocess.run([*_as_a_user(), sys.executable, "-m",
                               "overlap_course.build.notebooks", "execute", "ro/nb.ipynb"],
                              cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    finally:
        ro.chmod(0o755)
    lines = [line for line in done.stderr.splitlines() if "IPKernelApp" not in line]
    assert (done.returncode, len(lines)) == (2, 1), done.stderr
    assert lines[0] == (f"notebooks execute: error: '{ro / 'nb.ipynb'}' is executed in place, but "
                        f"its folder cannot be written (Permission denied): copy it into a "
                        f"folder you can write")
    assert not ran.exists(), "executed before the refusal"


def test_write_notebook_names_the_notebook_when_its_temporary_cannot_be_made(tmp_path,
                                                                             monkeypatch):
    """mkstemp was outside the try that names the notebook: its error named the temporary."""
    def refused(prefix, suffix, dir):
        raise PermissionError(13, "Permission denied", os.path.join(dir, prefix + "x" + suffix))

    monkeypatch.setattr(setup_cell.tempfile, "mkstemp", refused)
    with pytest.raises(PermissionError) as err:
        setup_cell.write_notebook(new_notebook(), tmp_path / "nb.ipynb")
    assert err.value.filename == str(tmp_path / "nb.ipynb")


# -- cases 9-11: measure_notebooks, record_traces --

MEASURE = [sys.executable, str(ROOT / "scripts" / "measure_notebooks.py")]


def test_measure_notebooks_refuses_an_empty_json_in_one_line(tmp_path):
    """--json '' was taken as no --json: it measured (the whole course without NOTEBOOK) and
    wrote nothing, exit 0."""
    nbformat.write(new_notebook(cells=[new_code_cell("1")]), tmp_path / "nb.ipynb")
    done = subprocess.run([*MEASURE, "--json", "", "nb.ipynb"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == "measure_notebooks: error: --json is empty: name the file to write, " \
                          "e.g. times.json\n"


def test_measure_notebooks_names_the_learner_s_notebook_not_its_temporary_copy(tmp_path):
    """The line quoted the copy in a temporary folder, gone when the line is read."""
    nb = tmp_path / "div0.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("1/0")]), nb)
    done = subprocess.run([*MEASURE, str(nb)], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if "IPKernelApp" not in line]
    assert (done.returncode, len(lines)) == (1, 1), done.stderr
    assert lines[0].count(str(nb)) == 2 and "ZeroDivisionError" in lines[0], lines[0]
    assert "div0.ipynb" not in lines[0].replace(str(nb), ""), lines[0]


def test_record_traces_says_minus_zero_and_zero_are_one_overhead(tmp_path):
    """It said "--host-overheads names -0 twice" of `-0 0`."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "record_traces.py"),
                           "--host-overheads", "-0", "0", "--out", "x"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stderr) == (2, "record_traces: error: --host-overheads -0 and "
                                                 "0 are the same overhead: name each overhead at "
                                                 "most once\n"), done.stderr
    assert list(tmp_path.iterdir()) == []

"""Round 22, command lines: a trace of many ProfilerSteps, run.sh through symbolic links and
twice at once, and two refusals that named the wrong thing.

The run.sh tests never set anything up: they run a stand-in copy of run.sh whose .venv's python
is this one and whose pip, jupyter and torch installer only log that they ran.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_course import progress_service
from overlap_course.build import setup_cell
from overlap_course.traces.kineto import KinetoTrace, idle_after_syncs, summary

ROOT = Path(__file__).resolve().parent.parent
needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="run.sh needs bash")


# -- case 1: trace summary of many ProfilerSteps --

class _CountedSteps(list):
    """The trace's steps, counting each pass over them."""

    passes = 0

    def __iter__(self):
        type(self).passes += 1
        return super().__iter__()


def _many_steps(n: int) -> dict:
    events = []
    for i in range(n):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}",
                       "ts": i * 10, "dur": 10})
        events.append({"ph": "X", "cat": "kernel", "name": "k", "ts": i * 10 + 1, "dur": 5,
                       "args": {"stream": 7}})
    return {"traceEvents": events}


@pytest.mark.parametrize("measure", [summary, idle_after_syncs])
def test_a_trace_of_many_steps_is_measured_with_a_pass_over_its_steps_not_one_per_event(measure):
    """in_window found the last step's start by a pass over every step, for each device event:
    20,000 steps took 41 s (quadratic).  Now a few passes in all, whatever the size."""
    trace = KinetoTrace(_many_steps(2000))
    trace.steps = _CountedSteps(trace.steps)
    _CountedSteps.passes = 0
    result = measure(trace)
    assert _CountedSteps.passes <= 3, f"{_CountedSteps.passes} passes over the 2,000 steps"
    assert (result["window"]["profiler_steps"] if measure is summary else result["rounds"]) \
        in (2000, 1999)  # the last step is out of HTA's window, as before


# -- cases 2, 3, 4: run.sh through links, and twice at once --

def _stand_in(repo: Path, pip_seconds: float = 0) -> Path:
    """A clone's run.sh and inputs, whose setup only logs (to the returned file) what it ran."""
    log = repo.parent / f"{repo.name}.log"
    (repo / "scripts").mkdir(parents=True)
    for name in ("run.sh", "pyproject.toml", "environment.yml"):
        shutil.copy2(ROOT / name, repo / name)
    (repo / "scripts" / "install_torch.sh").write_text(f'echo install_torch >> "{log}"\n')
    tools = {"python": f'exec "{sys.executable}" "$@"',
             "pip": f'echo pip-start >> "{log}"; sleep {pip_seconds}; echo pip-end >> "{log}"',
             "jupyter": f'[ "$1" = lab ] || exit 0; [ -e /proc/$$/fd/8 ] && echo lock-held'
                        f' >> "{log}"; echo lab >> "{log}"'}
    (repo / ".venv" / "bin").mkdir(parents=True)
    for tool, body in tools.items():
        (repo / ".venv" / "bin" / tool).write_text(f"#!/bin/sh\n{body}\n")
        (repo / ".venv" / "bin" / tool).chmod(0o755)
    return log


def _env(cwd: Path) -> dict:
    """PYTHON: a stand-in that makes no .venv (run.sh before the fix made one beside a link)."""
    python = cwd / "no-venv-python"
    python.write_text(f'#!/bin/sh\n[ "$1" = -m ] && exit 3\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    env = dict(os.environ, PWD=str(cwd), PYTHON=str(python))
    env.pop("VIRTUAL_ENV", None)
    return env


def _run_sh(run_sh, *args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(run_sh), *args], cwd=cwd, env=_env(cwd), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def _set_up(tmp_path: Path) -> tuple[Path, Path]:
    repo = tmp_path / "clone"
    log = _stand_in(repo)
    first = _run_sh("./run.sh", "setup", cwd=repo)
    assert first.returncode == 0 and log.read_text().split().count("pip-end") == 1, first.stderr
    log.write_text("")
    return repo, log


@needs_bash
def test_run_sh_called_through_a_symbolic_link_to_it_runs_in_the_repository(tmp_path):
    """~/bin/run.sh -> clone/run.sh made a stray .venv beside the link and exited 127 with
    bash's "No such file or directory" for each input."""
    repo, log = _set_up(tmp_path)
    elsewhere = tmp_path / "bin"
    elsewhere.mkdir()
    (elsewhere / "run.sh").symlink_to(os.path.relpath(repo / "run.sh", elsewhere))
    (tmp_path / "run.sh").symlink_to(elsewhere / "run.sh")  # a link to the link
    for link in (elsewhere / "run.sh", tmp_path / "run.sh"):
        done = _run_sh(link, "setup", cwd=tmp_path)
        assert (done.returncode, done.stderr) == (0, ""), done.stderr[-1500:]
        assert "is set up and its inputs are unchanged" in done.stdout, done.stdout
    assert sorted(p.name for p in elsewhere.iterdir()) == ["run.sh"]
    assert not (tmp_path / ".venv").exists() and log.read_text() == ""


@needs_bash
def test_the_same_clone_through_a_symbolic_link_to_its_folder_is_not_set_up_again(tmp_path):
    """The stamp kept the logical folder: /link/run.sh (/link -> the clone) said "changed
    since .venv was set up: folder" and ran pip (which fails offline)."""
    repo, log = _set_up(tmp_path)
    (tmp_path / "course").symlink_to(repo)
    for run_sh in (tmp_path / "course" / "run.sh", repo / "run.sh"):  # and back: no flip-flop
        done = _run_sh(run_sh, "setup", cwd=tmp_path)
        assert (done.returncode, done.stderr) == (0, ""), done.stderr[-1500:]
        assert log.read_text() == "", f"set up again through {run_sh}"


@needs_bash
def test_two_run_sh_started_together_set_up_once_one_after_the_other(tmp_path):
    """Both ran install_torch and pip into one .venv at once (the log read start, start, end,
    end).  The second waits for the first, then finds it set up."""
    repo = tmp_path / "clone"
    log = _stand_in(repo, pip_seconds=2)
    runs = [subprocess.Popen(["./run.sh", "setup"], cwd=repo, env=_env(repo), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    said = [r.communicate(timeout=60) for r in runs]
    assert [r.returncode for r in runs] == [0, 0], said
    assert log.read_text().split() == ["install_torch", "pip-start", "pip-end"], said


@needs_bash
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/PID/fd")
def test_the_setup_lock_is_not_held_by_the_command_run_sh_starts(tmp_path):
    """A lab left running would hold it: a second command would wait for setup forever."""
    repo, log = _set_up(tmp_path)
    done = _run_sh("./run.sh", "lab", cwd=repo)
    assert done.returncode == 0 and log.read_text().split() == ["lab"], done.stderr


# -- cases 5 and 6: refusals that name what is wrong --

@pytest.mark.parametrize("argv, named", [(["bogus"], "'bogus'"), (["check", "extra"], "extra"),
                                         ([], "required")])
def test_setup_cell_names_the_wrong_argument_in_one_line(argv, named, capsys):
    with pytest.raises(SystemExit) as end:
        setup_cell.main(argv)
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.startswith("setup_cell: error: ") and named in err, err
    assert err.endswith("(see --help)\n") and err.count("\n") == 1, err


def test_progress_service_says_an_empty_guide_file_is_empty(tmp_path, capsys):
    db = tmp_path / "progress.sqlite"
    assert progress_service.main(["--guide-file", "", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "--guide-file is empty" in err and "'.'" not in err and err.count("\n") == 1, err
    assert not db.exists()

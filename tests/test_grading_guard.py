"""The judge's guards that issue 34's hostile round broke: a judge process cannot write what the
next one imports, its report must be signed with the run's secret, and `grading course` keeps an
instructor's edits.  Each judge run here is a real fresh process (a few seconds)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from overlap_course.build import grading, judge, judge_process

ROOT = Path(__file__).resolve().parents[1]
RIGHT = 'needs_correction = {"seqlens_k", "positions", "slot_mapping", "input_ids"}'


def _grading(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "overlap_course.build.grading", *args],
                          capture_output=True, text=True, timeout=120)


def test_an_edited_course_is_refused_in_one_line_and_force_overwrites(tmp_path):
    assert _grading("course", str(tmp_path), "04_seqlen_correction").returncode == 0
    again = _grading("course", str(tmp_path), "04_seqlen_correction")
    assert again.returncode == 0, again.stderr  # an unchanged course: nothing to refuse
    config = tmp_path / "nbgrader_config.py"
    config.write_text("# edited\n")
    refused = _grading("course", str(tmp_path), "04_seqlen_correction")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert str(config) in refused.stderr and "--force" in refused.stderr
    assert config.read_text() == "# edited\n"
    forced = _grading("course", str(tmp_path), "04_seqlen_correction", "--force")
    assert forced.returncode == 0 and config.read_text() == grading.NBGRADER_CONFIG


# Every route this cell tries would change lesson04.py; the audit hook refuses each one.
WRITER = '''
import os, sys
needs_correction = {"rows"}
if sys.flags.isolated:
    import overlap_course.checks.lesson04 as m
    target = m.__file__
    folder = os.path.dirname(target)
    attempts = [
        lambda: os.close(os.open(target, os.O_WRONLY | os.O_TRUNC)),
        lambda: os.replace(os.path.join(os.getcwd(), "x"), target),
        lambda: os.remove(target),
        lambda: os.truncate(target, 0),
        lambda: os.open("lesson04.py", os.O_WRONLY | os.O_TRUNC,
                        dir_fd=os.open(folder, os.O_RDONLY)),
        lambda: os.open(os.path.join("overlap_course", "checks", "lesson04.py"),
                        os.O_WRONLY | os.O_TRUNC,
                        dir_fd=os.open(os.path.dirname(os.path.dirname(folder)), os.O_RDONLY)),
        lambda: os.mkdir(os.path.join(folder, "new")),
    ]
    open("x", "w").write("def check_metadata_answer(a): pass")
    for attempt in attempts:
        try:
            attempt()
        except OSError:
            pass
'''


def _copy_course(where: Path) -> Path:
    copy = where / "course"
    for package in ("overlap_course", "toy_engine"):
        shutil.copytree(ROOT / package, copy / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def test_a_judge_process_cannot_change_the_installed_course(tmp_path):
    copy = _copy_course(tmp_path)
    before = _files(copy)
    code = ("import sys\nsys.path.insert(0, sys.argv[1])\n"
            "from overlap_course.build import judge\n"
            "print(judge.judge('check_metadata_answer', [sys.argv[2]]))\n")
    run = subprocess.run([sys.executable, "-I", "-c", code, str(copy), WRITER],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.stdout.startswith("(False"), (run.stdout, run.stderr[-500:])
    assert _files(copy) == before


def test_a_verdict_is_not_trusted_when_the_installation_changed_during_the_judge():
    """The digest the grader compares after each judge process: here one that cannot match."""
    pristine = judge.installed_digest()
    some = next(iter(pristine))
    passed, message = judge.judge("check_metadata_answer", [RIGHT],
                                  pristine={**pristine, some: "0" * 64})
    assert not passed and "not graded" in message and some in message
    assert judge.judge("check_metadata_answer", [RIGHT])[0] is True


def test_only_a_report_signed_with_the_runs_secret_is_read(tmp_path):
    report = tmp_path / "report.json"
    body = '{"passed": true, "message": "ok"}'
    report.write_text(f"{judge_process.sign('secret', body)}\n{body}")
    assert judge._read_report(report, "secret", "check", 0, b"")["passed"] is True
    assert judge._read_report(report, "other", "check", 0, b"")["passed"] is False
    assert judge._read_report(report, "secret", "check", 1, b"")["passed"] is False
    report.write_text(body)
    assert judge._read_report(report, "secret", "check", 0, b"")["passed"] is False

"""The judge's guards that issue 34's hostile round broke: a judge process cannot write what the
next one imports, its report must be signed with the run's secret, and `grading course` keeps an
instructor's edits.  Each judge run here is a real fresh process (a few seconds)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import loops_for_tests
from overlap_course.build import grading, judge, judge_folders, judge_process

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
    report.write_text(f"{judge_process.signer('secret')(body)}\n{body}")
    assert judge._read_report(report, "secret", "check", 0, "")["passed"] is True
    assert judge._read_report(report, "other", "check", 0, "")["passed"] is False
    assert judge._read_report(report, "secret", "check", 1, "")["passed"] is False
    report.write_text(body)
    assert judge._read_report(report, "secret", "check", 0, "")["passed"] is False


# A value answer whose cell leaves modules in the folder above the course (ROOT), where the
# next judge looked first for the modules it imports before reading its request (round two).
SHADOW = '''
import os, sys
needs_correction = {{"rows"}}
if sys.flags.isolated:
    import overlap_course
    root = os.path.dirname(os.path.dirname(overlap_course.__file__))
    for name in ("hmac", "json", "secrets", "hashlib"):
        with open(os.path.join(root, name + ".py"), "w") as f:
            f.write("open({mark!r}, 'w').close()\\nraise SystemExit('shadowed')\\n")
'''


def test_a_module_left_beside_the_course_is_not_imported_by_the_next_judge(tmp_path):
    copy, mark = _copy_course(tmp_path), tmp_path / "shadow-ran"
    code = ("import sys\nsys.path.insert(0, sys.argv[1])\n"
            "from overlap_course.build import judge\n"
            "for cell in sys.argv[2:]:\n"
            "    print(judge.judge('check_metadata_answer', [cell])[0])\n")
    wrong = 'needs_correction = {"rows"}'
    run = subprocess.run([sys.executable, "-I", "-c", code, str(copy),
                          SHADOW.format(mark=str(mark)), RIGHT, wrong],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    # Since round six a judge opens nothing outside the installation and its own folder, so
    # the cell cannot even write there (before, it could, and the judge never read it).
    assert not (copy / "hmac.py").exists()
    assert run.stdout.split() == ["False", "True", "False"], (run.stdout, run.stderr[-800:])
    assert not mark.exists()


def test_the_courses_bytecode_is_part_of_what_the_grader_trusts(tmp_path, monkeypatch):
    """A kernel (it runs before any judge, unguarded) that rewrites a ``.pyc`` whose header
    still matches its source would change what the judge runs: the digest includes it."""
    copy = _copy_course(tmp_path)
    monkeypatch.setattr(judge, "ROOT", copy)
    pristine = judge.compiled_digest()
    pyc = sorted(p for p in pristine if p.endswith(".pyc") and "lesson04" in p)
    assert pyc, "compiled_digest compiled no bytecode of the course"
    data = Path(pyc[0]).read_bytes()
    Path(pyc[0]).write_bytes(data[:16] + bytes(len(data) - 16))  # same header, other code
    assert judge._changed_files(pristine) == [pyc[0]]


def test_a_module_put_in_sys_modules_during_the_check_is_named():
    import types

    trusted = judge_folders.protected(ROOT)
    before = set(sys.modules)
    sys.modules["toy_engine.planted"] = types.ModuleType("toy_engine.planted")
    import tabnanny  # noqa: F401 - a standard module imported for the first time: trusted
    try:
        assert judge_process._strange_modules(before, trusted) == ["toy_engine.planted"]
    finally:
        del sys.modules["toy_engine.planted"]


def test_a_check_keeps_what_the_judge_fingerprints_while_the_answer_runs(make_engine):
    """The judge trusts a verdict only if the checker's modules and classes are the objects
    they were (judge_process._fingerprint) each time the answer's code hands control back: a
    checker that keeps its state in a class attribute it rebinds during the check (the time
    limit's alarm did) fails every right answer in grading.  Compared from inside right
    answers, in an exercise check and a notebook check."""
    import toy_engine as te
    from overlap_course import checks
    from overlap_course.build import judge_process

    def changed():
        return judge_process._compare(before, judge_process._fingerprint())
    seen = []

    def serial_loop(engine):
        seen.append(changed())
        loops_for_tests.serial_loop(engine)

    def idle_fraction(timeline):
        seen.append(changed())
        idle = sum(b - a for a, b in timeline.device_gaps())
        return idle / (idle + timeline.device_busy_ms())
    engine = make_engine(mode="serial", max_batch_size=4)
    engine.generate(["Once upon a time", "The bird said"], max_new_tokens=8)
    checks.check_slot(37, table=[5, 2, 9], pos=9, block_size=4)  # first imports done
    before = judge_process._fingerprint()
    assert checks.check_serial_loop(serial_loop).passed
    assert checks.check_idle_fraction(idle_fraction, engine).passed
    assert len(seen) >= 5 and all(c == [] for c in seen), seen

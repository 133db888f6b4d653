"""Hostile round after issue 34: cases not listed there that still fail (each should pass once
fixed).  Each runs in a few seconds once fixed; a subprocess bounds time and memory."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from overlap_course.progress import your_progress
from hostile_support import one_clear_line as _one_clear_line

ROOT = Path(__file__).resolve().parents[1]
ONE_GB = 1 << 30


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (ONE_GB, ONE_GB))


def _summary(path, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "overlap_course.traces.kineto", "summary",
                           str(path)], capture_output=True, text=True, timeout=timeout, env=env,
                          preexec_fn=_limit_memory)


def test_a_gzip_bomb_trace_is_one_line(tmp_path):
    """1.5 GB of spaces in a 1.5 MB .json.gz: read under a 1 GB memory cap it is MemoryError."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b" " * (1 << 24)
    with open(tmp_path / "bomb.json.gz", "wb") as f:
        for _ in range(96):
            f.write(packer.compress(chunk))
        f.write(packer.flush())
    _one_clear_line(_summary(tmp_path / "bomb.json.gz"))


def test_a_trace_that_never_ends_is_one_line():
    """/dev/zero as the trace: read whole, it is MemoryError under a 1 GB cap."""
    _one_clear_line(_summary("/dev/zero"))


def test_safe_json_refuses_an_unterminated_escaped_string_in_linear_time():
    """'"' then 60,000 '\\"': the string regex of the depth count restarts at every quote and
    runs to the end each time (quadratic): minutes for a 120 KB trace, instead of at once."""
    code = ("from overlap_course import safe_json\n"
            "try:\n    safe_json.loads('\"' + '\\\\\"' * 60000, 'x')\n"
            "except safe_json.JSONRefused as e:\n    print('refused')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=20, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("safe_json.loads took over 20 s on a 120 KB unterminated string")
    assert run.stdout.strip() == "refused", run.stderr[-300:]


def test_a_trace_with_an_unterminated_escaped_string_is_refused_at_once(tmp_path):
    (tmp_path / "t.json").write_text('"' + '\\"' * 60000)
    try:
        run = _summary(tmp_path / "t.json", timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("trace summary ran over 30 s on a 120 KB file")
    _one_clear_line(run)


GOOD = {"v": 1, "notebook": "00_start_here", "check": "check_race", "passed": False,
        "category": "wrong_value", "time": 5.0}


@pytest.mark.parametrize("odd", [{"notebook": []}, {"notebook": {}}, {"time": "late"},
                                 {"time": None}, {"category": ["x"]}, {"category": {}}],
                         ids=["notebook_list", "notebook_dict", "time_str", "time_null",
                              "category_list", "category_dict"])
def test_a_progress_line_with_odd_field_types_is_skipped_not_fatal(tmp_path, odd):
    """A JSON object line whose fields have the wrong types: your_progress raised TypeError."""
    path = tmp_path / "progress.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, **odd}) + "\n")
    progress = your_progress(path)
    repr(progress)
    progress._repr_html_()
    assert progress.counts()["tried"] == 1


CHEAT = '''
import sys
needs_correction = {"rows"}
if sys.flags.isolated:  # only in the judge's python -I process, not in the learner's kernel
    import overlap_course.checks.lesson04 as m
    with open(m.__file__, "a") as f:
        f.write("\\ndef check_metadata_answer(answer):\\n"
                "    return Verdict(True, 'ok', 'passed')\\n")
'''


def test_a_value_answer_cannot_rewrite_the_checker_the_second_judge_imports(tmp_path):
    """The first judge process (reading the value) runs the submission's cells; they may write
    the installed checker's file, which the second process then imports: a wrong answer passes.
    Run on a copy of the course so the checkout is untouched."""
    copy = tmp_path / "course"
    for package in ("overlap_course", "toy_engine"):
        shutil.copytree(ROOT / package, copy / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys\nsys.path.insert(0, sys.argv[1])\n"
            "from overlap_course.build import grading, judge\n"
            "assert str(grading.ROOT) == sys.argv[1], grading.ROOT\n"
            "print(judge.judge('check_metadata_answer', [sys.argv[2]])[0])\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", code, str(copy), CHEAT], capture_output=True,
                         text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.stdout.strip() == "False", (run.stdout, run.stderr[-500:])


# The checks' arguments other than the answer (context a notebook passes), given odd values: each
# raised instead of answering a Verdict (checks.check_done_after_wait's num_kernels=10**20 builds
# a huge set, like the waited=10**20 listed in issue 34).
ODD_CONTEXT = [
    ("check_slot", (5, [1, 2], None, 4)),
    ("check_slot", (5, [1, 2], 3, 1e308)),
    ("check_slot", ([1], True, 3, 4)),
    ("check_corrected_slots", ([1], None, [1, 2], 1, 4)),
    ("check_corrected_slots", ([1], [1], [1, 2], 1, "x")),
    ("check_true_key_length", (3, None, 1)),
    ("check_true_key_length", (3, 5, "x")),
    ("check_done_after_wait", ({1}, 1, "x")),
    ("check_overhead_gap", (1.0, 10**400)),
    ("check_overhead_gap", (1.0, None)),
    ("check_decode_lengths", ([1], [1], None)),
    ("check_processed_under", (1, None, 1)),
    ("check_round_gap", (1.0, None, 1)),
    ("check_largest_host_stage", ("x", None)),
    ("check_ideal_ratio", (1.0, None, None)),
    ("check_idle_fraction", (0.5, None)),
    ("check_future_inputs", ([], [], [])),
]


@pytest.mark.parametrize("name,args", ODD_CONTEXT,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(ODD_CONTEXT)])
def test_a_check_answers_odd_context_arguments_with_a_verdict(name, args, tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAP_PROGRESS_FILE", str(tmp_path / "progress.jsonl"))
    from overlap_course import checks
    from overlap_course.checks.verdict import Verdict

    assert type(getattr(checks, name)(*args)) is Verdict


def test_a_huge_num_kernels_is_a_verdict_not_a_huge_set(tmp_path):
    """check_done_after_wait(answer, 1, num_kernels=10**20): MemoryError under a 3 GB cap."""
    code = ("import resource\n"
            "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
            "from overlap_course import checks\n"
            "from overlap_course.checks.verdict import Verdict\n"
            "print(type(checks.check_done_after_wait({1}, 1, 10**20)) is Verdict)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "OVERLAP_PROGRESS_FILE": str(tmp_path / "progress.jsonl")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert run.stdout.strip() == "True", run.stderr.strip().splitlines()[-1:]

def test_grading_course_does_not_overwrite_an_instructors_edited_config(tmp_path):
    """`grading course DEST` on an existing course replaced DEST/nbgrader_config.py (and the
    assignments' sources) without a word: the instructor's edits were lost."""
    from overlap_course.build import grading

    edited = "# the instructor's own settings\nc = get_config()  # noqa\n"
    (tmp_path / "nbgrader_config.py").write_text(edited)
    try:
        grading.main(["course", str(tmp_path), "04_seqlen_correction"])
    except SystemExit:
        pass
    assert (tmp_path / "nbgrader_config.py").read_text() == edited


@pytest.mark.parametrize("argv", [
    ["overlap_course.measure.bench", "--requests", "64", "--repeats", "20"],
    ["overlap_course.traces.kineto", "export", "OUT.json", "--prompts", "64", "--max-new-tokens",
     "150", "--host-overhead-ms", "20"],
], ids=["bench", "trace_export"])
def test_ctrl_c_in_a_command_line_is_one_line_not_a_traceback(argv, tmp_path):
    """A real SIGINT 6 s into a run (work for well over a minute on a quiet machine): no
    KeyboardInterrupt traceback from torch or the forkserver, one line."""
    import signal
    import time

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # as from a terminal: SIGINT at its default, whatever an earlier test left in this process
    process = subprocess.Popen([sys.executable, "-m", *argv], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(6)
    assert process.poll() is None, "the command ended before the SIGINT: give it more work"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert "Traceback" not in err, err[-600:]
    assert len(err.strip().splitlines()) <= 1, err[-600:]


def test_a_database_with_another_verdicts_table_is_refused_at_start(tmp_path):
    """A SQLite file whose `verdicts` table has other columns opened fine; every POST and GET
    then failed with sqlite3.OperationalError (HTTP 500) instead of one refusal at start."""
    import sqlite3

    from overlap_course import progress_service

    db = tmp_path / "room.sqlite"
    other = sqlite3.connect(db)
    other.execute("CREATE TABLE verdicts (x TEXT)")
    other.commit()
    other.close()
    with pytest.raises(ValueError, match="room.sqlite"):
        store = progress_service.open_store(str(db))
        store.add("ana", {"notebook": "00_start_here", "check": "check_race", "passed": True,
                          "category": "passed"})


def test_two_unreadable_databases_in_one_second_are_both_kept(tmp_path, monkeypatch):
    """The aside name has one-second resolution: a second unreadable file moved aside in the
    same second replaced the first one (os.replace), which was silently lost.  The clock is
    held at one second so the case does not depend on timing."""
    from overlap_course import progress_service

    monkeypatch.setattr(progress_service.time, "strftime", lambda fmt: "20261202-000000")

    db = tmp_path / "room.sqlite"
    for content in (b"first damaged file " * 50, b"second damaged file" * 50):
        db.write_bytes(content)
        progress_service.open_store(str(db)).db.close()
        db.unlink()
    kept = sorted(p.read_bytes()[:6] for p in tmp_path.glob("room.sqlite.unreadable-*")
                  if not p.name.endswith(("-wal", "-shm")))
    assert kept == [b"first ", b"second"]


FORGED_REPORT = '''
import os, sys
def correct_seqlens_qk(*args, **kwargs):
    return None
if sys.flags.isolated:  # the judge: its report's path is its last argument
    with open(sys.argv[-1], "w") as f:
        f.write('{"passed": true, "message": "forged"}')
    os._exit(0)
'''


def test_a_code_answer_cannot_write_the_judges_report_itself():
    """A code answer runs in the judge's process, which has the report's path in sys.argv: a
    cell that writes a passing report and exits 0 scores full marks with no answer at all
    (judge.py's docstring names this as not covered; the rule is that no submission can raise
    its own grade)."""
    from overlap_course.build import judge

    passed, message = judge.judge("check_correction", [FORGED_REPORT])
    assert not passed, message


def test_a_huge_progress_record_is_read_within_bounded_memory(tmp_path):
    """A 512 MB record (sparse: NUL bytes, no newline) under a 256 MB cap: read_record reads it
    whole, so your_progress() raised MemoryError instead of skipping what it cannot read.  (It
    was 2 GB under 1 GB: 6.1 s of reading, now 1.7 s; the process holds 26 MB before it reads,
    and reading the 512 MB whole under this cap is still a MemoryError.)"""
    record = tmp_path / "progress.jsonl"
    with open(record, "wb") as f:
        f.truncate(ONE_GB // 2)
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (1 << 28, 1 << 28))\n"
            "from overlap_course.progress import your_progress\n"
            "print(your_progress(sys.argv[1]).counts()['not reached'] > 0)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", code, str(record)], capture_output=True,
                         text=True, timeout=120, env=env)
    assert run.stdout.strip() == "True", run.stderr.strip().splitlines()[-1:]

"""Issue 34's third hostile round, its command lines and file readers (items 4, 5, 6, 7, 10, 12
of the tester's notes, copied from tests/test_hostile_34_round3.py; the last tests are cases
found beside them): each fails before its fix.  Command lines run as subprocesses, bounded in
time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_support import run_module as _run, one_clear_line as _one_clear_line

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ the trace command (4, 5)

KERNEL = {"cat": "kernel", "name": "k", "ph": "X", "ts": 0, "dur": 5}


def _summary(tmp_path, trace: str) -> subprocess.CompletedProcess:
    (tmp_path / "t.json").write_text(trace)
    return _run("overlap_course.traces.kineto", "summary", "t.json", cwd=tmp_path)


@pytest.mark.timeout(60)
def test_a_trace_whose_device_work_is_all_on_stream_minus_1_names_the_problem(tmp_path):
    """Exit 2 with ``error: min() arg is an empty sequence``: an internal error's text, which
    says nothing about the trace (stream -1 is left out of the per-stream figures)."""
    run = _summary(tmp_path, json.dumps({"traceEvents": [{**KERNEL, "args": {"stream": -1}}]}))
    _one_clear_line(run, "t.json", "stream -1")
    assert "min() arg" not in run.stderr and "empty sequence" not in run.stderr, run.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("trace", [
    '{"nottrace": 1, "%s": 1}' % ("k" * 1_000_000),
    '{"traceEvents": [{"cat": "kernel", "name": "k", "ts": 0, "dur": 5, '
    '"args": {"stream": "%s"}}]}' % ("s" * 1_000_000),
    '{"traceEvents": [{"cat": "%s", "name": "k", "ts": "x", "dur": 5}]}' % ("c" * 1_000_000),
    '{"traceEvents": [{"cat": "kernel", "name": "k", "ts": "%s", "dur": 5}]}' % ("t" * 10**6)],
    ids=["long-key", "long-stream", "long-cat", "long-ts-control"])
def test_a_refusal_quotes_a_short_excerpt_not_a_megabyte(tmp_path, trace):
    """The refusal is one line, but it quoted the whole key / args.stream / cat: 1,000,145
    bytes on stderr for a 1 MB key (the keys are cut to 8, not their length)."""
    run = _summary(tmp_path, trace)
    _one_clear_line(run)
    assert len(run.stderr) < 2000, f"{len(run.stderr)} bytes on stderr"


@pytest.mark.timeout(60)
def test_a_refusal_escapes_a_terminal_escape_in_a_category(tmp_path):
    run = _summary(tmp_path, json.dumps({"traceEvents": [{**KERNEL, "cat": "\x1b[31mred",
                                                          "ts": "x"}]}))
    _one_clear_line(run, "\\x1b[31mred")
    assert "\x1b" not in run.stderr


# ------------------------------------------------------------------ the progress record (6, 7)

def _slot_line(category: str) -> str:
    return json.dumps({"notebook": "01_tiny_gpt", "check": "check_slot", "passed": False,
                       "category": category, "time": 1})


def _progress(tmp_path, *lines: str) -> subprocess.CompletedProcess:
    record = tmp_path / "progress.jsonl"
    record.write_text("".join(line + "\n" for line in lines))
    return _run("overlap_course.progress", str(record))


@pytest.mark.timeout(60)
def test_a_record_line_with_a_lone_surrogate_does_not_stop_the_progress_view(tmp_path):
    """JSON ``"\\ud800"`` is ASCII (it passes the UTF-8 check) but reads as a lone surrogate:
    printing the table failed, exit 2 ``error: 'utf-8' codec can't encode character '\\ud800'
    ... surrogates not allowed`` -- one odd line hid the learner's whole record."""
    run = _progress(tmp_path, _slot_line("\ud800oops"))
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert "check_slot (last mistake: \\ud800oops)" in run.stdout


@pytest.mark.timeout(60)
def test_a_record_category_with_a_line_break_does_not_break_the_table(tmp_path):
    """A category holding a line break and a terminal escape was printed raw: the table gained
    a line, and ``ESC[31m`` turned the learner's terminal red."""
    run = _progress(tmp_path, _slot_line("wrong\n    passed       check_race\x1b[31m"))
    assert run.returncode == 0, run.stderr
    assert "\x1b" not in run.stdout
    assert "passed       check_race\n" not in run.stdout.split("check_slot", 1)[-1][:80]
    assert "(last mistake: wrong\\n    passed       check_race\\x1b[31m)" in run.stdout


@pytest.mark.timeout(60)
def test_a_record_category_of_ten_thousand_characters_is_shown_cut(tmp_path):
    run = _progress(tmp_path, _slot_line("x" * 10_000))
    assert run.returncode == 0, run.stderr
    assert f"(last mistake: {'x' * 60}...)" in run.stdout and len(run.stdout) < 10_000


@pytest.mark.timeout(60)
def test_control_a_plain_record_line_is_shown(tmp_path):
    run = _progress(tmp_path, _slot_line("wrong"))
    assert run.returncode == 0 and "check_slot (last mistake: wrong)" in run.stdout


# ------------------------------------------------------------------ the progress service (10)

def _guide(tmp_path: Path, kind: str) -> str:
    path = tmp_path / f"guide-{kind}"
    if kind == "folder":
        path.mkdir()
    elif kind == "not-utf8":
        path.write_bytes(b"\xff\xfe\x00 not a guide")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "missing":
        pass
    else:
        return "/dev/zero"
    return str(path)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["folder", "not-utf8", "fifo", "device", "missing"])
def test_the_service_refuses_a_guide_file_it_cannot_read_at_start(tmp_path, kind, monkeypatch,
                                                                capsys):
    """``--guide-file`` was never looked at before serving: the service started, and the guide
    page raised per request (IsADirectoryError, UnicodeDecodeError), or blocked the event loop
    -- every request of the room -- on a FIFO, or read /dev/zero until memory ran out."""
    from overlap_course import progress_service as ps
    monkeypatch.setattr(ps, "serve", lambda store, a, host, port: 0)  # no hub here
    guide = _guide(tmp_path, kind)
    code = ps.main(["--db", str(tmp_path / "db.sqlite"), "--guide-file", guide])
    err = capsys.readouterr().err
    assert code == 2 and "guide" in err and len(err.strip().splitlines()) == 1, (code, err)
    assert repr(guide) in err, err


@pytest.mark.timeout(30)
def test_the_guide_reader_does_not_block_on_a_fifo(tmp_path):
    """``guide_mistakes(Path(fifo))`` never returned (``read_text`` waits for a writer); in
    the service that is the guide page's handler, on the event loop."""
    fifo = _guide(tmp_path, "fifo")
    code = ("import sys; from pathlib import Path\n"
            "from overlap_course import progress_service as ps\n"
            "try:\n    ps.guide_mistakes(Path(sys.argv[1]))\nexcept ValueError:\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        run = subprocess.run([sys.executable, "-c", code, fifo], capture_output=True, text=True,
                             timeout=8, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("guide_mistakes on a FIFO still waiting after 8 s")
    assert run.returncode == 0, run.stderr[-300:]


@pytest.mark.timeout(30)
def test_control_the_service_starts_with_the_shipped_guide(tmp_path, monkeypatch):
    from overlap_course import progress_service as ps
    monkeypatch.setattr(ps, "serve", lambda store, a, host, port: 0)
    monkeypatch.setattr(ps, "HubOAuth", object)  # as where the hub is installed
    guide = str(ROOT / "docs" / "instructor_guide.md")
    assert ps.main(["--db", str(tmp_path / "db.sqlite"), "--guide-file", guide]) == 0
    assert ps.guide_mistakes(Path(guide))


# ------------------------------------------------------------------ export's two files (12)

def _export_both(tmp_path) -> subprocess.CompletedProcess:
    return _run("overlap_course.traces.kineto", "export", "o.json", "--prompts", "1",
                "--max-new-tokens", "2", cwd=tmp_path, timeout=15)


@pytest.mark.timeout(60)
def test_export_of_both_modes_refuses_a_fifo_as_the_serial_file(tmp_path):
    """OUT was checked (a FIFO as OUT is refused), but not OUT_serial / OUT_zos, the files that
    recording both modes writes: with o_serial.json a FIFO, the command recorded both runs,
    then waited forever to open the FIFO."""
    os.mkfifo(tmp_path / "o_serial.json")
    try:
        run = _export_both(tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail("export still waiting on the FIFO o_serial.json after 15 s")
    _one_clear_line(run, "o_serial.json")


@pytest.mark.timeout(60)
def test_export_of_both_modes_refuses_a_folder_as_the_zos_file_before_writing(tmp_path):
    """Exit 2 ``cannot write 'o_zos.json': Is a directory`` -- but only after recording, with
    o_serial.json already written: half of the pair, from a command that failed."""
    (tmp_path / "o_zos.json").mkdir()
    _one_clear_line(_export_both(tmp_path), "o_zos.json")
    assert not (tmp_path / "o_serial.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o_zos.json"]


@pytest.mark.timeout(60)
def test_control_export_of_both_modes_writes_both_files_and_no_other(tmp_path):
    run = _export_both(tmp_path)
    assert run.returncode == 0, run.stderr[-500:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o_serial.json", "o_zos.json"]
    report = json.loads(run.stdout)
    assert sorted(report) == ["o_serial.json", "o_zos.json"]
    trace = json.loads((tmp_path / "o_zos.json").read_text())
    assert trace["traceName"] == "o_zos.json"


# ------------------------------------------------------------------ found beside them

@pytest.mark.timeout(60)
@pytest.mark.parametrize("args", [["export", "o.json", "x" * 5000],
                                  ["export", "x" * 5000, "cpu_zos"]], ids=["stored", "out"])
def test_export_refuses_a_path_too_long_for_the_system_in_one_short_line(tmp_path, args):
    """``Path(...).exists()`` raised ``OSError: [Errno 36] File name too long``: a traceback."""
    run = _run("overlap_course.traces.kineto", *args, cwd=tmp_path)
    _one_clear_line(run, "STORED" if args[-1] != "cpu_zos" else "OUT")
    assert len(run.stderr) < 1000, f"{len(run.stderr)} bytes on stderr"


@pytest.mark.timeout(60)
def test_the_progress_view_quotes_a_long_path_cut(tmp_path):
    """A 5000-character RECORD that cannot be opened was quoted whole (5,135 bytes)."""
    run = _run("overlap_course.progress", "x" * 5000, cwd=tmp_path)
    _one_clear_line(run, "the progress record 'xxx")
    assert len(run.stderr) < 1000, f"{len(run.stderr)} bytes on stderr"


@pytest.mark.timeout(60)
def test_a_refusal_escapes_a_terminal_escape_in_a_path(tmp_path):
    """The summary's "no device work before the last ProfilerStep" named the file unquoted, and
    ``one_line`` escaped only line breaks: ESC in the file's name reached the terminal."""
    step = {"cat": "user_annotation", "ph": "X", "dur": 1}
    events = [{**step, "name": "ProfilerStep#0", "ts": 0},
              {**step, "name": "ProfilerStep#1", "ts": 10}, {**KERNEL, "ts": 20, "tid": 7}]
    name = "t\x1b[31m.json"
    (tmp_path / name).write_text(json.dumps({"traceEvents": events}))
    run = _run("overlap_course.traces.kineto", "summary", name, cwd=tmp_path)
    _one_clear_line(run, "t\\x1b[31m.json", "last ProfilerStep")
    assert "\x1b" not in run.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args", [["overlap_course.build.notebooks", "x" * 100_000],
                                  ["overlap_course.build.handout", "x" * 100_000],
                                  ["overlap_course.build.slides", "x" * 100_000]],
                         ids=["invalid-choice", "unrecognized", "notebook-name-too-long"])
def test_a_command_line_quotes_a_100_kb_argument_cut(tmp_path, args):
    """argparse quotes a bad argument whole (100,043 bytes on stderr); the slides' notebook
    check raised ``OSError: File name too long`` from ``Path.exists()``: a traceback."""
    run = _run(*args, cwd=tmp_path)
    _one_clear_line(run, "error")
    assert len(run.stderr) < 1100, f"{len(run.stderr)} bytes on stderr"

"""Issue 34, cases 2-6: the edges a hostile learner found in the trace import and export, the
bench, the progress record and the room's service.  Each test is one reported case (or one
found beside it); the commands run in-process (``main(argv)``), a few through ``python -m``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from overlap_course import progress, safe_json
from overlap_course import progress_service as ps
from overlap_course import progress_store
from overlap_course.measure import bench
from overlap_course.traces import kineto

ROOT = Path(__file__).resolve().parent.parent
KINETO = "python -m overlap_course.traces.kineto"


def _strict_json(text: str):
    """JSON as the standard reads it: NaN and Infinity are not JSON."""
    def refuse(name):
        raise AssertionError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _run(main, argv, capsys) -> tuple[int, str, str]:
    """``main(argv)`` in-process: (exit status, stdout, stderr); argparse's exits included."""
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_refusal(result, *says):
    code, out, err = result
    assert code == 2, (code, out, err)
    assert out == "" and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for word in says:
        assert word in err, err
    return err


def _kernel(ts, dur, **over):
    ev = {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur, "args": {"stream": 7}}
    ev.update(over)
    return ev


# ---------------------------------------------------------------------------- 2. trace import

def _raw_trace(tmp_path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_trace_of_100000_nested_brackets_is_refused_by_every_reader(tmp_path, capsys):
    path = _raw_trace(tmp_path, "nested.json", "[" * 100_000)
    for reader in (kineto.read_trace, kineto.summary, kineto.to_timeline):
        with pytest.raises(ValueError, match="nests arrays/objects more than 64 deep") as e:
            reader(path)
        assert str(path) in str(e.value)
    _one_line_refusal(_run(kineto.main, ["summary", str(path)], capsys), "more than 64 deep",
                      str(path))


def test_a_400_digit_timestamp_is_refused_naming_the_file(tmp_path, capsys):
    text = json.dumps({"traceEvents": [_kernel(0, 5)]}).replace('"ts": 0', '"ts": 1' + "0" * 400)
    path = _raw_trace(tmp_path, "long.json", text)
    for reader in (kineto.summary, kineto.to_timeline):
        with pytest.raises(ValueError, match="a number 401 characters long") as info:
            reader(path)
        assert str(path) in str(info.value)
    _one_line_refusal(_run(kineto.main, ["summary", str(path)], capsys), "401 characters")


def test_a_huge_integer_in_a_loaded_trace_is_a_clear_error_not_an_overflow():
    """A dict handed to the reader skips the file reader's bounds: the event checks hold alone."""
    with pytest.raises(ValueError, match=r"traceEvents\[0\] \(kernel 'k'\): 'ts' is an integer of"):
        kineto.summary({"traceEvents": [_kernel(10**400, 5)]})


@pytest.mark.parametrize("ts, dur", [(1e308, 1e308), (0, 1e308), (-1e308, 1.0), (1e19, 1)])
def test_times_that_overflow_are_refused_not_printed_as_nan(tmp_path, capsys, ts, dur):
    path = _raw_trace(tmp_path, "huge.json", json.dumps({"traceEvents": [_kernel(ts, dur),
                                                                         _kernel(0, 1)]}))
    _one_line_refusal(_run(kineto.main, ["summary", str(path)], capsys), str(path),
                      "traceEvents[0] (kernel 'k')", "a time must be a finite number")


def test_to_timeline_names_the_file_and_the_event(tmp_path):
    events = [_kernel(0, 1), _kernel(5, 1e308)]
    path = _raw_trace(tmp_path, "inf.json", json.dumps({"traceEvents": events}))
    with pytest.raises(ValueError) as info:
        kineto.to_timeline(path)
    assert str(path) in str(info.value) and "traceEvents[1] (kernel 'k'): 'dur'" in str(info.value)


def test_the_largest_times_allowed_still_give_json(tmp_path, capsys):
    """At the bound (1e18 us) every figure of the summary is finite: valid JSON, exit 0."""
    events = [_kernel(-1e18, 1e18), _kernel(1e18 - 1, 1)]
    path = _raw_trace(tmp_path, "edge.json", json.dumps({"traceEvents": events}))
    code, out, err = _run(kineto.main, ["summary", str(path)], capsys)
    assert (code, err) == (0, "")
    assert _strict_json(out)["device_span_us"] == 2e18


def test_summary_into_a_closed_pipe_ends_quietly():
    """``./run.sh trace summary ... | head``: the reader is gone before the JSON is written."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "overlap_course.traces.kineto", "summary",
                             "a100_event_sync"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # long before the interpreter has started and read the trace
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and err == "", err


# ---------------------------------------------------------------------------- 3. trace export

def test_export_to_a_directory_is_one_line(tmp_path, capsys):
    _one_line_refusal(_run(kineto.main, ["export", str(tmp_path), "cpu_zos"], capsys),
                      "names a folder: name a file in it")


def test_export_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "plain").write_text("x")
    out = tmp_path / "plain" / "deeper" / "trace.json"
    _one_line_refusal(_run(kineto.main, ["export", str(out), "cpu_zos"], capsys),
                      "which is a file, not a directory")


def test_export_where_nothing_can_be_written_is_one_line(capsys):
    out = "/proc/no_such_dir/trace.json"
    _one_line_refusal(_run(kineto.main, ["export", out, "cpu_zos"], capsys),
                      f"cannot write '{out}'", "choose a path")


def _stored_zos(tmp_path, change) -> Path:
    from overlap_course.traces.recorded import TRACES_DIR
    data = json.loads((TRACES_DIR / "cpu_zos.json").read_text())
    change(data)
    path = tmp_path / "stored.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("change, says", [
    (lambda d: d.update(origin_ns=10**400), "origin_ns is not a clock reading"),
    (lambda d: d["spans"][3].update(end_ms=1e308), "spans reach inf us"),
    (lambda d: d["spans"][3].update(start_ms=-1e17), "beyond the 1e+18 us a trace may hold"),
    (lambda d: d["spans"][3].update(end_ms=10**400),
     "end_ms must be a finite number, got an integer"),
])
def test_export_of_a_stored_run_whose_times_overflow_writes_nothing(tmp_path, capsys, change, says):
    """Found beside case 3: an OverflowError traceback, or a file with Infinity that the
    course's own reader then refused, naming the output instead of the input."""
    out = tmp_path / "out.json"
    _one_line_refusal(_run(kineto.main, ["export", str(out), str(_stored_zos(tmp_path, change))],
                           capsys), says)
    assert not out.exists()


@pytest.mark.parametrize("flags, says", [
    (["--prompts", "0"], "argument --prompts"),
    (["--host-overhead-ms", "nan"], "--host-overhead-ms"),
    (["--max-new-tokens", "1e3"], "whole number"), (["--device", "tpu"], "invalid choice")])
def test_export_flags_are_checked_before_recording(tmp_path, capsys, flags, says):
    _one_line_refusal(_run(kineto.main, ["export", str(tmp_path / "t.json"), *flags], capsys), says)


# ---------------------------------------------------------------------------- 4. the bench

@pytest.mark.parametrize("flags, says", [
    (["--host-overhead-ms", "-1"], "argument --host-overhead-ms: must be a finite number from 0"),
    (["--host-overhead-ms", "nan"], "got nan"),
    (["--host-overhead-ms", "1e400"], "got 1e400"),
    (["--modes", "nope"], "mode 'nope' is unknown: modes are serial, zos, serial+spec, zos+spec"),
    (["--modes", "zos,zos"], "named twice"),
    (["--repeats", "0"], "argument --repeats: must be from 1 to 100"),
    (["--requests", "0"], "argument --requests: must be from 1 to 10000"),
    (["--temperature", "inf"], "--temperature"),
    (["--batch-size", "-3"], "--batch-size"),
])
def test_bench_bad_flags_are_one_line_before_any_engine(monkeypatch, capsys, flags, says):
    def no_engine(config):
        raise AssertionError("an engine was started for a bad flag")

    monkeypatch.setattr(bench, "Engine", no_engine)
    _one_line_refusal(_run(bench.main, flags, capsys), "overlap_course.measure.bench", says)


@pytest.mark.parametrize("kwargs, error, says", [
    (dict(repeats=0), ValueError, "repeats must be in"),
    (dict(num_requests=0), ValueError, "num_requests"),
    (dict(modes=("nope",)), ValueError, "unknown"),
    (dict(modes="serial"), ValueError, "non-empty list"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
    (dict(temperature="hot"), TypeError, "temperature"),
])
def test_run_bench_checks_its_arguments_before_any_engine(monkeypatch, kwargs, error, says):
    monkeypatch.setattr(bench, "Engine", lambda config: pytest.fail("an engine was started"))
    with pytest.raises(error, match=says):
        bench.run_bench(**kwargs)


def test_the_default_workload_has_as_many_prompts_as_asked():
    """71 and more requests used to index past the corpus's 70 documents (IndexError)."""
    assert bench.default_workload(16) == bench.default_workload(500)[:16]
    assert len(bench.default_workload(500)) == 500


def test_bench_bad_flag_through_python_m():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "overlap_course.measure.bench", "--repeats", "0"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert "argument --repeats" in done.stderr


# ---------------------------------------------------------------------------- 5. the record

@pytest.fixture
def record_file(tmp_path, monkeypatch):
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(progress.ENV_FILE, str(path))
    monkeypatch.delenv(progress.ENV_URL, raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.setattr(progress, "_said", set())
    return path


def _verdict(passed: bool, category: str):
    from overlap_course.checks.verdict import Verdict
    return Verdict(passed, "", category=category)


def test_a_verdict_after_a_torn_line_is_kept(record_file):
    """A kernel killed mid-write left half a line; the next verdict must not be glued onto it."""
    progress.record(_verdict(False, "no_flush"), "check_zos_loop")
    whole = record_file.read_bytes()
    record_file.write_bytes(whole + whole[: len(whole) // 2])  # the second write, cut short
    progress.record(_verdict(True, "passed"), "check_zos_loop")
    entries, unreadable = progress.read_record(record_file)
    assert [(e["check"], e["passed"]) for e in entries] == [("check_zos_loop", False),
                                                            ("check_zos_loop", True)]
    assert unreadable == 1
    mine = progress.your_progress(record_file)
    assert mine.status[("03_zos_loop", "check_zos_loop")]["state"] == "passed"


def test_a_record_that_is_not_utf8_is_read_around(record_file):
    progress.record(_verdict(True, "passed"), "check_slot")
    junk_after = b"\x80\x81\n[[[[[\n" + b'{"time": 1' + b"0" * 400 + b"}\n"
    record_file.write_bytes(b"\xff\xfe\x00garbage\n" + record_file.read_bytes() + junk_after)
    mine = progress.your_progress(record_file)
    assert mine.status[("01_tiny_gpt", "check_slot")]["state"] == "passed"
    assert mine.unreadable == 4
    text = repr(mine)
    assert text.count("are not verdicts") == 1 and "4 line(s)" in text
    assert mine._repr_html_().count("are not verdicts") == 1
    progress.record(_verdict(False, "wrong"), "check_decode_lengths")  # writing still works
    assert len(progress.read_record(record_file)[0]) == 2


def _append_many(path: str, writer: int, count: int) -> None:
    for i in range(count):
        progress._append(Path(path), json.dumps({"writer": writer, "i": i, "pad": "x" * 200}))


def test_writers_in_several_processes_at_once_lose_no_line(tmp_path):
    """The torn-write repair (a newline first when the last byte is not one) must not cost
    concurrent kernels their lines: each line is one unbuffered write."""
    import multiprocessing

    path = tmp_path / "progress.jsonl"
    path.write_bytes(b'{"cut sh')  # a torn line to start from
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(path), w, 200)) for w in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    lines = [line for line in path.read_bytes().split(b"\n")[1:] if line]
    got = sorted((d["writer"], d["i"]) for d in map(json.loads, lines))
    assert got == [(w, i) for w in range(4) for i in range(200)]


def test_a_clean_record_says_nothing_about_unreadable_lines(record_file):
    progress.record(_verdict(True, "passed"), "check_slot")
    assert progress.read_record(record_file)[1] == 0
    assert "are not verdicts" not in repr(progress.your_progress(record_file))


# ---------------------------------------------------------------------------- 6. the room's service

GOOD = {"notebook": "03_zos_loop", "check": "check_zos_loop", "passed": False,
        "category": "no_flush", "time": 1796000000.5}


@pytest.mark.parametrize("body, says", [
    (b"[" * 16_000, "nests arrays/objects more than 64 deep"),
    (b'{"a": ' * 2000 + b"1" + b"}" * 2000, "more than 64 deep"),
    (json.dumps(dict(GOOD, time=0)).replace('"time": 0', '"time": 1' + "0" * 399).encode(),
     "a number 400 characters long"),
    (json.dumps(dict(GOOD, time=10**30)).encode(), "time must be seconds since the epoch"),
    (json.dumps(dict(GOOD, time=1e300)).encode(), "time must be seconds since the epoch"),
    (json.dumps(dict(GOOD, time=-5)).encode(), "time must be"),
    (json.dumps(GOOD).replace("1796000000.5", "1e400").encode(), "too large for a float"),
])
def test_a_body_the_service_cannot_read_is_a_400(body, says):
    assert len(body) <= progress.MAX_BODY_BYTES
    code, why, verdict = ps.validate(body, "ada")
    assert (code, verdict) == (400, None) and says in why, why


def test_every_verdict_the_service_accepts_can_be_stored(tmp_path):
    store = ps.Store(str(tmp_path / "db.sqlite"))
    for t in (0, progress_store.MAX_TIME_S, 1796000000.5, None):
        body = json.dumps({k: v for k, v in dict(GOOD, time=t).items() if v is not None}).encode()
        code, _, verdict = ps.validate(body, "ada")
        assert code == 201
        store.add("ada", verdict)
    assert store.count() == 4


def test_a_damaged_database_is_moved_aside_and_a_fresh_one_started(tmp_path, capsys):
    db = tmp_path / "course-progress.sqlite"
    db.write_bytes(b"this is not a database" * 100)
    store = ps.open_store(str(db))
    assert store.count() == 0
    [aside] = [p for p in tmp_path.iterdir() if ".unreadable-" in p.name]
    assert aside.read_bytes() == b"this is not a database" * 100  # kept for recovery
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(db) in err and str(aside) in err and "fresh" in err


def test_a_database_damaged_inside_is_moved_aside_too(tmp_path, capsys):
    db = tmp_path / "course-progress.sqlite"
    store = ps.Store(str(db))
    for i in range(300):
        store.add(f"learner{i}", GOOD)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.db.close()
    raw = bytearray(db.read_bytes())
    raw[4096 + 200: 4096 * 3] = b"\xab" * (4096 * 2 - 200)  # pages 2-3: the rows
    db.write_bytes(bytes(raw))
    again = ps.open_store(str(db))
    assert again.count() == 0 and "moved it to" in capsys.readouterr().err


def test_a_database_that_cannot_be_opened_is_a_clear_refusal(tmp_path, capsys):
    missing = tmp_path / "no_such_folder" / "course-progress.sqlite"
    err = _one_line_refusal(_run(ps.main, ["--db", str(missing)], capsys), str(missing),
                            "check that its folder exists")
    assert "DatabaseError" not in err
    _one_line_refusal(_run(ps.main, ["--db", str(tmp_path)], capsys), "names a folder")


def test_a_bad_service_url_is_a_clear_refusal(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JUPYTERHUB_SERVICE_URL", "http://hub:port/")
    _one_line_refusal(_run(ps.main, ["--db", str(tmp_path / "db.sqlite")], capsys),
                      "JUPYTERHUB_SERVICE_URL", "http://HOST:PORT")


def test_the_service_refuses_an_unopenable_database_through_python_m(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "overlap_course.progress_service", "--db",
                           str(tmp_path / "gone" / "x.sqlite")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "cannot open the database" in done.stderr


# ---------------------------------------------------------------------------- the shared reader

def test_safe_json_reads_what_json_reads_within_its_bounds():
    doc = {"a": [1, 2.5, None, True, "[[{"], "b": {"c": -3e-7, "d": "\\\"["}}
    assert safe_json.loads(json.dumps(doc)) == doc
    assert safe_json.loads(json.dumps(doc).encode()) == doc
    assert safe_json.loads("[" * 64 + "]" * 64) is not None
    with pytest.raises(safe_json.JSONRefused, match="more than 64 deep"):
        safe_json.loads("[" * 65 + "]" * 65)
    with pytest.raises(safe_json.JSONRefused, match="NaN, which is not JSON"):
        safe_json.loads("[NaN]")
    with pytest.raises(safe_json.JSONRefused, match="not UTF-8"):
        safe_json.loads(b"[\xff]")
    with pytest.raises(safe_json.JSONRefused, match="not finite"):
        safe_json.dumps({"x": float("inf")})


def test_safe_json_is_quick_on_a_large_trace():
    events = [_kernel(i * 10, 5, args={"stream": 7, "name": "[{" * 3}) for i in range(30_000)]
    text = json.dumps({"traceEvents": events})
    start = time.perf_counter()
    assert len(safe_json.loads(text)["traceEvents"]) == 30_000
    assert time.perf_counter() - start < 20  # generous: about 0.2 s on a quiet machine


"""Every verdict recorded in the learner's home (overlap_course/progress.py), read back by
your_progress(), and queued for a hub's progress service without delaying the check."""

from __future__ import annotations

import http.server
import json
import os
import re
import threading
import time
from pathlib import Path

import nbformat
import pytest

from overlap_course import checks
from overlap_course import progress

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def record_file(tmp_path, monkeypatch):
    path = tmp_path / "home" / ".overlap_course" / "progress.jsonl"
    monkeypatch.setenv(progress.ENV_FILE, str(path))
    monkeypatch.delenv(progress.ENV_URL, raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.setattr(progress, "_said", set())
    monkeypatch.setattr(progress, "_service_trouble", [])
    return path


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _calls(path: Path) -> set[str]:
    """The checks a notebook calls (``check:name`` for a check asked under another name)."""
    found = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        for m in re.finditer(r"\bchecks\.(check_\w+)\(([^\n]*)", cell.source):
            name = re.search(r"\bname=\"(\w+)\"", m.group(2))
            found.add(f"{m.group(1)}:{name.group(1)}" if name else m.group(1))
    return found


def test_the_catalogue_is_every_check_the_course_calls():
    called: dict[str, set] = {}
    for folder in ("notebooks", "source"):
        for nb in sorted((ROOT / folder).glob("*.ipynb")):
            called[nb.stem] = _calls(nb)
    # Notebook 00 previews exercise 02's checker; it is recorded under the exercise.
    called["00_start_here"].discard("check_serial_loop")
    assert {nb: set(checks) for nb, checks in progress.CATALOGUE.items()} == \
        {nb: checks for nb, checks in called.items() if checks}
    assert sorted(progress.ORDER) == sorted(progress.CATALOGUE)


def test_a_notebook_check_is_recorded_without_the_answer(record_file):
    wrong = checks.check_slot(7777, table=[5, 2, 9], pos=9, block_size=4)
    right = checks.check_slot(9 * 4 + 1, table=[5, 2, 9], pos=9, block_size=4)
    assert (wrong.passed, right.passed) == (False, True)
    entries = _lines(record_file)
    assert [(e["notebook"], e["check"], e["passed"], e["category"]) for e in entries] == [
        ("01_tiny_gpt", "check_slot", False, "wrong"), ("01_tiny_gpt", "check_slot", True, "passed")]
    assert set(entries[0]) == {"v", "notebook", "check", "passed", "category", "time"}
    assert "7777" not in record_file.read_text()  # never the learner's answer
    assert abs(entries[1]["time"] - time.time()) < 60


def test_an_exercise_checker_is_recorded_with_its_category(record_file):
    verdict = checks.check_metadata_answer({"seqlens_q"})
    assert not verdict.passed
    [entry] = _lines(record_file)
    assert (entry["notebook"], entry["check"], entry["passed"]) == ("04_seqlen_correction",
                                                                    "check_metadata_answer", False)
    assert entry["category"] == verdict.category != "passed"


def _not_written(*args):
    raise NotImplementedError


def _stub_calls() -> dict:
    """Every public check, answered with its notebook stub: None, or a function not written yet."""
    from types import SimpleNamespace

    from toy_engine.timeline import Timeline

    run = SimpleNamespace(timeline=Timeline(), stats=SimpleNamespace(device_idle_fraction=0.0))
    one = (None,)
    return {
        "check_done_after_wait": one, "check_race": (None, None), "check_race_fixed": (None, None),
        "check_slot": (None, [0], 0, 4), "check_decode_lengths": (None, None, [3]),
        "check_round_gap": (None, None, 1), "check_largest_host_stage": (None, None), "check_overhead_gap": one,
        "check_serial_loop": (_not_written,), "check_idle_fraction": (_not_written, run),
        "check_processed_under": (None, None, 1), "check_swapped_order": (None, True, False),
        "check_tokens_lost": (None, None, None), "check_future_inputs": (None, None, None),
        "check_ideal_ratio": (None, None), "check_zos_loop": (_not_written,), "check_three_rounds": one,
        "check_true_key_length": (None, 1, 1), "check_corrected_slots": (None, [0], [0], 1, 4),
        "check_correction": (_not_written,), "check_metadata_answer": one,
        "check_uncommitted_rounds": (None, None, 1), "check_discarded": (None, None),
        "check_race_report": (None, None), "check_process_outputs": (_not_written,),
        "check_idle_share": (None, None), "check_idle_sync": (None, None),
        "check_wasted_round": (None, None), "check_wants_more": (_not_written,),
        "check_abort_in_flight": (None, None), "check_abort": (_not_written,), "check_ring_race": (None, None, 3),
        "check_ring_slots": (_not_written,), "check_overshoot": (None, None), "check_commit": (_not_written,),
        "check_stale_mask": (None, None), "check_before_sample": (_not_written,),
        "check_token_leak": (None, None), "check_future_key": (_not_written,),
    }


def test_every_check_records_each_verdict_exactly_once(record_file):
    calls = _stub_calls()
    assert set(calls) == {name for name in checks.__all__ if name.startswith("check_")}
    for name, args in calls.items():
        verdict = getattr(checks, name)(*args)
        assert not verdict.passed and verdict.category in progress.UNANSWERED, (name, verdict)
    assert [e["check"] for e in _lines(record_file)] == list(calls)


def test_a_second_question_of_one_check_is_its_own_entry(record_file):
    checks.check_discarded(None, None, name="discarded_by_abort")
    checks.check_discarded(None, None)
    assert [e["check"] for e in _lines(record_file)] == ["check_discarded:discarded_by_abort", "check_discarded"]
    assert {e["category"] for e in _lines(record_file)} == {"unanswered"}


def test_the_kernels_notebook_decides_where_a_shared_check_goes(record_file, monkeypatch):
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/ada/exercises/02_serial_loop.ipynb")
    progress.record(checks.Verdict(False, "x", "not_serial"), check="check_serial_loop")
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/ada/notebooks/00_start_here.ipynb")
    progress.record(checks.Verdict(False, "x", "not_implemented"), check="check_serial_loop")
    assert [e["notebook"] for e in _lines(record_file)] == ["02_serial_loop", "02_serial_loop"]


def test_an_unwritable_record_still_answers_and_says_so_once(tmp_path, monkeypatch):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    monkeypatch.setenv(progress.ENV_FILE, str(blocked / "progress.jsonl"))  # a parent that is a file
    monkeypatch.setattr(progress, "_said", set())
    first = checks.check_slot(37, table=[5, 2, 9], pos=9, block_size=4)
    second = checks.check_slot(37, table=[5, 2, 9], pos=9, block_size=4)
    assert first.passed and second.passed
    assert "your progress is not saved" in first.message
    assert "not saved" not in second.message


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes read-only folders")
def test_a_read_only_home_still_answers(tmp_path, monkeypatch):
    home = tmp_path / "ro"
    home.mkdir()
    home.chmod(0o500)
    monkeypatch.setenv(progress.ENV_FILE, str(home / ".overlap_course" / "progress.jsonl"))
    monkeypatch.setattr(progress, "_said", set())
    verdict = checks.check_slot(37, table=[5, 2, 9], pos=9, block_size=4)
    assert verdict.passed and "not saved" in verdict.message


def test_recording_never_raises(record_file, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(progress, "_record_path", broken)
    verdict = checks.Verdict(True, "fine", "passed")
    assert progress.record(verdict, check="check_slot") is verdict and verdict.message == "fine"


def test_your_progress_passed_tried_not_reached(record_file):
    V = checks.Verdict
    progress.record(V(False, "not answered yet: write it", "unanswered"), check="check_slot")
    progress.record(V(False, "no", "stale"), check="check_correction")
    progress.record(V(False, "no", "off_by_one"), check="check_correction")
    progress.record(V(False, "no", "no_flush"), check="check_zos_loop")
    progress.record(V(True, "yes", "passed"), check="check_zos_loop")
    record_file.open("a").write("not json\n" + json.dumps({"notebook": "99_x", "check": "check_y"}) + "\n")
    mine = progress.your_progress()
    assert mine.status[("01_tiny_gpt", "check_slot")]["state"] == "not reached"  # a stub run is no try
    assert mine.status[("04_seqlen_correction", "check_correction")] == {
        "state": "tried", "category": "off_by_one", "tries": 2}
    assert mine.status[("03_zos_loop", "check_zos_loop")]["state"] == "passed"
    total = sum(len(v) for v in progress.CATALOGUE.values())
    assert mine.counts() == {"passed": 1, "tried": 1, "not reached": total - 2}
    text, page = repr(mine), mine._repr_html_()
    assert "1 passed, 1 tried" in text and "last mistake: off_by_one" in text
    assert "tried: off_by_one" in page and "05_lifetime" in page


def test_no_record_yet_is_all_not_reached(record_file):
    assert progress.your_progress().counts()["not reached"] == sum(len(v) for v in progress.CATALOGUE.values())


class _SlowService(http.server.BaseHTTPRequestHandler):
    delay, got = 2.0, []

    def do_POST(self):  # noqa: N802
        time.sleep(self.delay)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).got.append((self.headers["Authorization"], json.loads(body)))
        self.send_response(201)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *a):
        pass


def test_sending_to_the_service_never_delays_a_check(record_file, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowService)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv(progress.ENV_URL, f"http://127.0.0.1:{server.server_port}/services/course-progress/")
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "learner-token")
        t0 = time.perf_counter()
        verdict = checks.check_slot(37, table=[5, 2, 9], pos=9, block_size=4)
        took = time.perf_counter() - t0
        assert verdict.passed and took < 0.05, f"the check took {took * 1000:.0f} ms with a 2 s service"
        assert progress.flush_sends(timeout=10)
        [(auth, body)] = _SlowService.got
        assert auth == "token learner-token"
        assert body == {k: _lines(record_file)[0][k] for k in ("notebook", "check", "passed", "category", "time")}
    finally:
        server.shutdown()


def test_a_service_that_is_down_is_noted_once_and_the_check_answers(record_file, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowService)
    port = server.server_port
    server.server_close()  # nothing listens there now
    monkeypatch.setenv(progress.ENV_URL, f"http://127.0.0.1:{port}/")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "learner-token")
    first = checks.check_slot(37, table=[5, 2, 9], pos=9, block_size=4)
    assert first.passed and progress.flush_sends(timeout=10)
    second = checks.check_slot(37, table=[5, 2, 9], pos=9, block_size=4)
    third = checks.check_slot(37, table=[5, 2, 9], pos=9, block_size=4)
    assert progress.flush_sends(timeout=10)
    assert "progress service did not answer" in second.message
    assert "did not answer" not in third.message
    assert len(_lines(record_file)) == 3  # the local record has every verdict


def test_under_nbgraders_autograder_a_check_that_did_not_pass_raises(record_file, monkeypatch):
    monkeypatch.setenv(progress.ENV_GRADING, "1")
    assert checks.check_slot(37, table=[5, 2, 9], pos=9, block_size=4).passed
    with pytest.raises(progress.CheckNotPassed, match="check_metadata_answer: "):
        checks.check_metadata_answer({"seqlens_q"})
    assert [e["passed"] for e in _lines(record_file)] == [True, False]  # recorded all the same
    monkeypatch.setenv(progress.ENV_GRADING, "0")
    assert not checks.check_metadata_answer({"seqlens_q"}).passed

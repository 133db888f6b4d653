"""The progress service's rules without a hub: what a verdict may be, what the room's page
shows.  The same rules against the real service on a real hub, through real requests with
real tokens: tests/browser/test_hub_progress.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from overlap_course import progress_service as ps
from overlap_course.progress import CATALOGUE

ROOT = Path(__file__).resolve().parent.parent
GOOD = {"notebook": "03_zos_loop", "check": "check_zos_loop", "passed": False, "category": "no_flush",
        "time": 1796000000.5}


def _body(**change) -> bytes:
    v = dict(GOOD, **change)
    return json.dumps({k: x for k, x in v.items() if x is not ...}).encode()


def test_a_verdict_is_accepted():
    code, _, v = ps.validate(_body(), "ada")
    assert code == 201 and v == GOOD
    assert ps.validate(_body(passed=True, category="passed", time=...), "ada")[0] == 201


@pytest.mark.parametrize("body, code, says", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b"\xff\xfe", 400, "not JSON"),
    (_body(notebook="99_extra"), 422, "unknown notebook"),
    (_body(check="check_slot"), 422, "has no check"),
    (_body(notebook=["03_zos_loop"]), 422, "unknown notebook"),
    (_body(passed="yes"), 400, "passed must be"),
    (_body(passed=True), 400, "exactly when passed"),
    (_body(category="<script>"), 400, "category must be"),
    (_body(category="x" * 200), 400, "category must be"),
    (_body(time="noon"), 400, "time must be"),
    (_body(time=float("nan")), 400, "NaN, which is not JSON"),  # refused by the reader
    (_body(check=...), 400, "missing field"),
    (_body(code="def zos_loop(engine): ..."), 400, "unknown field"),
    (_body(user="ben"), 403, "only your own"),
    (_body(name="ben"), 403, "only your own"),
    (_body(user="ada"), 400, "comes from the token"),
    (b" " * (16 * 1024 + 1), 413, "at most 16384 bytes"),
    (_body(category="a" * 20) + b" " * (2**20), 413, "at most"),
])
def test_a_bad_verdict_is_refused_with_a_status_that_says_why(body, code, says):
    got, why, v = ps.validate(body, "ada")
    assert (got, v) == (code, None) and says in why, why


def test_the_room_learners_by_checks_and_the_common_mistakes():
    entries = {
        "ada": [dict(GOOD, time=1), dict(GOOD, passed=True, category="passed", time=2)],
        "ben": [dict(GOOD, time=1), dict(GOOD, time=2), dict(GOOD, category="not_deferred", time=3),
                {"notebook": "01_tiny_gpt", "check": "check_slot", "passed": False, "category": "unanswered",
                 "time": 4}],
    }
    data = ps.room(entries, learners=["ada", "ben", "cy"])
    key = "03_zos_loop/check_zos_loop"
    assert data["learners"]["ada"][key]["state"] == "passed"
    assert data["learners"]["ben"][key] == {"state": "tried", "category": "not_deferred", "tries": 3}
    assert data["learners"]["ben"]["01_tiny_gpt/check_slot"]["state"] == "not reached"
    assert all(s["state"] == "not reached" for s in data["learners"]["cy"].values())
    assert data["mistakes"] == {key: [["no_flush", 2, 3], ["not_deferred", 1, 1]]}
    assert len(data["checks"]) == sum(len(c) for c in CATALOGUE.values())
    table = ps.render_table(data, "/services/course-progress/guide")
    assert 'href="/services/course-progress/guide#category-no_flush"' in table
    assert 'data-learner="ben"' in table and "tried: not_deferred" in table


def test_names_and_categories_are_escaped_on_the_page():
    entries = {"<b>eve</b>": [dict(GOOD)]}
    table = ps.render_table(ps.room(entries, []), "guide")
    assert "<b>eve</b>" not in table and "&lt;b&gt;eve&lt;/b&gt;" in table


def test_every_category_a_checker_names_has_an_explanation_in_the_guide():
    rows = ps.guide_mistakes(ROOT / "docs" / "instructor_guide.md")
    assert len(rows) >= 100
    from mistakes import WRONG  # tests/mistakes.py: the corpus of wrong answers, one category each

    categories = {m.category for m in WRONG}
    assert categories - {r["category"] for r in rows} == set()


def test_the_store_keeps_verdicts_across_a_restart(tmp_path):
    db = tmp_path / "progress.sqlite"
    ps.Store(str(db)).add("ada", GOOD)
    again = ps.Store(str(db))
    assert again.count() == 1 and again.entries()["ada"][0]["category"] == "no_flush"


def test_the_service_runs_from_six_copied_files_without_torch(tmp_path):
    """Zero to JupyterHub's hub image has no torch: progress_service.py, progress_store.py,
    progress_page.py, progress.py, progress_catalogue.py and safe_json.py suffice."""
    import shutil
    import subprocess
    import sys

    for name in ("progress.py", "progress_catalogue.py", "progress_page.py", "progress_service.py",
                 "progress_store.py", "safe_json.py"):
        shutil.copy(ROOT / "overlap_course" / name, tmp_path / name)
    done = subprocess.run([sys.executable, "-c", "import sys, progress_service as ps; "
                           "print(sorted(m for m in ('torch', 'toy_engine') if m in sys.modules), "
                           "ps.validate(b'{}', 'ada')[0])"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "400"]
    help_text = subprocess.run([sys.executable, str(tmp_path / "progress_service.py"), "--help"],
                               capture_output=True, text=True, timeout=120)
    assert help_text.returncode == 0 and "--instructors" in help_text.stdout, help_text.stderr

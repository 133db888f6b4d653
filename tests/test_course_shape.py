"""The course's shape as the issue asks for it, checked on the stored notebooks.

* every notebook and exercise is at most 30 cells and 1,800 words of prose;
* the learner answers a checked cell at least every ten minutes of reading (2,000 words at
  200 words a minute), counted across notebook boundaries in the order the course is taken;
* the time lines in the headers, the README and the instructor guide are what
  ``scripts/measure_notebooks.py --update`` writes from the recorded measurements;
* the instructor guide's 2- and 3-hour tracks add up and cover the course.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("measure_notebooks", REPO / "scripts" / "measure_notebooks.py")
measure = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(measure)

MAX_CELLS, MAX_WORDS = 30, 1800
WORDS_BETWEEN_CHECKS = 10 * measure.WORDS_PER_MINUTE  # ten minutes of reading


def test_the_course_lists_every_notebook():
    stored = {f"{d}/{p.stem}" for d in ("notebooks", "exercises") for p in (REPO / d).glob("*.ipynb")}
    assert stored == set(measure.COURSE), f"COURSE in scripts/measure_notebooks.py and the stored notebooks differ: " \
                                          f"{sorted(stored ^ set(measure.COURSE))}"


@pytest.mark.parametrize("rel", list(measure.COURSE))
def test_notebook_is_workshop_sized(rel):
    sh = measure.shape(rel)
    assert sh["cells"] <= MAX_CELLS and sh["words"] <= MAX_WORDS, \
        f"{rel}: {sh['cells']} cells, {sh['words']} words (at most {MAX_CELLS} cells and {MAX_WORDS} words)"
    assert sh["checks"] >= (2 if rel.startswith("notebooks/") else 1), f"{rel}: only {sh['checks']} checked cells"


def test_never_ten_minutes_without_a_check():
    words, since, longest = 0, "the start", (0, "")
    for rel in measure.COURSE:
        checked = measure.checked_cells(rel)
        for i, cell in enumerate(nbformat.read(REPO / f"{rel}.ipynb", as_version=4).cells):
            if cell.cell_type == "markdown":
                words += len(measure.TIME_LINE.sub("", cell.source).split())
            elif i in checked:
                longest = max(longest, (words, f"from {since} to {rel} cell {i}"))
                words, since = 0, f"{rel} cell {i}"
    longest = max(longest, (words, f"from {since} to the end"))
    assert longest[0] <= WORDS_BETWEEN_CHECKS, f"{longest[0]} words without a checked cell {longest[1]}"


def test_a_stored_notebook_leaves_its_practice_answers_open():
    """The course's stored run must not give the answers away: every `# your answer` stub is None.
    (A notebook may also demonstrate an exercise's checker: only its own checks hold answers.)"""
    from overlap_course.progress import CATALOGUE

    for rel in measure.COURSE:
        if rel.startswith("notebooks/"):
            own = CATALOGUE[Path(rel).name]
            for cell in nbformat.read(REPO / f"{rel}.ipynb", as_version=4).cells:
                if cell.cell_type == "code" and any(f"checks.{name}(" in cell.source for name in own):
                    fixed = re.findall(r"checks\.check_\w+\((\w+)\)", cell.source)
                    if fixed and all(re.search(rf"^def {f}\(", cell.source, re.M) for f in fixed):
                        continue  # a lab's fix cell: it starts from the shipped bug (tests/test_labs.py)
                    stubs = re.findall(r"^(\w+)\s*=\s*(.+?)\s*#\s*your answer", cell.source, re.M)
                    assert stubs and all(value == "None" for _, value in stubs), \
                        f"{rel}: a checked cell without an open `name = None  # your answer` stub: {cell.source[:80]!r}"


_EXPLORER = re.compile(r"^(\w+)\s*=\s*(?:[\w.]+\.)?TimelineExplorer\(", re.M)


def explorers_closed(cells: list) -> list[str]:
    """Code cells that close an explorer a cell above created: after Run All it would be gone
    (an empty output; issue 23), and nothing needs closing (it holds no engine between runs)."""
    names, closing = set(), []
    for i, cell in enumerate(cells):
        if cell.cell_type == "code":
            if any(re.search(rf"\b{re.escape(n)}\.(?:widget\.)?close\(", cell.source) for n in names):
                closing.append(f"cell {i}: {cell.source[:60]!r}")
            names.update(_EXPLORER.findall(cell.source))
    return closing


def test_explorers_close_check_finds_a_closing_cell():
    cells = [nbformat.v4.new_code_cell("ex = figures.TimelineExplorer()\nex"), nbformat.v4.new_code_cell("ex.run()"),
             nbformat.v4.new_code_cell("zos.close()\nex.close()  # free the engine")]
    assert explorers_closed(cells) == ["cell 2: 'zos.close()\\nex.close()  # free the engine'"]


@pytest.mark.parametrize("rel", list(measure.COURSE))
def test_no_cell_closes_the_explorer(rel):
    """Notebook 05 keeps its capstone explorer after Run All."""
    cells = nbformat.read(REPO / f"{rel}.ipynb", as_version=4).cells
    assert not explorers_closed(cells), f"{rel}: {explorers_closed(cells)}"


def test_time_lines_and_tables_are_the_recorded_measurements():
    changed = measure.updated_files(json.loads(measure.TIMES.read_text()))
    assert not changed, (f"{[str(p.relative_to(REPO)) for p in changed]} differ from {measure.TIMES.name}: run "
                         f"`python scripts/measure_notebooks.py --update` (or --record to re-measure)")


def _track(guide: str, title: str) -> tuple[list[tuple[int, int, str]], str]:
    section = guide.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    rows = []
    for start_h, start_m, end_h, end_m, rest in re.findall(r"^\| (\d):(\d\d)–(\d):(\d\d) \|(.*)$", section, re.M):
        rows.append((int(start_h) * 60 + int(start_m), int(end_h) * 60 + int(end_m), rest))
    return rows, section


@pytest.mark.parametrize("title, minutes", [("The 2-hour track", 120), ("The 3-hour track", 180)])
def test_tracks_add_up(title, minutes):
    rows, section = _track((REPO / "docs" / "instructor_guide.md").read_text(), title)
    assert rows and rows[0][0] == 0 and rows[-1][1] == minutes, f"{title} runs {rows[0][0]}–{rows[-1][1]} min"
    for (_, end, _), (start, _, _) in zip(rows, rows[1:]):
        assert start == end, f"{title}: a row ends at {end} min and the next starts at {start}"
    durations = [end - start for start, end, _ in rows]
    sum_line = re.search(r"^([\d + ]+) = (\d+) minutes\.$", section, re.M)
    assert sum_line, f"{title}: no 'a + b + ... = N minutes.' line"
    assert [int(x) for x in sum_line.group(1).split("+")] == durations and int(sum_line.group(2)) == minutes


def test_three_hour_track_covers_every_notebook_and_exercise():
    rows, _ = _track((REPO / "docs" / "instructor_guide.md").read_text(), "The 3-hour track")
    text = " ".join(rest for *_, rest in rows)
    for rel in measure.COURSE:
        number = Path(rel).name.split("_")[0]
        kind = "exercise" if rel.startswith("exercises/") else ""
        assert re.search(rf"{kind}\s*{number}\b" if kind else rf"\b{number}\b", text, re.I), \
            f"the 3-hour track never schedules {rel}"


@pytest.mark.parametrize("title", ["The 2-hour track", "The 3-hour track"])
def test_each_slot_holds_what_it_plans(title):
    """The minutes planned inside a row (demonstration, checked cells, exercise) fill its slot."""
    rows, _ = _track((REPO / "docs" / "instructor_guide.md").read_text(), title)
    for start, end, rest in rows:
        planned = [int(m) for m in re.findall(r"\((\d+) min\)", rest)]
        if "break" not in rest.split("|")[0]:
            assert sum(planned) == end - start, f"{title}, slot {start}–{end} min plans {planned}: {rest[:80]}"

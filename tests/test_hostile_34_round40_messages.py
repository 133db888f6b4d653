"""Issue 34, round forty's messages: the note for files beside the notebook that were not copied
named neither limit (and nbgrader's own ``timestamp.txt`` counted toward the 100 files); a
submitted file named ``.overlap_course`` made a judge's passing verdict say "your progress is
not saved"; lab 2 said "with 1 tokens".  Each failed when written."""

from __future__ import annotations

from overlap_course.build import judge, judge_beside
from overlap_course.checks import endings
from overlap_course.checks.lab_runs import Ended

from judged import IMPORTS, RIGHT_LOOP, needs_the_engine


def _submit(tmp_path, files: dict[str, bytes]):
    submitted, graded = tmp_path / "submitted", tmp_path / "autograded"
    for folder in (submitted, graded):
        folder.mkdir(exist_ok=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
    return graded, submitted


def test_the_note_names_the_limit_and_nbgraders_timestamp_does_not_count(tmp_path):
    names = {f"data{i:03}.txt": b"1\n" for i in range(judge_beside.MAX_FILES)}
    graded, submitted = _submit(tmp_path, {**names, "timestamp.txt": b"2026-12-06\n"})
    assert judge_beside.read(graded, submitted) == (names, "")
    graded, submitted = _submit(tmp_path, {"one_more.txt": b"1\n"})
    files, why = judge_beside.read(graded, submitted)
    assert files == {} and f"more than {judge_beside.MAX_FILES} files" in why, why


def test_the_note_names_the_size(tmp_path):
    big = b"\0" * (judge_beside.MAX_BYTES + 1)
    files, why = judge_beside.read(*_submit(tmp_path, {"big.bin": big}))
    assert files == {} and f"MB or more, over {judge_beside.MAX_BYTES // 2**20} MB" in why, why


def test_a_file_named_like_the_progress_folder_leaves_a_pass_as_it_is():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, RIGHT_LOOP],
                                  files={".overlap_course": b"not a folder\n"})
    assert passed and "not saved" not in message, message


def test_one_token_is_one_token():
    assert str(Ended(endings.ABORT, 1)) == "by its abort, with 1 token"
    assert str(Ended(endings.EOS, 2)) == "on EOS after 2 tokens"

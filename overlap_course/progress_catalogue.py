"""Every check of the course, by notebook: what a learner's record and the room's service
accept, and the order the views show them in; and the instructor guide's table that explains
each mistake's category, which the service's guide page shows.

Standard library only (and ``safe_json.py``), like ``progress.py`` that imports it: the hub
runs copies of both beside the progress service (docs/jupyterhub.md).
"""

from __future__ import annotations

from pathlib import Path

try:
    from . import safe_json
except ImportError:  # a script beside copies of the files docs/jupyterhub.md names
    import safe_json  # type: ignore[no-redef]

# Every checked cell of the course, by notebook (the file's stem): what the service accepts.
# A check used by two notebooks belongs to the first that lists it unless the kernel's notebook
# (``$JPY_SESSION_NAME``, set by Jupyter Server) lists it too.  ``check:name`` is a check asked
# a second question in one notebook (``check_discarded(..., name="discarded_by_abort")``).
# tests/test_progress.py keeps this equal to the check calls in notebooks/ and source/.
CATALOGUE: dict[str, tuple[str, ...]] = {
    "00_start_here": ("check_done_after_wait", "check_race", "check_race_fixed"),
    "01_tiny_gpt": ("check_slot", "check_slot:second_slot", "check_decode_lengths"),
    "02_serial_engine": ("check_largest_host_stage", "check_round_gap", "check_overhead_gap"),
    "02_serial_loop": ("check_serial_loop", "check_idle_fraction"),
    "03a_zos_order": ("check_processed_under", "check_swapped_order", "check_tokens_lost"),
    "03b_zos_measured": ("check_future_inputs", "check_ideal_ratio"),
    "03_zos_loop": ("check_zos_loop", "check_three_rounds"),
    "04_stale_lengths": ("check_true_key_length", "check_true_key_length:second_seqlens_k", "check_corrected_slots",
                         "check_corrected_slots:second_slots"),
    "04_seqlen_correction": ("check_correction", "check_metadata_answer"),
    "05_ownership": ("check_uncommitted_rounds", "check_discarded", "check_race_report",
                     "check_discarded:discarded_by_abort"),
    "05_lifetime": ("check_process_outputs",),
    "06_real_traces": ("check_idle_share", "check_idle_sync", "check_idle_sync:culprit_mine"),  # optional chapter
    "07_bugs_that_shipped": ("check_wasted_round", "check_wants_more", "check_abort_in_flight", "check_abort",
                             "check_ring_race", "check_ring_slots", "check_overshoot", "check_commit"),  # optional
    "07b_bugs_of_2026": ("check_stale_mask", "check_before_sample", "check_token_leak",
                         "check_future_key"),  # optional
}
# The course's order (notebook, then its exercise), for the views.
ORDER = ("00_start_here", "01_tiny_gpt", "02_serial_engine", "02_serial_loop", "03a_zos_order",
         "03b_zos_measured", "03_zos_loop", "04_stale_lengths", "04_seqlen_correction", "05_ownership",
         "05_lifetime", "06_real_traces", "07_bugs_that_shipped", "07b_bugs_of_2026")
# Verdicts that mean "not answered yet": the stub still in place.  They are recorded, but a
# check with only these is "not reached", not "tried".
UNANSWERED = frozenset({"unanswered", "not_implemented"})


def home_notebook(check: str) -> str | None:
    for notebook in ORDER:
        if check in CATALOGUE[notebook]:
            return notebook
    return None


def known(notebook: str, check: str) -> bool:
    return check in CATALOGUE.get(notebook, ())


# What each field of an entry must be: a line of a learner's record, a row of the service's
# database (its validate() holds verdicts to the same).
FIELD_TYPES = {"notebook": str, "check": str, "passed": bool, "category": str,
               "time": (int, float)}


def well_formed(entry) -> bool:
    """A JSON object whose fields have the types ``progress.record`` writes (a ``time`` that is a
    number, not a bool): anything else would break the sorting and lookups of :func:`status`."""
    if not isinstance(entry, dict) or isinstance(entry.get("time"), bool):
        return False
    return all(isinstance(entry.get(field), kind) for field, kind in FIELD_TYPES.items())


def status(entries: list[dict]) -> dict[tuple[str, str], dict]:
    """(notebook, check) -> {"state": passed|tried|not reached, "category": last mistake,
    "tries": n} for every check of the course."""
    out = {(nb, check): {"state": "not reached", "category": None, "tries": 0}
           for nb in ORDER for check in CATALOGUE[nb]}
    for entry in sorted(entries, key=lambda e: e.get("time", 0)):
        cell = out.get((entry["notebook"], entry["check"]))
        if cell is None:
            continue
        if entry.get("passed"):
            cell["state"] = "passed"
        elif entry.get("category") not in UNANSWERED:
            cell["tries"] += 1
            cell["category"] = entry.get("category")
            if cell["state"] != "passed":
                cell["state"] = "tried"
    return out


# -- the instructor guide's table of mistakes: how to explain each category to a learner --

GUIDE_SECTION = "## Mistakes the checkers catch"
#: The most bytes of the instructor guide read (the shipped one has under 50 KB).
MAX_GUIDE_BYTES = 1 << 20


def read_guide(path: Path) -> str | None:
    """The instructor guide's text, None if there is no such file; a ``ValueError`` naming it
    if it is not a UTF-8 file of at most :data:`MAX_GUIDE_BYTES` (a FIFO: refused, not waited
    on; /dev/zero: not read; ``safe_json.read_text``)."""
    try:
        return safe_json.read_text(path, f"the instructor guide {safe_json.quoted(str(path), 200)}",
                                   MAX_GUIDE_BYTES)
    except FileNotFoundError:
        return None


def guide_mistakes(path: Path | None) -> list[dict]:
    """The instructor guide's table of mistakes: exercise, mistake, category, explanation;
    [] without a guide, a ``ValueError`` naming one that cannot be read (:func:`read_guide`)."""
    text = None if path is None else read_guide(path)
    if text is None:
        return []
    start = text.find(GUIDE_SECTION)
    rows = []
    for line in text[start:].splitlines()[1:] if start >= 0 else []:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[3].startswith("`"):
            rows.append({"exercise": cells[0], "mistake": cells[1], "wrote": cells[2],
                         "category": cells[3].strip("`"), "explain": cells[4]})
    return rows

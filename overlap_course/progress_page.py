"""The room's page, as HTML: the learners x checks table, the room's most common mistakes, and
the page that refreshes them.  Apart from the service (``progress_service.py``) so that each
file holds one thing; every name a learner or a check chose is escaped here."""

from __future__ import annotations

import html
import json
from urllib.parse import quote

REFRESH_MS = 2000

CSS = ("body{font-family:sans-serif;margin:1em}table{border-collapse:collapse}"
       "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}"
       ".passed{background:#c8e6c9}.tried{background:#ffe0b2}.not-reached{color:#999}"
       "th.check{writing-mode:vertical-rl;transform:rotate(180deg);max-height:14em}")


def _cell(check: str, state: dict) -> str:
    """One learner's state of one check: passed, tried (with the last mistake) or not reached."""
    text = {"passed": "passed", "tried": html.escape(f"tried: {state['category']}"),
            "not reached": "&middot;"}[state["state"]]
    return (f'<td class="{state["state"].replace(" ", "-")}" data-check="{html.escape(check)}" '
            f'data-state="{state["state"]}">{text}</td>')


def _mistakes(check: str, found: list, guide_url: str) -> str:
    """A check's five most common mistakes, each linked to the guide's row that explains it."""
    items = []
    for cat, learners, tries in found[:5]:
        link = html.escape(f"{guide_url}#category-{quote(cat)}")
        items.append(f'<li><a href="{link}" data-category="{html.escape(cat)}">{html.escape(cat)}'
                     f"</a> &mdash; {learners} learner(s), {tries} tries</li>")
    return (f'<li data-check="{html.escape(check)}"><b>{html.escape(check)}</b>'
            f'<ul>{"".join(items)}</ul></li>')


def render_table(data: dict, guide_url: str) -> str:
    """The learners x checks table and the mistakes list, as an HTML fragment."""
    checks = data["checks"]
    head = "".join(f'<th class="check" title="{html.escape(c)}">{html.escape(c)}</th>'
                   for c in checks)
    rows = [f'<tr data-learner="{html.escape(name)}"><th>{html.escape(name)}</th>'
            f'{"".join(_cell(c, cells[c]) for c in checks)}</tr>'
            for name, cells in data["learners"].items()]
    mistakes = "".join(_mistakes(c, data["mistakes"][c], guide_url)
                       for c in checks if c in data["mistakes"])
    skipped = data.get("unreadable", 0)
    skipped = (f" ({skipped} row(s) of the database could not be read and were skipped)"
               if skipped else "")
    return (f'<p id="summary">{len(data["learners"])} learner(s), {data["verdicts"]} verdict(s)'
            f'{skipped}</p>'
            f'<table id="room"><tr><th>learner</th>{head}</tr>{"".join(rows)}</table>'
            f'<h2>The room\'s most common mistakes</h2>'
            f'<ul id="mistakes">{mistakes or "<li>none yet</li>"}</ul>')


def page(prefix: str, table: str, xsrf: str = "") -> str:
    """The instructor's room page: the table, refreshed every REFRESH_MS from room.html."""
    fetch = (f"fetch({json.dumps(prefix + 'room.html')}, {{credentials: 'same-origin', "
             f"redirect: 'error', headers: {{'X-XSRFToken': {json.dumps(xsrf)}}}}})")
    return (f"<!doctype html><meta charset=utf-8><title>Course progress</title>"
            f"<style>{CSS}</style><h1>Course progress: the room</h1>"
            f"<p id=status>live: refreshed every {REFRESH_MS // 1000} s</p>"
            f"<div id=live>{table}</div>"
            f"<script>setInterval(async () => {{ const s = document.getElementById('status');"
            f" try {{ const r = await {fetch};"
            f" if (r.ok) {{ document.getElementById('live').innerHTML = await r.text();"
            f" s.textContent = 'live: updated ' + new Date().toLocaleTimeString(); }}"
            f" else s.textContent = 'not updated: ' + r.status + ' (log in again?)'; }}"
            f" catch (e) {{ s.textContent = 'not updated: ' + e; }} }}, {REFRESH_MS});</script>")

"""Issue 34, round thirteen (blind helper, low cases): a failing gap written as ``np.float16`` was
shown to three decimals, which printed a value that passes ("0.380" for 0.37988)."""

from __future__ import annotations

import re

import numpy as np

from overlap_course import checks
from toy_engine.timeline import Timeline, TimelineMeta


def _timeline():
    """Rounds 0-12 on the device lane, a gap of 0.3442 ms before round 10."""
    tl = Timeline(meta=TimelineMeta(mode="serial", device="cpu-process"))
    t = 10.0004 - 1.56 * 10 - 0.39 * 9
    for rnd in range(13):
        if rnd == 10:
            t = 10.3446
        for stage, dur in (("upload", 0.04), ("forward", 1.3), ("sample", 0.2)):
            tl.add_device_ns(stage, rnd, tl.origin_ns + round(t * 1e6),
                             tl.origin_ns + round((t + dur) * 1e6), cpu_ns=round(dur * 1e6))
            t += dur + 0.01
        t += 0.38
    return tl


def test_a_failing_float16_gap_is_never_shown_as_a_value_that_passes():
    tl, tried = _timeline(), 0
    for thousandths in range(300, 400):
        answer = np.float16(thousandths / 1000)
        verdict = checks.check_round_gap(answer, tl, round=10)
        if verdict.passed or not checks.check_round_gap(round(float(answer), 3), tl, 10).passed:
            continue  # only answers whose three decimals would pass
        tried += 1
        shown = re.match(r"(?:close: )?([0-9.]+) ms", verdict.message)
        assert shown, verdict.message
        assert not checks.check_round_gap(float(shown.group(1)), tl, round=10).passed, \
            verdict.message
    assert tried, "no float16 answer fails while its three decimals pass: the test tests nothing"

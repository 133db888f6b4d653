"""Issue 34, round thirteen (blind helper, low cases): a failing gap written as ``np.float16`` was
shown to three decimals, which printed a value that passes ("0.380" for 0.37988)."""

from __future__ import annotations

import re

import numpy as np

from overlap_course import checks
from test_hostile_34_round12_blind_b import _hover_timeline as _timeline  # 0.3442 ms gap


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

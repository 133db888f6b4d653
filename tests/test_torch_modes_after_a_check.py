"""A check cut short between a torch mode's push and its pop (a time-up, a Ctrl-C), or a
learner's code that enters a mode and never leaves it, leaves no torch function mode behind: on
an overloaded machine one such check left a test process's tensors on the meta device, and
hundreds of later tests in that process failed."""

from __future__ import annotations

import pytest
import torch

import mistakes
from overlap_course import checks
from overlap_course.checks import host_waits


def test_a_correction_that_enters_the_meta_device_and_never_leaves_leaves_no_mode():
    def correction(meta, accepted, block_size):
        torch.device("meta").__enter__()
        return mistakes.correction(meta, accepted, block_size)

    checks.check_correction(correction)
    assert torch.empty(1).device.type == "cpu"
    assert torch._C._len_torch_function_stack() == 0


def test_a_ctrl_c_as_the_meta_run_leaves_its_modes_leaves_no_mode(monkeypatch):
    def pressed_on_the_way_out(self, *exc):  # Ctrl-C before HostReads pops itself
        raise KeyboardInterrupt

    monkeypatch.setattr(host_waits.HostReads, "__exit__", pressed_on_the_way_out)
    with pytest.raises(KeyboardInterrupt):
        checks.check_correction(mistakes.correction)
    monkeypatch.undo()
    assert torch.empty(1).device.type == "cpu"
    assert torch._C._len_torch_function_stack() == 0
    assert checks.check_correction(mistakes.correction).passed  # and the next check runs

"""Round 27, command lines: options taken and ignored, a false "File exists", "at at line".

1. ``trace export OUT STORED --mode serial`` (also ``--prompts``, ``--max-new-tokens``,
   ``--host-overhead-ms``, ``--device``) converted the stored run as it was and exited 0
   without a word, its report saying ``"mode": "zos"``: those options are read only when
   recording, and argparse's defaults hid whether they were given.  Now refused, one line,
   exit 2, before anything is written (as round 25 refused ``measure_notebooks --update
   --json``); without STORED they still shape the recording, and their defaults stand.
2. ``grading course DEST`` with DEST a symbolic link to a folder that is not there (or
   ``DEST/sub`` under it) said "File exists: 'dl'", where ``handout --out dl`` and
   ``record_traces --out dl`` name the link and where it points: DEST is now checked by the
   same ``command_line.out_folder``.
3. ``safe_json.loads`` put " at line" after json's own message, so "Unterminated string
   starting at" read "starting at at line 1, column 17" (a trace's refusal, the progress
   service's 400).
"""

from __future__ import annotations

import json

import pytest

from overlap_course import progress_store, safe_json
from overlap_course.build import grading
from overlap_course.traces.kineto import cli as kineto_cli
from overlap_course.traces.recorded import load_trace

KINETO = "python -m overlap_course.traces.kineto: error: "


# -- case 1: recording options with a STORED run --

@pytest.mark.parametrize("extra, named", [
    (["--mode", "serial"], "--mode applies"),
    (["--prompts", "64"], "--prompts applies"),
    (["--max-new-tokens", "5"], "--max-new-tokens applies"),
    (["--host-overhead-ms", "2"], "--host-overhead-ms applies"),
    (["--device", "cpu"], "--device applies"),
    (["--mode", "both", "--prompts", "8"], "--mode, --prompts apply"),  # the defaults, given
])
def test_export_refuses_recording_options_with_a_stored_run(tmp_path, capsys, extra, named):
    """Before: exit 0, the stored ZOS run written and reported as "zos", the option unread."""
    status = kineto_cli.main(["export", str(tmp_path / "x.json"), "cpu_zos", *extra])
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"{KINETO}{named} to recording only: STORED 'cpu_zos' is a stored "
                          f"run, converted as it is; leave "), err
    assert err.endswith("out, or leave STORED out to record a run\n"), err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_export_converts_a_stored_run_given_no_recording_option(tmp_path, capsys):
    out = tmp_path / "x.json"
    assert kineto_cli.main(["export", str(out), "cpu_zos"]) == 0
    assert json.loads(capsys.readouterr().out)[str(out)]["mode"] == "zos" and out.is_file()


@pytest.mark.parametrize("extra, wanted", [
    ([], {"mode": "both", "prompts": 8, "max_new_tokens": 32, "host_overhead_ms": 0.0,
          "device": "auto"}),
    (["--mode", "zos", "--prompts", "3", "--host-overhead-ms", "2"],
     {"mode": "zos", "prompts": 3, "max_new_tokens": 32, "host_overhead_ms": 2.0,
      "device": "auto"}),
])
def test_export_records_with_the_options_given_and_the_defaults(tmp_path, capsys, monkeypatch,
                                                                 extra, wanted):
    """Without STORED the options shape the run, and one not given is its default."""
    seen = []

    def recorded(mode, args):
        seen.append((mode, {name: getattr(args, name) for name in wanted}))
        return load_trace(f"cpu_{mode}" if mode == "zos" else "cpu_serial_spec4")

    monkeypatch.setattr(kineto_cli, "_record", recorded)
    assert kineto_cli.main(["export", str(tmp_path / "x.json"), *extra]) == 0, \
        capsys.readouterr().err
    modes = ["serial", "zos"] if wanted["mode"] == "both" else [wanted["mode"]]
    assert seen == [(mode, wanted) for mode in modes]


# -- case 2: grading course DEST, a link to nowhere --

@pytest.mark.parametrize("dest, where", [
    ("dl", "DEST 'dl' is a symbolic link to"),
    ("dl/sub", "DEST 'dl/sub' goes through 'dl', a symbolic link to"),
])
def test_grading_course_names_a_dest_that_is_a_link_to_nowhere(tmp_path, monkeypatch, capsys,
                                                               dest, where):
    """Before: "grading course: error: File exists: 'dl'" (nothing exists there)."""
    (tmp_path / "dl").symlink_to(tmp_path / "not-made")
    monkeypatch.chdir(tmp_path)
    assert grading.main(["course", dest]) == 2
    err = capsys.readouterr().err
    assert err == (f"grading course: error: {where} {str(tmp_path / 'not-made')!r}, which is not "
                   f"there: make that folder, or name another DEST\n"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dl"]


def test_grading_course_lays_out_a_dest_that_is_a_link_to_a_folder(tmp_path, monkeypatch,
                                                                   capsys):
    (tmp_path / "made").mkdir()
    (tmp_path / "dl").symlink_to(tmp_path / "made")
    monkeypatch.chdir(tmp_path)
    assert grading.main(["course", "dl"]) == 0, capsys.readouterr().err
    assert (tmp_path / "made" / "nbgrader_config.py").is_file()


# -- case 3: json's message and where --

@pytest.mark.parametrize("text, said", [
    ('{"traceEvents": "never closed', "Unterminated string starting at line 1, column 17"),
    ('"a\x01b"', "Invalid control character at line 1, column 3"),
    ("", "Expecting value at line 1, column 1"),
    ("[1 2]", "Expecting ',' delimiter at line 1, column 4"),
    ('{"a" 1}', "Expecting ':' delimiter at line 1, column 6"),
    ("{a: 1}", "Expecting property name enclosed in double quotes at line 1, column 2"),
    ("1 2", "Extra data at line 1, column 3"),
    ('"\\q"', "Invalid \\escape at line 1, column 2"),
    ('"\\u12"', "Invalid \\uXXXX escape at line 1, column 3"),
])
def test_loads_says_where_json_went_wrong_once(text, said):
    with pytest.raises(safe_json.JSONRefused) as caught:
        safe_json.loads(text, "T")
    assert str(caught.value) == f"T is not valid JSON ({said})"


def test_a_trace_and_a_verdict_cut_short_say_starting_at_line(tmp_path, capsys):
    """Before: "Unterminated string starting at at line 1, column 17"."""
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": "never closed')
    assert kineto_cli.main(["summary", str(trace)]) == 2
    err = capsys.readouterr().err
    assert "(Unterminated string starting at line 1, column 17)" in err and "at at" not in err
    status, why, _ = progress_store.validate(b'{"notebook": "x', "alice")
    assert status == 400 and "at at" not in why, why
    assert "Unterminated string starting at line 1, column 14" in why, why

"""Issue 34, round seventeen, the command lines (fixer cli17a): cases 1-4.

1. ``scripts/record_traces.py`` made ``--out`` only after every run was recorded: a dangling
   symbolic link, ``/proc/1/x`` or a folder under a read-only one was refused after minutes of
   recording ("File exists" for a link to nowhere).  It is now made and locked first
   (``command_line.locked``, which names a folder it cannot make, as trace export did).
2. It took no output-folder lock: it wrote into a folder a trace export was writing, and an
   export was let into a folder it was recording for.
3. Two runs with one file name (``--host-overheads 1 1.0000001``, ``0 0``, ``--modes serial
   serial``) were both recorded, and one was dropped without a word.
4. A Ctrl-C during profile_cuda's ZOS run left the new serial trace beside the earlier run's
   ZOS trace and summary.  Its three files, record_traces' traces and trace export's pair are
   now written all or none by one piece of code (``safe_json.whole_set``).

Each test failed before the fix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from overlap_course.command_line import locked
from test_hostile_34_round16_cli import _as_a_user

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
RECORD = [sys.executable, str(ROOT / "scripts" / "record_traces.py")]
PROFILE = [sys.executable, str(ROOT / "scripts" / "profile_cuda.py")]
EXPORT = [sys.executable, "-m", "overlap_course.traces.kineto", "export"]
SMALL = ["--modes", "serial", "--host-overheads", "0", "--requests", "2", "--max-new-tokens", "4",
         "--repeats", "1", "--allow-busy"]


def _one_error_line(done: subprocess.CompletedProcess, prog: str, *words: str) -> None:
    lines = done.stderr.splitlines()
    assert (done.returncode, len(lines)) == (2, 1), done.stderr
    assert lines[0].startswith(f"{prog}: error: ") and "Traceback" not in done.stderr, lines
    assert all(word in lines[0] for word in words), lines[0]


# --- case 1: an --out that cannot be made, refused before any run ------------------------------

@pytest.mark.parametrize("out, words", [
    ("dl", ["--out 'dl'", "symbolic link to 'nowhere'", "not there"]),
    ("dl/deeper", ["goes through 'dl'", "symbolic link to 'nowhere'"]),
    ("/proc/1/x", ["cannot write '/proc/1/x'", "choose a path"]),
])
def test_record_traces_refuses_an_out_it_cannot_make_before_recording(tmp_path, out, words):
    """Before: the run was recorded and announced (tok/s), then "File exists: 'dl'", exit 2."""
    (tmp_path / "dl").symlink_to("nowhere")
    done = subprocess.run([*RECORD, *SMALL, "--out", out], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)
    _one_error_line(done, "record_traces", *words)
    assert done.stdout == ""  # nothing recorded
    assert [p.name for p in tmp_path.iterdir()] == ["dl"]


def test_record_traces_refuses_an_out_under_a_read_only_folder_before_recording(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        done = subprocess.run([*_as_a_user(), *RECORD, *SMALL, "--out", "ro/x"], cwd=tmp_path,
                              env=ENV, capture_output=True, text=True, timeout=300)
    finally:
        ro.chmod(0o755)
    _one_error_line(done, "record_traces", "cannot write 'ro/x'", "Permission denied")
    assert done.stdout == "" and list(ro.iterdir()) == []


# --- case 2: the output-folder lock ------------------------------------------------------------

def test_record_traces_refuses_a_folder_another_command_is_writing(tmp_path):
    """Before: cpu_serial.json written into the folder a trace export held, exit 0."""
    with locked(tmp_path / "traces", "held"):
        done = subprocess.run([*RECORD, *SMALL, "--out", "traces"], cwd=tmp_path, env=ENV,
                              capture_output=True, text=True, timeout=300)
    _one_error_line(done, "record_traces", "--out 'traces' is being written by another",
                    "nothing was written")
    assert done.stdout == "" and list((tmp_path / "traces").iterdir()) == []


def test_a_trace_export_is_refused_while_record_traces_records_into_the_folder(tmp_path):
    """Before: the export wrote x.json into the folder record_traces was recording for.  The
    recording is then interrupted: one line, 130, and it leaves nothing (the folder it made
    goes too)."""
    recorder = subprocess.Popen(
        [*RECORD, "--modes", "serial", "--host-overheads", "0", "500", "--requests", "2",
         "--max-new-tokens", "50", "--repeats", "1", "--allow-busy", "--out", "new/traces"],
        cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = recorder.stdout.readline()  # one run recorded, the next takes 50 s or more
        assert "tok/s" in first, (first, recorder.stderr.read() if recorder.poll() else "")
        done = subprocess.run([*EXPORT, "new/traces/x.json", "cpu_zos"], cwd=tmp_path, env=ENV,
                              capture_output=True, text=True, timeout=300)
        assert recorder.poll() is None, "record_traces ended before the export was refused"
        recorder.send_signal(signal.SIGINT)
        _, err = recorder.communicate(timeout=120)
    finally:
        if recorder.poll() is None:
            recorder.kill()
            recorder.communicate()
    _one_error_line(done, "python -m overlap_course.traces.kineto", "being written by another")
    assert (recorder.returncode, err.splitlines()) == (130, ["record_traces: interrupted"]), err
    assert list(tmp_path.iterdir()) == []


# --- case 3: two runs with one file name ---------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["--host-overheads", "1", "1.0000001"], ["--host-overheads 1.0 and 1.0000001", "one file",
                                              "_overhead1ms.json"]),
    (["--host-overheads", "0", "0"], ["--host-overheads names 0 twice"]),
    (["--host-overheads", "2", "0", "2.0"], ["--host-overheads names 2 twice"]),
    (["--modes", "serial", "serial"], ["--modes names serial twice", "at most once"]),
])
def test_record_traces_refuses_two_runs_with_one_file_name_before_recording(tmp_path, args,
                                                                            words):
    """Before: both runs recorded and announced, one file written, exit 0."""
    base = ["--requests", "2", "--max-new-tokens", "4", "--repeats", "1", "--allow-busy"]
    done = subprocess.run([*RECORD, *base, *args, "--out", "o"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)
    _one_error_line(done, "record_traces", *words)
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


# --- case 4: a set of files written all or none ----------------------------------------------------

def _state(folder: Path) -> dict:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir()}


def _serial_written(folder: Path, before: dict) -> bool:
    """A serial profile, new and not empty, is in ``folder`` (a file, not a folder being made)."""
    return any(p.is_file() and p.stat().st_size and "torch_profile_serial" in p.name
               and before.get(p.name) != (p.stat().st_mtime_ns, p.stat().st_size)
               for p in folder.iterdir())


def test_an_interrupted_profile_cuda_leaves_its_earlier_set_as_it_was(tmp_path):
    """Before: the new serial trace beside the earlier run's ZOS trace and summary.

    The earlier set only has to exist: one prompt, one token (3.8 s, not 23 s).  The run that is
    cut must still be recording after its serial trace is written: 16 prompts of 100 tokens
    leave it 3.3 s (64 prompts: 10.8 s) for a Ctrl-C sent within the 0.05 s poll."""
    cmd = [*PROFILE, "--device", "cpu", "--out", "pc", "--prompts", "16", "--max-new-tokens",
           "100"]
    subprocess.run([*cmd[:-4], "--prompts", "1", "--max-new-tokens", "1"], cwd=tmp_path, env=ENV,
                   capture_output=True, timeout=600, check=True)
    folder = tmp_path / "pc"
    before = _state(folder)
    assert sorted(before) == ["torch_profile_serial.json.gz", "torch_profile_summary.json",
                              "torch_profile_zos.json.gz"]
    run = subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:  # the serial profile written (in place, or beside it): ZOS is being recorded
        deadline = time.monotonic() + 300
        while run.poll() is None and time.monotonic() < deadline and not _serial_written(
                folder, before):
            time.sleep(0.05)
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 130 and err.splitlines()[-1:] == ["profile_cuda: interrupted"], err
    assert _state(folder) == before  # nothing replaced, no temporary file left


def test_a_whole_set_touches_no_target_when_its_block_fails(tmp_path):
    from overlap_course.safe_json import whole_set  # new in this round

    (tmp_path / "a.json").write_text("old a")
    with pytest.raises(KeyboardInterrupt):
        with whole_set() as files:
            Path(files.part(tmp_path / "a.json", ".json")).write_text("new a")
            Path(files.part(tmp_path / "b.json", ".json")).write_text("new b")
            raise KeyboardInterrupt
    assert [(p.name, p.read_text()) for p in tmp_path.iterdir()] == [("a.json", "old a")]
    with whole_set() as files:
        Path(files.part(tmp_path / "a.json", ".json")).write_text("new a")
        Path(files.part(tmp_path / "b.json", ".json")).write_text("new b")
    assert sorted((p.name, p.read_text()) for p in tmp_path.iterdir()) == [
        ("a.json", "new a"), ("b.json", "new b")]


def test_a_whole_set_names_the_target_when_writing_a_part_fails(tmp_path):
    from overlap_course.safe_json import whole_set  # new in this round

    with pytest.raises(OSError) as raised:
        with whole_set() as files:
            part = files.part(tmp_path / "a.json", ".json")
            raise OSError(28, "No space left on device", part)
    assert raised.value.filename == str(tmp_path / "a.json")
    assert list(tmp_path.iterdir()) == []

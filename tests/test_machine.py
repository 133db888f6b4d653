"""Usable CPUs (affinity, cgroup quota), the busy verdict, and the burner test (issue 12)."""

import os

import pytest

from overlap_course.measure import bench
from overlap_course.measure import machine
from overlap_course.measure.contention import BUSY_OTHERS_CPUS, BUSY_RUN_CPU_SHARE, PACED_LATE_SHARE
from toy_engine import device as engine_device
from toy_engine.process_device import ProcessDevice
from toy_engine.timeline import Timeline


def fake_tree(tmp_path, files: dict):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_cgroup_v2_quota_takes_the_tightest_ancestor(tmp_path):
    root = fake_tree(tmp_path, {"cpu.max": "max 100000\n", "hub/cpu.max": "150000 100000\n",
                                "hub/user7/cpu.max": "max 100000\n"})
    assert machine.cgroup_cpu_quota(root, "0::/hub/user7\n") == 1.5
    assert machine.cgroup_cpu_quota(root, "0::/\n") is None


def test_cgroup_v1_quota(tmp_path):
    root = fake_tree(tmp_path, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
                                "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
                                "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert machine.cgroup_cpu_quota(root, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n") == 0.5
    assert machine.cgroup_cpu_quota(root, "3:cpu,cpuacct:/\n") is None
    assert machine.cgroup_cpu_quota(tmp_path / "nothing", "3:cpu,cpuacct:/docker/abc\n") is None


def test_usable_cpus_is_the_smaller_of_mask_and_quota(monkeypatch):
    monkeypatch.setattr(machine, "_load_average", lambda: 1.0)  # this kernel only
    monkeypatch.setattr(engine_device, "affinity_cpus", lambda: 4)
    monkeypatch.setattr(engine_device, "cgroup_cpu_quota", lambda: 1.0)
    assert machine.usable_cpus() == 1.0
    report = machine.machine_report()
    assert report["affinity"] == 4 and report["cgroup_quota"] == 1.0 and report["usable"] == 1.0
    # one CPU: device="auto" paces the stand-in, which overlaps on one core
    assert report["allowed"] == 1.0 and report["stand_in"] == "paced" and report["needed"] == 1.0
    assert report["live_overlap"] is True and report["overlap_can_show"] is True and "PACED" in report["meaning"]
    monkeypatch.setattr(engine_device, "cgroup_cpu_quota", lambda: 0.5)  # half a CPU: not even paced
    report = machine.machine_report()
    assert report["overlap_can_show"] is False and "even the paced stand-in needs 1" in report["meaning"]
    monkeypatch.setattr(engine_device, "cgroup_cpu_quota", lambda: None)
    report = machine.machine_report()
    assert machine.usable_cpus() == 4.0 and report["overlap_can_show"] is True and report["stand_in"] == "cpu"
    monkeypatch.setattr(machine, "_load_average", lambda: 3.5)  # others keep 2.5 CPUs busy
    report = machine.machine_report()
    assert report["usable"] == 1.5 and not report["live_overlap"] and report["overlap_can_show"]
    assert "other programs keep about 2.5" in report["meaning"] and machine.usable_cpus() == 4.0
    monkeypatch.setattr(engine_device, "cgroup_cpu_quota", lambda: 8.0)
    assert machine.usable_cpus() == 4.0


def test_this_machine_report_is_consistent():
    report = machine.machine_report()
    assert 0 <= report["usable"] <= report["allowed"] <= report["affinity"] <= (os.cpu_count() or 1)
    assert report["stand_in"] == ("paced" if report["allowed"] < machine.MIN_CPUS_FOR_OVERLAP else "cpu")
    assert report["overlap_can_show"] == (report["allowed"] >= report["needed"])
    assert report["live_overlap"] == (report["usable"] >= report["needed"])
    assert machine.usable_cpus() == report["allowed"]


def test_busy_warning_from_stats_and_timelines(monkeypatch):
    monkeypatch.setattr(engine_device, "affinity_cpus", lambda: 2)
    monkeypatch.setattr(engine_device, "cgroup_cpu_quota", lambda: None)
    quiet = {"device_cpu_share": 0.97, "host_cpu_share": 0.95}
    busy = {"device_cpu_share": BUSY_RUN_CPU_SHARE - 0.2}
    assert machine.busy_warning({"serial": quiet, "zos": quiet}) is None
    assert machine.busy_warning({"serial": {}, "zos": {}}) is None  # nothing measured: no claim
    text = machine.busy_warning({"serial": quiet, "zos": busy})
    assert text.startswith(machine.BUSY_WARNING_PREFIX) and "65% (zos)" in text and "97%" not in text
    assert machine.busy_warning({"zos": busy}, cuda=True) is None
    host_starved = machine.busy_warning({"zos": {"device_cpu_share": 0.99, "host_cpu_share": 0.55}})
    assert "The host loop got only 55% (zos)" in host_starved and "device process" not in host_starved
    tl = Timeline(origin_ns=0)
    tl.add("device", "forward", 1, 0, 4, cpu_ms=1.0)
    assert "25% (run)" in machine.busy_warning({"run": tl})
    assert "25% (pair)" in machine.busy_warning({"pair": (tl, None)})
    # a bench's 4 modes x 3 repeats: a range and the worst run, not twelve entries
    many = {f"zos run {i}": {"device_cpu_share": 0.5 + 0.02 * i} for i in range(12)}
    summary = machine.busy_warning(many)
    assert "50%–72% in 12 runs (worst: 50% (zos run 0))" in summary and "zos run 5" not in summary
    monkeypatch.setattr(engine_device, "cgroup_cpu_quota", lambda: 1.0)
    assert "Only 1 usable CPU" in machine.busy_warning({"serial": quiet})


def test_busy_warning_judges_a_paced_run_by_its_late_kernels(monkeypatch):
    """On one CPU a paced run is not a warning by itself; its device kernels ending late are (their compute
    did not fit the time model); an unpaced run there still is."""
    monkeypatch.setattr(engine_device, "affinity_cpus", lambda: 1)
    monkeypatch.setattr(engine_device, "cgroup_cpu_quota", lambda: None)
    on_time = {"paced": True, "device_cpu_share": None, "host_cpu_share": 0.97, "device_late_fraction": 0.01}
    late = dict(on_time, device_late_fraction=PACED_LATE_SHARE + 0.1)
    assert machine.busy_warning({"serial": on_time, "zos": on_time}) is None
    assert machine.busy_warning({"zos": dict(on_time, others_cpus=3.0)}) is None  # a hub's other learners
    text = machine.busy_warning({"serial": on_time, "zos": late})
    assert "PACED device's kernels ended 20% (zos)" in text and "Only 1" not in text
    assert "Only 1 usable CPU" in machine.busy_warning({"serial": on_time, "zos": {"host_cpu_share": 0.97}})
    monkeypatch.setattr(engine_device, "cgroup_cpu_quota", lambda: 0.5)  # too little even paced
    assert "even the paced stand-in needs 1" in machine.busy_warning({"zos": on_time})


def test_pacing_text_names_the_model():
    text = machine.pacing_text(ProcessDevice.PACED_MS)
    forward, per_token = ProcessDevice.PACED_MS["forward"]
    assert text.startswith("PACED") and f"forward {forward:g} ms + {per_token:g} ms per packed token" in text


def test_recorded_comparison_is_labelled():
    text = bench.recorded_comparison_text(0.0)
    assert text.startswith("RECORDED on a quiet machine") and "commit" in text and "UTC" in text
    assert "serial" in text and "zos/serial x" in text


# ---------------------------------------------------------------------------- the burner test

@pytest.mark.alone  # its burners keep every core busy: nothing else would be measured fairly
@pytest.mark.timeout(300)
def test_under_a_cpu_burner_the_bench_and_the_figures_warn_and_show_the_recorded_run(cpu_burners, shipped):
    """On a machine whose cores are all busy, a live serial/ZOS comparison is not silently shown:
    the bench table and the comparison figure carry the busy warning and the recorded run."""
    result = bench.run_bench(modes=("serial", "zos"), repeats=1, num_requests=4, max_new_tokens=16,
                             host_overhead_ms=2.0)
    table = bench.format_table(result)
    shares = {m: {k: result["modes"][m].get(k) for k in ("device_cpu_share", "host_cpu_share", "others_cpus")}
              for m in ("serial", "zos")}
    print(table)
    assert result["busy_warning"], f"{cpu_burners} burners, device CPU shares {shares}: no warning"
    assert machine.BUSY_WARNING_PREFIX in table and "RECORDED on a quiet machine" in table
    assert result["recorded"] == bench.recorded_comparison_text(2.0, workload=result["workload"])
    assert "commit" in result["recorded"] and "different workload" in result["recorded"]  # 4 x 16 here
    # The warning rests on a measurement of this run: the OS decides whether the burners take
    # CPU from the device process, the host loop, or only shared caches (other programs' CPUs).
    assert any(m["device_cpu_share"] < BUSY_RUN_CPU_SHARE or m["host_cpu_share"] < BUSY_RUN_CPU_SHARE
               or (m["others_cpus"] or 0.0) > BUSY_OTHERS_CPUS for m in shares.values()), shares
    assert all(m["equal_to_serial"] for m in result["modes"].values())  # busy is slow, never wrong

    pytest.importorskip("plotly")
    from overlap_course import figures
    import toy_engine as te

    model, alphabet = shipped
    runs = {}
    for mode in ("serial", "zos"):
        with te.Engine(te.EngineConfig(mode=mode, host_overhead_ms=2.0), model=model,
                       tokenizer=te.CharTokenizer(alphabet)) as engine:
            engine.generate(bench.default_workload(4), max_new_tokens=16)
            runs[mode] = (engine.timeline, engine.stats)
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fig = figures.compare_figure(runs)
    assert out.getvalue().startswith(machine.BUSY_WARNING_PREFIX)
    recorded = [a.text for a in fig.layout.annotations if "RECORDED" in (a.text or "")]
    assert len(recorded) == 2 and all("commit" in t for t in recorded)
    assert "machine busy" in fig.layout.title.text

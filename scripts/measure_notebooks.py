"""Measure what the course costs a learner: run time and memory of each notebook.

    python scripts/measure_notebooks.py                      # all notebooks and exercises
    python scripts/measure_notebooks.py notebooks/02_serial_engine.ipynb --json out.json

Each notebook is copied to a temporary folder and executed the way the course does it,
``python -m toy_engine.course execute COPY`` (the repository is not touched).  Reported per
notebook: cells, markdown words and reading minutes at 200 words a minute; wall seconds
(kernel start included) and CPU seconds of the whole process tree; the load average when it
started (timings taken on a busy machine are upper bounds: say so); and, sampled every 0.1 s,
the peak memory of the learner's processes -- kernel, device processes (forked by
multiprocessing's forkserver) and multiprocessing helpers -- as USS (memory unique to them,
freed when they exit) and PSS (plus their share of pages shared with other processes).
The numbers in the notebook headers, the README and docs/instructor_guide.md come from it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import psutil

REPO = Path(__file__).resolve().parent.parent
WORDS_PER_MINUTE = 200


def _role(proc: psutil.Process) -> str | None:
    cmd = " ".join(proc.cmdline())
    if "ipykernel" in cmd:
        return "kernel"
    if "forkserver" in cmd and "forkserver" in " ".join(psutil.Process(proc.ppid()).cmdline()):
        return "device"
    if "multiprocessing" in cmd:
        return "helper"
    return None


def measure(path: Path, workdir: Path) -> dict:
    nb = nbformat.read(path, as_version=4)
    words = sum(len(c.source.split()) for c in nb.cells if c.cell_type == "markdown")
    copy = workdir / path.name
    nbformat.write(nb, copy)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "toy_engine.course", "execute", str(copy)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = {"uss_mb": 0.0, "pss_mb": 0.0, "kernel_uss_mb": 0.0, "device_processes": 0}
    done = threading.Event()

    def sample():
        root = psutil.Process(proc.pid)
        while not done.is_set():
            uss = pss = kernel = 0
            devices = 0
            try:
                children = root.children(recursive=True)
            except psutil.Error:
                return
            for child in children:
                try:
                    role, mem = _role(child), child.memory_full_info()
                except psutil.Error:
                    continue
                if role is None:
                    continue
                uss, pss = uss + mem.uss, pss + mem.pss
                kernel += mem.uss if role == "kernel" else 0
                devices += role == "device"
            for key, value in (("uss_mb", uss / 2**20), ("pss_mb", pss / 2**20), ("kernel_uss_mb", kernel / 2**20),
                               ("device_processes", devices)):
                peak[key] = max(peak[key], value)
            done.wait(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{path} failed to execute:\n{proc.stderr.read().decode()[-2000:]}")
    return {"notebook": str(path.relative_to(REPO)), "cells": len(nb.cells), "words": words,
            "reading_min": round(words / WORDS_PER_MINUTE, 1), "wall_s": round(wall, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1), "load_average": round(load, 1),
            **{k: round(v) for k, v in peak.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="*", type=Path,
                   help="default: notebooks/*.ipynb and exercises/*.ipynb")
    p.add_argument("--json", type=Path, help="also write the results here")
    a = p.parse_args(argv)
    paths = [n.resolve() for n in a.notebooks] or sorted((REPO / "notebooks").glob("*.ipynb")) + \
        sorted((REPO / "exercises").glob("*.ipynb"))
    results = []
    print("| notebook | cells | words | reading | run: CPU / wall (load) | peak memory: USS / PSS (device processes) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            r = measure(path, Path(tmp))
            results.append(r)
            print(f"| `{r['notebook']}` | {r['cells']} | {r['words']:,} | {r['reading_min']:.0f} min | "
                  f"{r['cpu_s']:.0f} s / {r['wall_s']:.0f} s ({r['load_average']:.0f}) | "
                  f"{r['uss_mb']} / {r['pss_mb']} MB ({r['device_processes']}) |", flush=True)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

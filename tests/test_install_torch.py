"""scripts/install_torch.sh: a supported torch already there is kept; otherwise the order.

Run with a stand-in interpreter: the real one, with a fake ``torch`` of a chosen version on its
path, whose ``-m`` (every pip call) fails at once -- so nothing is installed anywhere and the
script's choices and messages are seen on their own.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(tmp_path: Path, torch_version: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"__version__ = {torch_version!r}\n")
    stub = tmp_path / "python"
    stub.write_text(f'#!/bin/sh\ncase "$1" in -m) exit 3 ;; esac\nexec {sys.executable} "$@"\n')
    stub.chmod(0o755)
    # No nvidia-smi on PATH: the order's GPU step is not taken.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("mktemp", "rm"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    env = {"PYTHONPATH": str(tmp_path / "site"), "PATH": str(bin_dir)}
    return subprocess.run([shutil.which("bash"), str(ROOT / "scripts" / "install_torch.sh"),
                           str(stub)], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("version", ["2.13.0+cpu", "2.9.0+cu126", "2.3.0"])
def test_a_supported_torch_is_kept(tmp_path, version):
    proc = _run(tmp_path, version)
    assert proc.returncode == 0, proc.stderr
    assert f"keeping the torch {version} already installed" in proc.stdout, proc.stdout


def test_an_old_torch_is_replaced_and_the_cuda_build_announced_first(tmp_path):
    """torch 2.1: replaced.  No CPU wheel on disk, no GPU, no CPU index (the stand-in's pip
    fails): the script says what the default build costs before it tries to install it."""
    proc = _run(tmp_path, "2.1.0")
    assert proc.returncode == 3, f"exit {proc.returncode}: {proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.splitlines()
    assert "torch 2.1.0 is installed, outside what the course needs" in lines[0], lines
    assert "no CPU build of torch 2.13.0 can be had" in lines[1] and "about 5 GB" in lines[1], lines

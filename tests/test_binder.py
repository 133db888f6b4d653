"""Binder (repo2docker): a launch opens notebook 00, and Voilà renders with the course template.

repo2docker runs the repository's ``start`` script with the server's command as arguments
(``exec "$@"`` on its last line).  Here a real Jupyter server is started through ``start``
on a loopback port: its root must redirect to ``/lab/tree/notebooks/00_start_here.ipynb``.
Voilà's server extension (``voila/render/...`` on Binder) must find, through the same
environment, the ``course`` template of ``apps/voila/templates`` -- Voilà's lab template
without the CDN font links -- and no other.  ``postBuild`` installs the package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
START = ROOT / "start"
NOTEBOOK_00 = "/lab/tree/notebooks/00_start_here.ipynb"


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env.update(JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTER_DATA_DIR=str(tmp_path / "data"), PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    return env


def test_start_script_hands_over_to_the_server_command():
    assert START.is_file() and os.access(START, os.X_OK), "no executable `start` for repo2docker"
    lines = [line.strip() for line in START.read_text().splitlines() if line.strip()]
    assert lines[-1] == 'exec "$@"', "repo2docker's start script must end with exec \"$@\""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


@pytest.mark.timeout(180)
def test_binder_server_opens_notebook_00(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "browser"))
    from browser_support import descendants, free_port, stop_server

    port, token = free_port(), "binder-test"
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", str(START), sys.executable, "-m", "jupyter_server", "--no-browser",
                                 f"--port={port}", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
                                 f"--ServerApp.root_dir={ROOT}", *(["--allow-root"] if os.getuid() == 0 else [])],
                                cwd=ROOT, env=_env(tmp_path), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        deadline, location = time.monotonic() + 120, None
        while location is None:
            assert proc.poll() is None, f"the server exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            try:
                opener.open(f"http://127.0.0.1:{port}/?token={token}", timeout=5)
                pytest.fail("the server's root answered without a redirect")
            except urllib.error.HTTPError as err:
                assert err.code in (301, 302, 303, 307), f"root answered {err.code}"
                location = err.headers["Location"]
            except (urllib.error.URLError, OSError):
                assert time.monotonic() < deadline, f"no server in 120 s:\n{log.read_text()[-3000:]}"
                time.sleep(0.5)
    finally:
        stop_server(proc, descendants(proc.pid))
    assert location.split("?")[0].endswith(NOTEBOOK_00), f"a Binder launch opens {location}, not {NOTEBOOK_00}"


def test_binder_voila_uses_the_course_template(tmp_path):
    probe = ("import json; from voila.server_extension import load_config_file; "
             "from voila.paths import collect_template_paths; c = load_config_file(); "
             "t = c.VoilaConfiguration.template if c is not None and 'template' in c.VoilaConfiguration else None; "
             "print(json.dumps([t, collect_template_paths(['voila', 'nbconvert'], t or 'lab')]))")
    proc = subprocess.run(["bash", str(START), sys.executable, "-c", probe], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    template, paths = json.loads(proc.stdout.strip().splitlines()[-1])
    assert template == "course", f"Voilà's server extension (Binder) uses the {template!r} template, not 'course'"
    course = ROOT / "apps" / "voila" / "templates" / "course"
    assert Path(paths[0]).resolve() == course.resolve(), f"the course template is not found first: {paths[:3]}"
    assert "fontawesome-free" in (course / "index.html.j2").read_text(), "the course template no longer drops the CDN links"

import os
import subprocess
import sys
import time

import pytest
from hypothesis import settings

import toy_engine as te

# CI (CI=true) draws the same examples every run: a red CI must come from a change, never from
# a new random draw; run the tests without CI set to let hypothesis search further.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _collector_left_unfrozen():
    """The judge's look freezes the garbage collector's objects (``gc.freeze``) until its watch
    ends: a test that leaves them frozen hides every object of this worker from the next test's
    look, which then calls a library's weakref older than the look new (stop 55's CI: a sqlalchemy
    callback named in round 27's test, after round 15's watch was never ended).  Such a test fails
    here, and the objects are unfrozen for the tests after it."""
    import gc

    frozen_before = gc.get_freeze_count()
    yield
    if gc.get_freeze_count() and not frozen_before:
        gc.unfreeze()
        pytest.fail("this test left the garbage collector's objects frozen (gc.freeze): end the "
                    "judge's watch it made (`watch.weakrefs_end()`) in a `finally`", pytrace=False)


@pytest.fixture(scope="session")
def shipped():
    """The shipped model and its alphabet, loaded once."""
    return te.load_model()


@pytest.fixture
def make_engine(shipped):
    """Engines on the shipped model, closed (device process stopped) after the test."""
    engines = []

    def make(**config):
        model, alphabet = shipped
        engine = te.Engine(te.EngineConfig(**config), model=model, tokenizer=te.CharTokenizer(alphabet))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


@pytest.fixture(scope="module")
def engine_pool(shipped):
    """Engines shared by a module's tests, one per configuration (device start-up is not free)."""
    model, alphabet = shipped
    pool = {}

    def get(**config):
        key = tuple(sorted(config.items()))
        if key not in pool:
            pool[key] = te.Engine(te.EngineConfig(**config), model=model, tokenizer=te.CharTokenizer(alphabet))
        return pool[key]

    yield get
    for engine in pool.values():
        engine.close()


@pytest.fixture
def cpu_burners():
    """One spinning process per usable core: the whole machine is busy while the test runs."""
    n = max(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2)
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    time.sleep(0.3)  # let them get going
    try:
        yield n
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=10)


@pytest.fixture(scope="session")
def built_handout(tmp_path_factory):
    """The "three rounds" handout built once per session: (HTML path, PDF path).

    Building needs Chromium (kaleido draws the figures, Chromium prints the PDF): without
    it the tests skip, unless REQUIRE_BROWSER_TEST=1 (CI) makes that a failure.
    """
    from overlap_course.build import handout

    if not os.access("/usr/bin/chromium", os.X_OK) and not os.environ.get("BROWSER_PATH"):
        reason = "no Chromium to draw and print the handout"
        if os.environ.get("REQUIRE_BROWSER_TEST", "") == "1":
            pytest.fail(f"{reason} (REQUIRE_BROWSER_TEST=1; run `bash scripts/install_browser.sh`)", pytrace=False)
        pytest.skip(f"{reason}; run `bash scripts/install_browser.sh`")
    return tuple(handout.build(tmp_path_factory.mktemp("handout")))


@pytest.fixture(scope="module")
def small_serial_engine():
    """A serial engine after a small run (a notebook's ``engine``), for a file's checks."""
    engine = te.Engine(te.EngineConfig(mode="serial", max_batch_size=4))
    engine.generate(["Once upon a time", "The bird said"], max_new_tokens=8)
    yield engine
    engine.close()


"""overlap_course: the course built on ``toy_engine`` -- checks, figures, measurement, building.

The engine never imports this package.  Where things live:

* ``checks``   -- every ``check_...`` a notebook or exercise calls, and the verdicts they return;
* ``figures``  -- the timelines (to scale, in issue order), the explorer widget;
* ``measure``  -- the bench, the machine report and the contention meter;
* ``traces``   -- recorded quiet-machine runs, real PyTorch-profiler traces (Kineto) in and out;
* ``build``    -- exercises from ``source/``, notebook execution, slides, handout, nbgrader;
* ``progress`` -- each learner's verdicts on disk, and the hub service that collects them;
* ``explorer_app`` -- the kernels of the explorer app (``./run.sh explorer``).

Importing this package imports nothing else (the hub's progress service runs without torch);
``overlap_course.measure`` installs the contention meter's watch on engine runs, and
``checks`` and ``figures`` import it.  Run as ``python -m overlap_course.X``, it first hands
Ctrl-C to ``ctrl_c`` (standard library only), before X's parent packages import anything.
"""

import sys

if sys.argv[:1] == ["-m"]:  # Python's value while it locates X, before it imports X's parents
    import _signal  # loaded at Python's start: no import before SIGINT is held

    _held = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT}) if hasattr(
        _signal, "pthread_sigmask") else None  # POSIX: a Ctrl-C waits for ctrl_c's handler
    try:
        from overlap_course.ctrl_c import from_the_start

        from_the_start()
    finally:
        if _held is not None:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, _held)  # a held Ctrl-C lands now

#!/usr/bin/env bash
# One entry point for the two quickstart commands:
#   ./run.sh lab    set up .venv (first time) and open the course in JupyterLab
#   ./run.sh test   set up .venv (first time) and run the whole test suite
#   ./run.sh setup  only set up .venv (again only when pyproject.toml, environment.yml, the torch
#                   installer or Python changed; --force: regardless)
#   ./run.sh site      build the course website from the stored notebooks -> build/site/html
#   ./run.sh explorer  serve the timeline explorer as an app (Voila, no code) on port 8866
#   ./run.sh slides    build offline reveal.js slides of the notebooks into build/slides/ (needs npm)
#   ./run.sh handout   build the one-page "three rounds" handout -> build/handout/three_rounds.{html,pdf}
#   ./run.sh trace summary FILE      device idle of a PyTorch-profiler (Kineto) trace, as JSON
#   ./run.sh trace export OUT.json   record serial and ZOS runs (or convert a stored one) as Kineto JSON
# Extra arguments go to jupyter lab / pytest / voila / the slides builder.  A path given to site,
# slides, handout or trace is read from (or written to) the folder run.sh was called from, as
# any command's; lab, test and explorer run in the repository, and default outputs land there.
set -euo pipefail
# A stdout or stderr closed by the caller (>&-, 2>&-) is /dev/null, as for the course's Python
# commands: else the first echo failed and ended the script with exit 1, whatever it meant to say.
# Closed: copying it fails (3>&1; bash skips 1>&1).  Bash may have opened this script, to read
# it, on the free descriptor (read-only: -ef tells).
if ! { true 3>&1; } 2>/dev/null || [ /dev/fd/1 -ef "$0" ]; then exec >/dev/null; fi
if ! true 3>&2 || [ /dev/fd/2 -ef "$0" ]; then exec 2>/dev/null; fi
# Ctrl-C before a command's Python takes over (from there the command says it): one line, 130.
trap 'echo "run.sh: interrupted" >&2; exit 130' INT
CALLER=$PWD
# The caller's folder held open: one removed under their terminal can still be entered (Linux).
{ exec 9<.; } 2>/dev/null || true
# Called through a symbolic link to it (~/bin/run.sh -> clone/run.sh), the repository is where
# the link leads, not the link's folder (readlink without -f: macOS's has none before 12.3).
# cd -P: $PWD is the physical folder, so the stamp's folder is the same whichever symbolic link
# to the clone ran it (else the same clone set itself up again).
SELF=$0
while [ -L "$SELF" ]; do
    TARGET=$(readlink "$SELF")
    case $TARGET in /*) SELF=$TARGET ;; *) SELF=$(dirname "$SELF")/$TARGET ;; esac
done
cd -P "$(dirname "$SELF")"
REPO=$PWD
PY=${PYTHON:-python3}
VENV=.venv
# What defines the environment: when none of it changed since the last setup, commands start at
# once and need no package index (a room with bad Wi-Fi).  Bump SETUP_VERSION when setup()'s
# own steps change.  `./run.sh setup --force` sets up again regardless.
SETUP_VERSION=6
SETUP_INPUTS=(pyproject.toml environment.yml scripts/install_torch.sh)
STAMP=$VENV/.run-sh-setup
LOCK=.run-sh.lock  # setup's lock (lock below); .gitignore names it

stamp() {
    echo "setup $SETUP_VERSION"
    # Ctrl-C ignored by this Python (else a KeyboardInterrupt traceback): the trap above says it.
    echo "python $(trap '' INT; "$VENV/bin/python" -c 'import platform, sys; print(sys.version.split()[0], platform.machine())')"
    echo "folder $PWD"  # the editable install points here (physical: cd -P above)
    local f
    for f in "${SETUP_INPUTS[@]}"; do echo "$f $(cksum < "$f" | cut -d' ' -f1,2)"; done
}

# What PY's -V says, for a message: its version only when it answers as a Python does (/bin/echo
# answers "-V", /bin/true nothing); "(not found)" when it does not run (bash's own "line N: ...:
# not found" thrown away: it would split the sentence).
py_version() {
    local said rc=0
    said=$("$PY" -V 2>&1 </dev/null) 2>/dev/null || rc=$?
    if [ "$rc" = 126 ] || [ "$rc" = 127 ]; then
        echo "(not found)"
    elif [[ "$said" =~ ^Python\ [0-9]+\.[0-9]+[^[:space:]]*$ ]]; then
        echo "$said"
    else
        echo "(not a Python: its -V names no Python version)"
    fi
}

# Takes the setup lock; $1: -n to fail at once when it is held.  Status 0: taken; 1: held by
# another ./run.sh; else this filesystem cannot lock (go on without it).  flock(2) on LOCK, open
# for writing on descriptor 8: a file only run.sh makes or locks.  The course's commands lock
# their output's folder (overlap_course/out_folders.py), never a file: a trace export into the
# clone's root held the clone's folder, which run.sh locked before, and every ./run.sh said
# another one was setting up and waited for the recording.  Written to, a file takes NFS's lock
# (it refuses one through a read-only descriptor), a pull that replaces run.sh does not replace
# it (a lock on run.sh's inode was lost then), a folder that cannot be listed (-wx) still lets
# it be made, and the kernel lets go when this shell ends, however it ends (no stale lock).
# flock(1) is util-linux (Linux, WSL); where there is none (macOS), Python takes it.
lock() {
    if command -v flock > /dev/null; then
        flock ${1:-} 8 2> /dev/null  # its warning: ENOLCK and the like are told once, by setup
    else
        local py=$PY  # the set-up one when there is one: PYTHON may name none
        if [ -x "$VENV/bin/python" ]; then py=$VENV/bin/python; fi
        "$py" -c 'import fcntl, sys
try:
    fcntl.flock(8, fcntl.LOCK_EX | (fcntl.LOCK_NB if sys.argv[1:] == ["-n"] else 0))
except BlockingIOError:
    sys.exit(1)
except OSError:  # ENOLCK, ENOTSUP: not "held" (a wait for no one)
    sys.exit(3)' ${1:-} 2> /dev/null
    fi
}

# Setup one at a time: two commands started together while it is due (./run.sh lab and
# ./run.sh test on first use, or after a pull) ran two pips into one .venv at once.  The second
# waits, then finds it done.  Without a lock to take (no flock, PYTHON not a Python, a filesystem
# that cannot lock, a LOCK it may not write), on as before: set_up says so if it installs
# (UNLOCKED: "opened" when LOCK could not be opened, which is no fault of the filesystem).
setup() {
    local rc=0
    only_a_file "$LOCK" "setup's lock" "$1"
    if ! { exec 8>> "$LOCK"; } 2> /dev/null; then
        rc=opened  # a read-only clone (which setup refuses), or a LOCK that is not this user's
    else
        lock -n || rc=$?
        if [ "$rc" = 1 ]; then
            echo "run.sh: another ./run.sh is setting up $VENV; waiting for it to finish" >&2
            rc=0
            lock || rc=$?
        fi
    fi
    UNLOCKED=$rc
    set_up "$@"
    exec 8<&-  # not held by lab, test or the others, which setup does not need
}

# LOCK and STAMP are files only run.sh makes: anything else there is refused in one line (a FIFO
# at LOCK made its open wait for a reader forever, a symbolic link made it a file outside the
# clone, a folder at STAMP ended setup with rm's message).  $2: what the file is; $3: the command.
only_a_file() {
    local kind=
    if [ -L "$1" ]; then
        kind="a symbolic link"
    elif [ -d "$1" ]; then
        kind="a folder"
    elif [ -p "$1" ]; then
        kind="a named pipe (FIFO)"
    elif [ -e "$1" ] && [ ! -f "$1" ]; then
        kind="a device or socket"
    fi
    if [ -n "$kind" ]; then
        echo "run.sh: $REPO/$1 is $kind, not the file run.sh keeps there ($2): remove it" \
             "(run.sh makes it again), then run ./run.sh $3 again" >&2
        exit 2
    fi
}

# The stamp as this run.sh writes it: its folder line, when it names this folder by another
# path (a symbolic link to it, as run.sh before cd -P recorded it), is this folder's.
recorded() {
    local line
    while IFS= read -r line || [ -n "$line" ]; do
        if [[ $line == "folder "* ]] && [ "${line#folder }" -ef . ]; then line="folder $PWD"; fi
        echo "$line"
    done < "$STAMP"
}

# Setting up writes .venv and the clone (pip's editable install): a read-only one (a mount, a
# shared copy) is told so in one line, not by rm's or venv's own message after a promise.
writable() {
    if [ ! -w . ] || { [ -e "$VENV" ] && [ ! -w "$VENV" ]; }; then
        echo "run.sh: $1, but $REPO cannot be written here (a read-only mount, or not yours):" \
             "ask whoever set it up to run ./run.sh setup, or clone the course into your folder" >&2
        exit 2
    fi
}

set_up() {
    only_a_file "$STAMP" "the record of its last setup" "$1"
    if [ ! -x "$VENV/bin/python" ]; then
        # pyproject.toml's requires-python (>=3.11); tests/test_packaging.py keeps the two equal.
        # Its answer, not its exit status: /bin/true and /bin/echo exit 0 too.
        if [ "$("$PY" -c 'import sys; print(sys.version_info[:2] < (3, 11))' 2>/dev/null)" \
                != False ]; then
            echo "run.sh: $PY is $(py_version); the course needs Python" \
                 "3.11 or newer (3.11 to 3.14). Pick one with PYTHON, e.g. PYTHON=python3.13 ./run.sh $1" >&2
            exit 2
        fi
        writable "$VENV is not set up"
        echo "run.sh: setting up $VENV with $(command -v "$PY") ($("$PY" -V 2>&1))" >&2
        "$PY" -m venv "$VENV"
    elif [ -n "${PYTHON:-}" ] && [ "$("$PY" -V 2>&1)" != "$("$VENV/bin/python" -V 2>&1)" ]; then
        echo "run.sh: $VENV already holds $("$VENV/bin/python" -V 2>&1), not PYTHON=$PYTHON's" \
             "$(py_version);" \
             "using $VENV (rm -rf $VENV to switch)" >&2
    fi
    local want
    want=$(stamp)
    local was=
    if [ -f "$STAMP" ]; then was=$(recorded); fi
    if [ "${2:-}" != --force ] && [ -f "$STAMP" ] && [ "$was" = "$want" ]; then
        if [ "$1" = setup ]; then
            echo "run.sh: $VENV is set up and its inputs are unchanged (${SETUP_INPUTS[*]}, Python);" \
                 "nothing to install (./run.sh setup --force installs again)"
        fi
        return 0
    fi
    local why="$VENV is not fully set up"  # no stamp: a setup that did not finish
    if [ "${2:-}" = --force ]; then
        why="--force asks to set it up again"
    elif [ -f "$STAMP" ]; then
        why=$(diff <(echo "$was") <(echo "$want") | sed -n 's/^> \([^ ]*\).*/\1/p' || true)
        why="changed since $VENV was set up: $(echo $why)"  # unquoted: one line, one space
    fi
    writable "$why"
    if [ -f "$STAMP" ] && [ "${2:-}" != --force ]; then
        echo "run.sh: $why - setting up again" >&2
    fi
    if [ "$UNLOCKED" = opened ]; then
        echo "run.sh: $REPO/$LOCK cannot be opened for writing (not yours, or not a file), so" \
             "nothing stops a second ./run.sh from setting up at once: start none until this one" \
             "ends, then remove $LOCK (run.sh makes it again)" >&2
    elif [ "$UNLOCKED" != 0 ]; then
        echo "run.sh: $REPO cannot be locked here (its filesystem does not lock), so nothing" \
             "stops a second ./run.sh from setting up at once: start none until this one ends" >&2
    fi
    rm -f "$STAMP"
    bash scripts/install_torch.sh "$VENV/bin/python"
    # environment.yml's exact pins as constraints: setup installs the versions it names (tests check).
    local pins
    pins=$(mktemp)
    sed -n 's/^[[:space:]]*-[[:space:]]*\([A-Za-z0-9_.-]*==[^[:space:]]*\)[[:space:]]*$/\1/p' environment.yml > "$pins"
    "$VENV/bin/pip" install -q -e ".[course,dev]" -c "$pins"
    rm -f "$pins"
    # nbgrader (dev extra: CI grades the exercises with it) would add its instructor menus to the
    # learner's JupyterLab; graders use its command line, which needs neither extension.
    local ext
    for ext in formgrader validate_assignment assignment_list course_list; do
        "$VENV/bin/jupyter" server extension disable --sys-prefix "nbgrader.server_extensions.$ext" > /dev/null 2>&1
    done
    # Its lab extensions go too, with the classic-notebook one it pulls in (notebook 7): Voila (the
    # explorer app) loads every installed lab extension, and that one fails there with a
    # module-federation error in the console (tests/browser/test_voila.py).
    rm -rf "$VENV/share/jupyter/labextensions/@jupyter/nbgrader" "$VENV/share/jupyter/labextensions/@jupyter-notebook"
    echo "$want" > "$STAMP"
}

# The repository's Python, run from the caller's folder (a relative FILE or --out is theirs).
from_caller() {
    cd "$CALLER" 2>/dev/null || cd -P /proc/self/fd/9 2>/dev/null || {
        echo "run.sh: the folder you ran it from ($CALLER) is gone: cd to one that exists" >&2
        exit 2
    }
    exec 9<&-
    exec "$REPO/$VENV/bin/python" -P "$@"  # -P: a module in their folder shadows none of ours
}

case "${1:-}" in site | slides | handout | trace) ;; *) exec 9<&- ;; esac  # theirs: from_caller
case "${1:-}" in
    setup)
        # Anything but --force refused: a typo of it (--forse, -f) ran as a plain setup, exit 0.
        if [ $# -gt 2 ] || { [ $# = 2 ] && [ "$2" != --force ]; }; then
            echo "run.sh: setup takes only --force, not '${*:2}' (see the top of run.sh)" >&2
            exit 2
        fi
        setup "$1" "${2:-}"
        ;;
    lab)
        setup "$1"
        extra=()
        if [ "$(id -u)" = 0 ]; then extra+=(--allow-root); fi  # e.g. inside a container
        exec "$VENV/bin/jupyter" lab --ServerApp.root_dir="$PWD" \
            --LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb "${extra[@]}" "${@:2}"
        ;;
    test)
        setup "$1"
        exec "$VENV/bin/python" scripts/run_tests.py "${@:2}"
        ;;
    # -- the course outside a kernel: website, explorer app, slides --
    site)
        setup "$1"
        from_caller "$REPO/site/build.py" "${@:2}"
        ;;
    explorer)
        setup "$1"
        # The `course` template (apps/voila/templates) is Voila's lab template without CDN links; it
        # ends a page's kernel when the page goes.  Culling is the backstop: a kernel whose page
        # vanished without a word (a crashed browser) ends after 10 idle minutes.  One kernel waits
        # with the app already run (a preheated pool): a page draws its first figure in ~4 s
        # instead of ~13 s (docs/measurements/explorer_app.md); overlap_course.explorer_app keeps
        # culling off a kernel a page has just taken.
        JUPYTER_PATH="$PWD/apps${JUPYTER_PATH:+:$JUPYTER_PATH}" exec "$VENV/bin/voila" apps/explorer.ipynb \
            --template=course --no-browser --MappingKernelManager.cull_idle_timeout=600 \
            --MappingKernelManager.cull_interval=60 --preheat_kernel=True --pool_size=1 \
            --VoilaConfiguration.multi_kernel_manager_class=overlap_course.explorer_app.ExplorerKernelManager "${@:2}"
        ;;
    slides)
        setup "$1"
        from_caller -m overlap_course.build.slides "${@:2}"
        ;;
    handout)
        setup "$1"
        from_caller -m overlap_course.build.handout "${@:2}"
        ;;
    trace)
        setup "$1"
        from_caller -m overlap_course.traces.kineto "${@:2}"
        ;;
    *)
        echo "usage: ./run.sh lab | ./run.sh test | ./run.sh setup | ./run.sh site | ./run.sh explorer | ./run.sh slides | ./run.sh handout | ./run.sh trace summary FILE | ./run.sh trace export OUT.json" >&2
        exit 2
        ;;
esac

#!/usr/bin/env bash
# One entry point for the two quickstart commands:
#   ./run.sh lab    set up .venv (first time) and open the course in JupyterLab
#   ./run.sh test   set up .venv (first time) and run the whole test suite
#   ./run.sh setup  only set up .venv
#   ./run.sh site      build the course website from the stored notebooks -> build/site/html
#   ./run.sh explorer  serve the timeline explorer as an app (Voila, no code) on port 8866
#   ./run.sh slides    build offline reveal.js slides of the notebooks into build/slides/ (needs npm)
#   ./run.sh handout   build the one-page "three rounds" handout -> build/handout/three_rounds.{html,pdf}
#   ./run.sh trace summary FILE      device idle of a PyTorch-profiler (Kineto) trace, as JSON
#   ./run.sh trace export OUT.json   record serial and ZOS runs (or convert a stored one) as Kineto JSON
# Extra arguments go to jupyter lab / pytest / voila / the slides builder.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=.venv

setup() {
    if [ ! -x "$VENV/bin/python" ]; then
        if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            echo "run.sh: $PY is $("$PY" -V 2>/dev/null || echo "not found"); the course needs Python 3.11" \
                 "(the version it is tested on). Install it, then e.g. PYTHON=python3.11 ./run.sh $*" >&2
            exit 2
        fi
        "$PY" -m venv "$VENV"
    fi
    bash scripts/install_torch.sh "$VENV/bin/python"
    "$VENV/bin/pip" install -q -e ".[course,dev]"
}

case "${1:-}" in
    setup)
        setup "$1"
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
        exec "$VENV/bin/python" -m pytest "${@:2}"
        ;;
    # -- the course outside a kernel: website, explorer app, slides --
    site)
        setup "$1"
        exec "$VENV/bin/python" site/build.py "${@:2}"
        ;;
    explorer)
        setup "$1"
        # The `course` template (apps/voila/templates) is Voila's lab template without CDN links.
        JUPYTER_PATH="$PWD/apps${JUPYTER_PATH:+:$JUPYTER_PATH}" exec "$VENV/bin/voila" apps/explorer.ipynb \
            --template=course --no-browser "${@:2}"
        ;;
    slides)
        setup "$1"
        exec "$VENV/bin/python" -m toy_engine.slides "${@:2}"
        ;;
    handout)
        setup "$1"
        exec "$VENV/bin/python" -m toy_engine.handout "${@:2}"
        ;;
    trace)
        setup "$1"
        exec "$VENV/bin/python" -m toy_engine.kineto "${@:2}"
        ;;
    *)
        echo "usage: ./run.sh lab | ./run.sh test | ./run.sh setup | ./run.sh site | ./run.sh explorer | ./run.sh slides | ./run.sh handout | ./run.sh trace summary FILE | ./run.sh trace export OUT.json" >&2
        exit 2
        ;;
esac

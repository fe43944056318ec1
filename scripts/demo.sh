#!/usr/bin/env bash
# Set up (first run only) and run the demo: a short profiled training run of a small CNN on scikit-learn's digits.
# Extra arguments go to the demo, e.g. `bash scripts/demo.sh --epochs 1 --slow-data 0.01`.
EXTRAS=demo
# The page (--html) draws its charts with plotly: installed with the html extra when the page is asked for
for arg in "$@"; do case "$arg" in --html|--html=*) EXTRAS=demo,html ;; esac; done
source "$(dirname "$0")/_venv.sh"
# Run from the caller's folder: relative paths (--csv, --plot, --trace) land where the user is.
exec "$VENV/bin/python" -m fastxtend_prof "$@"

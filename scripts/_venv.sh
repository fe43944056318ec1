# Sourced by the scripts: make (or reuse) the virtual environment $VENV and install the project with extras "$EXTRAS".
# torch is pinned first ($TORCH_SPEC, default the CPU build this project is tested on) so pip never pulls a 5 GB CUDA
# build just to satisfy fastai's "torch>=..." requirement.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
PY="${PYTHON:-python3}"
quiet_pip() { "$VENV/bin/python" -m pip -q "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating virtual environment in $VENV"
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then quiet_pip install "$TORCH_SPEC"; fi
# Keep that torch: without the constraint, pip may upgrade it to satisfy a newer torchvision that fastai pulls in.
echo "$TORCH_SPEC" > "$VENV/torch-constraint.txt"
quiet_pip install -c "$VENV/torch-constraint.txt" -e "$ROOT[$EXTRAS]"

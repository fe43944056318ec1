# Sourced by the scripts: make (or reuse) the virtual environment $VENV (default: .venv in the checkout) and install the
# project with extras "$EXTRAS".
# torch is pinned first ($TORCH_SPEC: one or more requirements, default the CPU build the demo runs on) so pip never pulls
# a CUDA build it did not ask for just to satisfy fastai's "torch>=..." requirement. scripts/test.sh asks for the CUDA build
# torch==2.14.1 with torchvision==0.29.1 (torchvision imports only beside a CUDA build; both run on a CPU).
# pip runs only when the install is missing or out of date: a stamp in $VENV records what the last successful install
# depended on. The package is installed editable, so code changes need no reinstall.
# INSTALLER=uv (scripts/test.sh's default): the two installs by uv (a Rust installer, itself pip-installed into $VENV),
# which resolves, unpacks and compiles in parallel: the test environment in about 90 s instead of pip's 250 (95 s for
# torch, 145 s for the project and its ~190 packages, 200 s of them CPU) on a quiet 2-core machine, the same versions of
# every package.
# uv reads no pip configuration (pip.conf's indexes, find-links or constraints): where it cannot install, pip does.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.fastxtend_prof-install-$EXTRAS"
quiet_pip() { "$VENV/bin/python" -m pip -q "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
# What an install depends on: this checkout, the extras, the torch spec, the Python version, the project's metadata and
# version; and where the package imports from (-I: not from the current folder), which fails if it does not import.
install_stamp() {
  "$VENV/bin/python" -I -c '
import hashlib, sys, fastxtend_prof
root = sys.argv[1]
print(*sys.argv[1:], sys.version.split()[0], fastxtend_prof.__file__, sep="\n")
for f in ("pyproject.toml", "fastxtend_prof/__init__.py"): print(f, hashlib.sha256(open(f"{root}/{f}", "rb").read()).hexdigest())
' "$ROOT" "$EXTRAS" "$TORCH_SPEC" 2>/dev/null
}
# The two installs by uv; false (and a line saying so) where uv cannot be had or cannot install them, for pip to do it
with_uv() {
  { [ -x "$VENV/bin/uv" ] || quiet_pip install uv; } || { echo "(uv could not be installed: pip installs instead)" >&2; return 1; }
  # Compiled to bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set (as on these machines) nothing is compiled on
  # import, and every process that imports fastai would compile it again (18.6 CPU seconds instead of 7.4)
  # shellcheck disable=SC2086
  if "$VENV/bin/uv" pip install -q --compile-bytecode --python "$VENV/bin/python" $TORCH_SPEC \
     && "$VENV/bin/uv" pip install -q --compile-bytecode --python "$VENV/bin/python" -c "$VENV/torch-constraint.txt" -e "$ROOT[$EXTRAS]"; then return 0; fi
  echo "(uv could not install the environment: pip installs instead)" >&2; return 1
}
up_to_date() { [ -s "$STAMP" ] && [ -x "$VENV/bin/python" ] && [ "$(install_stamp)" = "$(cat "$STAMP")" ]; }
install_project() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "creating virtual environment in $VENV"
    "$PY" -m venv "$VENV"
  fi
  rm -f "$STAMP"
  echo "installing $TORCH_SPEC, fastai and fastxtend_prof[$EXTRAS] into $VENV (when it is new or the project changed: a minute or more)" >&2
  # Keep that torch: without the constraint, pip may upgrade it to satisfy a newer torchvision that fastai pulls in.
  # shellcheck disable=SC2086  # one word per requirement
  printf '%s\n' $TORCH_SPEC > "$VENV/torch-constraint.txt"
  if [ "${INSTALLER:-pip}" = uv ] && with_uv; then :; else
    # shellcheck disable=SC2086
    quiet_pip install $TORCH_SPEC  # nothing to do (seconds) when the environment has them already
    quiet_pip install -c "$VENV/torch-constraint.txt" -e "$ROOT[$EXTRAS]"
  fi
  "$VENV/bin/python" -I -c 'import fastxtend_prof'  # a broken install fails here, with its error, and writes no stamp
  install_stamp > "$STAMP"
}
if ! up_to_date; then install_project; fi

#!/usr/bin/env bash
# Set up (first run only) and run every check: notebooks and generated module agree, notebooks are clean,
# the notebooks' docs tests pass (nbdev-test), and the pytest suite in tests/ passes.
# --quick: the checks a change needs first, in a few minutes: the agreement, ruff and the tests not marked slow
# (tests/conftest.py marks the long files); no notebooks run. What CI runs is the whole command, without --quick.
# Other arguments go to pytest.
QUICK=0
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
EXTRAS=dev
# The report page's tests open it in headless Chromium (tests/test_page.py): Debian's package, installed when it is
# missing and this runs as root with apt-get, as on CI's machines; elsewhere those tests skip and say why. Installed
# beside the environment's setup (minutes on a fresh machine), and waited for before pytest starts.
chromium_pid=
if [ "$QUICK" = 0 ] && ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== installing chromium for the report page's browser tests, beside the environment's setup"
  ( { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
      || echo "(chromium could not be installed: the browser tests will skip)" ) &
  chromium_pid=$!
fi
# The tests' own environment (not the demo's .venv): fastai.vision, which the real-applications suite trains, needs
# torchvision, and torchvision imports only beside a CUDA build of torch (5.5 GB; it runs on a CPU too).
VENV="${VENV:-$(cd "$(dirname "$0")/.." && pwd)/.venv-test}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.14.1 torchvision==0.29.1}"
INSTALLER="${INSTALLER:-uv}"  # uv installs the environment in a sixth of pip's time (scripts/_venv.sh); INSTALLER=pip for pip
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
echo "== environment ready after ${SECONDS} s"
export MPLBACKEND=Agg PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::DeprecationWarning}"
# One torch thread per process. The tests' models are tiny, and with every core busy (CI runs under load) torch's
# worker threads wait for each other at every op: on two busy cores a vision test and the CLI's tune demo ran 1.7x
# slower with two threads than with one, and the demo's compute swelled to 560 ms a batch. Set OMP_NUM_THREADS to change.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "== nbdev-export: the notebooks and fastxtend_prof/ must agree"
  "$VENV/bin/nbdev-export"
  if [ -n "$(git status --porcelain -- fastxtend_prof)" ]; then
    git status --short -- fastxtend_prof; git --no-pager diff --stat -- fastxtend_prof
    echo "FAIL: fastxtend_prof/ differs from what the notebooks export: run nbdev-export and commit both" >&2; exit 1
  fi
  echo "== nbdev-clean: notebooks must be committed clean"
  "$VENV/bin/nbdev-clean"
  if [ -n "$(git status --porcelain -- nbs)" ]; then
    git status --short -- nbs
    echo "FAIL: notebooks are not clean: run nbdev-clean and commit" >&2; exit 1
  fi
else
  echo "(not a git checkout: skipping the export/clean agreement checks)"
fi

echo "== ruff: no dead import or variable, no undefined name (pyflakes' rules; pyproject.toml [tool.ruff])"
"$VENV/bin/ruff" check --quiet "$ROOT"

if [ "$QUICK" = 1 ]; then
  echo "== --quick: the notebooks are not run, the files marked slow are left out (the whole command runs both)"
  set -- -m "not slow" "$@"
else
  # Alone, not beside pytest: run beside its 5 processes on CI's 2 busy cores, three notebooks' verdicts (08_compare,
  # 17_tune, 34_stages) failed at that load
  echo "== nbdev-test: the docs notebooks (at ${SECONDS} s)"
  "$VENV/bin/nbdev-test" --n-workers 2
fi
if [ -n "$chromium_pid" ]; then wait "$chromium_pid" || true; fi
echo "== pytest (at ${SECONDS} s)"
# Several test processes (pytest-xdist), each test file whole in one of them, the longest files first (tests/conftest.py
# orders them; --no-loadscope-reorder keeps that order): twice the cores and one more, at least 3 and at most 8
# (PYTEST_WORKERS=N to change; 0 runs the tests in this one process). On a machine busy with other work, as CI's is, the
# cores are shared among the running processes, so more test processes get the suite a larger share: under CI's load (a
# spinning process on each of 2 cores) pytest took 1,080-1,290 s in 2 processes (half the cores) and 1,057 s in 3, and in
# one process CI as a whole took over 31 minutes; later, with more tests, 1,487 s in 3 processes and 1,260 s in 5.
# Many tests also wait (sleeping workloads, subprocesses starting python),
# which a process more than the cores fills on a quiet machine. The cores are counted before OMP_NUM_THREADS=1 above,
# which `nproc` would otherwise obey and count as one. The reasons of skipped tests and the 25 slowest tests are listed
# at the end.
cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)"  # no nproc on macOS
workers="${PYTEST_WORKERS:-$(( cores < 2 ? 3 : cores > 3 ? 8 : 2*cores + 1 ))}"
if [ "$workers" -gt 0 ]; then par=(-n "$workers" --dist loadfile --no-loadscope-reorder); else par=(); fi
"$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider "${par[@]}" --durations 25 tests "$@"

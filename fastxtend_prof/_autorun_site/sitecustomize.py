"""Imported by Python as it starts when this folder is on PYTHONPATH (`fastxtend-prof run --env`): with FASTXTEND_PROF set, every fastai fit is profiled."""
# Written by hand: nbdev can't export into this folder (nbs/31_run.ipynb explains it, tests/test_run.py checks it).
# It runs the `sitecustomize` it hides first, and imports only `os` and `sys` unless FASTXTEND_PROF is set.
import os, sys

def _chain_sitecustomize():
    "Run the next `sitecustomize` on `sys.path` (skipping every copy of this folder) as Python would have; it becomes `sitecustomize`"
    import importlib.machinery, importlib.util
    rest = [p for p in sys.path if os.path.basename(os.path.normpath(p or '.')) != '_autorun_site']
    spec = importlib.machinery.PathFinder.find_spec('sitecustomize', rest)
    if spec is None or spec.loader is None: return
    module = importlib.util.module_from_spec(spec)
    sys.modules['sitecustomize'] = module
    spec.loader.exec_module(module)

def _start_profiling():
    "With FASTXTEND_PROF set, profile every fastai fit of this process"
    if not os.environ.get('FASTXTEND_PROF', '').strip(): return
    try: from fastxtend_prof.autorun import start_from_env
    except ImportError as e:
        print(f'fastxtend-prof: FASTXTEND_PROF is set but fastxtend_prof cannot be imported ({e}): not profiling', file=sys.stderr)
        return
    start_from_env()

if __name__ == 'sitecustomize':
    try: _chain_sitecustomize()  # first: it may set up the sys.path where fastxtend_prof is found
    finally: _start_profiling()

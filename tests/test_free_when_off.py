"""Importing the package costs a fit nothing profiles nothing measurable: counted in Python function calls, which load
cannot shift (`benchmarks/instructions.py` counts the same fits in CPU instructions, with valgrind).

Each count runs in a fresh process: fastai's `synth_learner` fits once to warm up, then its epoch loop
(`Learner._do_fit`) is counted with `sys.setprofile`: every Python function called, by the file it is in."""
import json, os, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
N_TRN, N_VAL, EPOCHS = 20, 2, 2
BATCHES = EPOCHS*(N_TRN + N_VAL)

CHILD = r'''
import json, sys, collections
import torch
torch.set_num_threads(1)
imported = sys.argv[1] == 'imported'
if imported: import fastxtend_prof.all  # noqa: F401
from fastai.test_utils import synth_learner
from fastai.callback.progress import ProgressCallback
learn = synth_learner(n_trn=int(sys.argv[2]), n_val=int(sys.argv[3]))
learn.remove_cb(ProgressCallback)
calls = collections.Counter()
def count(frame, event, arg):
    if event == 'call': calls[frame.f_code.co_filename] += 1
def fit(counted):
    do_fit = learn._do_fit
    def loop():
        if counted: sys.setprofile(count)
        try: do_fit()
        finally: sys.setprofile(None)
    learn._do_fit = loop
    try:
        with learn.no_logging(): learn.fit(int(sys.argv[4]))
    finally: del learn._do_fit
fit(False); fit(True)
print(json.dumps(calls))
'''

def calls(config):
    "Python calls in the counted epoch loop of `config` (`fastai` or `imported`), by file"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
    p = subprocess.run([sys.executable, '-c', CHILD, config, str(N_TRN), str(N_VAL), str(EPOCHS)], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])

@pytest.fixture(scope='module')
def counted():
    return calls('fastai'), calls('imported')

def test_an_unprofiled_fit_after_the_import_makes_the_calls_fastai_makes(counted):
    plain, imported = counted
    ours = {f: n for f, n in imported.items() if f'{os.sep}fastxtend_prof{os.sep}' in f}
    # Per batch: nothing more than fastai's own. What the package adds is per loop and per fit (the loop's choice,
    # `AllBatches`, asks each callback whether it listens to `before_draw`; the fit watch): 52 calls in these 4 loops of
    # 22 or 2 batches, about one a batch. Before the lookup was replaced rather than wrapped, every miss on the Learner
    # (about 20 a batch, each asking for `_xtra` too) went through one more frame: +42 calls a batch
    added = sum(imported.values()) - sum(plain.values())
    assert added <= 2*BATCHES, (added/BATCHES, sorted(ours.items(), key=lambda kv: -kv[1]))
    lookups = sum(n for f, n in ours.items() if f.endswith('events.py'))
    assert lookups >= BATCHES, ours   # the Learner's misses go through the package's lookup, in place of fastcore's...
    fastcore = lambda calls: sum(n for f, n in calls.items() if f.endswith(f'fastcore{os.sep}basics.py'))
    assert fastcore(plain) - fastcore(imported) >= 0.9*lookups, (fastcore(plain), fastcore(imported))  # ...not beside it

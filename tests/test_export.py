"""A Learner exported after profiling (`learn.export()`) loads where fastxtend_prof is not installed, and predicts as before.

Profiling is a development step: the deployment machine that runs `load_learner` has fastai but not this package. So
nothing of fastxtend_prof may be pickled with the Learner: not the profile result (`learn.profile_result`), and not the
profiler's callbacks, which are still attached when the export happens inside a `with learn.profiling():` block. Each
exported file is loaded in a fresh interpreter in which a meta-path finder makes every `import fastxtend_prof...` fail,
ahead of the editable install's finder and of the repository on `sys.path`, as on a machine without the package; its
predictions on a fixed input must equal the original Learner's, bit for bit. Exporting must not cost the user the profile
in the process that made it either."""
import copy, io, json, os, pickletools, subprocess, sys, textwrap, zipfile
from pathlib import Path
import pandas as pd
import torch
from torch import nn
import fastai.callback.progress  # noqa: F401  (Learner.no_bar)
from fastai.data.core import Datasets
from fastai.data.transforms import ItemGetter
from fastai.learner import Learner
from fastai.losses import MSELossFlat
import fastxtend_prof.all  # noqa: F401  (Learner.profile, Learner.profiling)
from fastxtend_prof.profiler.simpleprofiler import SimpleProfilerCallback, SimpleProfilerPostCallback
from conftest import calls

ROOT = Path(__file__).resolve().parent.parent
PAIR = (SimpleProfilerCallback, SimpleProfilerPostCallback)
N_TRN, N_VAL, BS = 4, 2, 16
X = torch.linspace(-2, 2, 8*4).reshape(8, 4)  # the fixed input both sides predict on

def tiny_learner(path):
    """A Learner `export` can save: fastai's `synth_learner` cannot (its plain `TensorDataset` has no `new_empty`), so a
    `Datasets` of (x, y) rows, read by fastai's own `ItemGetter` (nothing of this test module in the pickle), and a small MLP"""
    g = torch.Generator().manual_seed(0)
    x = torch.randn((N_TRN + N_VAL)*BS, 4, generator=g)
    items = list(zip(x, x.sum(1, keepdim=True)))
    dsets = Datasets(items, tfms=[[ItemGetter(0)], [ItemGetter(1)]], splits=[range(N_TRN*BS), range(N_TRN*BS, len(items))])
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    return Learner(dsets.dataloaders(bs=BS), model, loss_func=MSELossFlat(), path=path)

def fit(learn, n=1):
    with learn.no_logging(), learn.no_bar(): learn.fit(n)

def predict(learn):
    "The model's output on `X` on the cpu, where `load_learner` puts the exported one (a copy: a model trained on a GPU stays there)"
    model = copy.deepcopy(learn.model).cpu().eval()
    with torch.no_grad(): return model(X)

def attached(learn): return [cb for cb in learn.cbs if isinstance(cb, PAIR)]

def pickled_names(path, what='fastxtend_prof'):
    "The strings naming `what` in the pickle `torch.save` wrote to `path` (module and class names): why a load would fail"
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith('data.pkl')))
    return sorted({a for _, a, _ in pickletools.genops(io.BytesIO(data)) if isinstance(a, str) and what in a})

# ------------------------------------------------------------------------------------------ the deployment machine
LOADER = textwrap.dedent('''
    import importlib.abc, json, sys, traceback
    BLOCKED = []
    class NotInstalled(importlib.abc.MetaPathFinder):
        "fastxtend_prof is not installed here: every import of it, or of any submodule, fails"
        def find_spec(self, name, path=None, target=None):
            if name == 'fastxtend_prof' or name.startswith('fastxtend_prof.'):
                BLOCKED.append(name)
                raise ModuleNotFoundError(f'No module named {name!r}', name=name)
    sys.meta_path.insert(0, NotInstalled())  # ahead of the editable install's finder and of the path finder
    sys.path.insert(0, sys.argv[3])          # the repository too: the package sits right there, and still cannot be imported
    assert not [m for m in sys.modules if m.split('.')[0] == 'fastxtend_prof'], 'imported before the blocker'
    for m in ('fastxtend_prof', 'fastxtend_prof.profiler.simpleprofiler'):
        try: __import__(m)
        except ModuleNotFoundError: pass
        else: raise AssertionError(f'the blocker let `import {m}` through')
    BLOCKED.clear()
    import torch
    from fastai.learner import load_learner
    try: learn = load_learner(sys.argv[1])
    except Exception:
        traceback.print_exc()
        sys.exit(f'load_learner failed; imports of fastxtend_prof it attempted: {BLOCKED}')
    learn.model.eval()
    with torch.no_grad(): torch.save(learn.model(torch.load(sys.argv[2])), sys.argv[2] + '.preds')
    print(json.dumps(dict(blocked=BLOCKED, cbs=[type(cb).__name__ for cb in learn.cbs])))
''')

def load_elsewhere(path):
    "Load the exported `path` where fastxtend_prof cannot be imported: its predictions on `X`, and what it tried to import"
    tmp = path.parent
    (tmp/'load.py').write_text(LOADER)
    torch.save(X, tmp/'x.pt')
    p = subprocess.run([sys.executable, str(tmp/'load.py'), str(path), str(tmp/'x.pt'), str(ROOT)], capture_output=True, text=True,
                       cwd=tmp, timeout=300, env={**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))})
    assert p.returncode == 0, (f'{path.name} did not load without fastxtend_prof; names of it in the pickle: {pickled_names(path)}\n'
                               f'{p.stderr[-3000:]}')
    return torch.load(str(tmp/'x.pt') + '.preds'), json.loads(p.stdout.strip().splitlines()[-1])

def check_loads_elsewhere(learn, path):
    preds, info = load_elsewhere(path)
    assert info['blocked'] == [], info
    assert torch.equal(preds, predict(learn)), 'the loaded Learner predicts differently'
    assert not {'SimpleProfilerCallback', 'SimpleProfilerPostCallback'} & set(info['cbs']), info

# ---------------------------------------------------------------------------------------------------------- tests
def test_the_blocker_stops_fastxtend_prof_and_lets_fastai_load(tmp_path):
    """The control: a Learner never profiled, in a process where fastxtend_prof is imported (it patches `Learner`), loads
    without it. So a failure below is what profiling left in the pickle, not the loader (whose blocker is checked in it)"""
    learn = tiny_learner(tmp_path)
    fit(learn)
    learn.export(tmp_path/'export.pkl')
    check_loads_elsewhere(learn, tmp_path/'export.pkl')

def test_export_after_a_profiled_fit_loads_without_fastxtend_prof(tmp_path):
    "`learn.profile()` then fit, as the README shows, and export: `learn.profile_result` must not travel with the Learner"
    learn = tiny_learner(tmp_path).profile(show_report=False)
    fit(learn)
    learn.export(tmp_path/'export.pkl')
    check_loads_elsewhere(learn, tmp_path/'export.pkl')

def test_export_inside_a_profiling_block_loads_without_fastxtend_prof(tmp_path):
    "Inside `with learn.profiling():` the profiler's callbacks are still attached when the user exports after a fit"
    learn = tiny_learner(tmp_path)
    with learn.profiling(show_report=False):
        fit(learn)
        assert len(attached(learn)) == 2
        learn.export(tmp_path/'inside.pkl')
    check_loads_elsewhere(learn, tmp_path/'inside.pkl')

def test_export_after_a_profiling_block_loads_without_fastxtend_prof(tmp_path):
    "After the block the callbacks are gone, and the block's profile result is what must not travel"
    learn = tiny_learner(tmp_path)
    with learn.profiling(show_report=False): fit(learn)
    assert attached(learn) == []
    learn.export(tmp_path/'after.pkl')
    check_loads_elsewhere(learn, tmp_path/'after.pkl')

def test_export_leaves_the_profile_in_this_process(tmp_path):
    "Exporting is not forgetting: the profile the user is reading is the same object, with the same numbers, after `export`"
    learn = tiny_learner(tmp_path).profile(show_report=False)
    fit(learn)
    r, res = learn.profile_result, learn.simple_profile_results.copy()
    learn.export(tmp_path/'export.pkl')
    assert learn.profile_result is r
    pd.testing.assert_frame_equal(learn.simple_profile_results, res)
    assert calls(learn.simple_profile_results, 'train', 'batch') == N_TRN - 1  # the first is the warmup

def test_export_inside_a_profiling_block_keeps_profiling(tmp_path):
    "An export between two fits of a block does not detach the profiler: the block's report has both fits, as without it"
    learn = tiny_learner(tmp_path)
    with learn.profiling(show_report=False):
        fit(learn)
        cbs = attached(learn)
        learn.export(tmp_path/'inside.pkl')
        assert attached(learn) == cbs
        fit(learn)
    res = learn.simple_profile_results
    assert calls(res, 'fit', 'fit') == 2 and calls(res, 'train', 'batch') == 2*(N_TRN - 1)
    assert attached(learn) == []

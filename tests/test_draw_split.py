"""The draw's split (issue 16): `wait`, `transfer` and `transforms`, measured against known waits, for both kinds of loader.

Like test_accuracy, each configuration is profiled twice. On an injected clock (`ManualClock`), where each wait advances
the clock and nothing else takes any time, each sub-step must hold exactly its wait, in every batch: what the profiler
computes, which no load can change. On the real clock, with the waits spun, only what survives a loaded machine: each
sub-step's median is at least its wait (a spin of s seconds takes at least s of wall time), and the parts add up to
the draw. The waits are injected where the real costs live:
- `wait`: the loader's collate function spends `wait` per batch (once: on the real clock, the code that follows a spin
  runs on cold caches for a while, real time that per-item spins would multiply);
- `transfer`: the batch's input is a `SlowTensor`, whose `.to()` (what fastai's `to_device` calls, in the loader or in
  `Learner._set_device`) spends `transfer` and returns a `MovedTensor`, as a copy to the device takes its time inside the
  move and hands over a tensor of the device: the Learner's second `to_device` of a fastai loader's batch finds it there;
- `transforms`: a fastai `Transform` in the loader's `after_batch` spends `transforms`.
Both kinds: a fastai `TfmdDL` with a device (the loader moves the batch, then transforms it) and torch `DataLoader`s in
fastai `DataLoaders` (the Learner moves the batch; no transforms, so no `transforms` row)."""
import time
import pytest, torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader as TorchDL, default_collate
from fasttransform import Transform
from fastai.data.core import DataLoaders
from fastai.data.load import fa_collate
from fastai.learner import Learner
from fastai.optimizer import SGD
from fastai.callback.progress import ProgressCallback
import fastxtend_prof.all  # noqa: F401  (adds Learner.profile)
from conftest import row, ManualClock, Spend, recorder_with

WAITS = dict(wait=0.012, transfer=0.008, transforms=0.010)  # on the manual clock
REAL_WAITS = dict(wait=0.003, transfer=0.002, transforms=0.0025)  # spun: far above a sub-step's own µs of work, and quick
spend = Spend(WAITS)  # the waits in force
N_TRAIN, N_VALID, BS, EPOCHS = 12, 10, 8, 2
SUB = ('wait', 'transfer', 'transforms')

class MovedTensor(torch.Tensor):
    "A tensor that has arrived on the device: moving it there again is torch's no-op"

class SlowTensor(torch.Tensor):
    "A batch on the host whose move to the device takes the `transfer` wait; what arrives is a `MovedTensor`"
    def to(self, *args, **kwargs):
        spend('transfer')
        return self.as_subclass(MovedTensor).to(*args, **kwargs)  # not a SlowTensor: fastai's `retain_type` keeps it a MovedTensor

def items(n):
    "`n` pairs `(x, y)` whose `x` is a `SlowTensor`"
    x = torch.randn(n)
    return list(zip(x.as_subclass(SlowTensor), 2*x + 1))

def slow_collate(collate):
    "`collate` taking the `wait` longer: the loader's work on a batch (reading, decoding, collating)"
    def _inner(b):
        spend('wait')
        return collate(b)
    return _inner

class SlowTfm(Transform):
    "A batch transform (`after_batch`) that takes the `transforms` wait"
    order = 10
    def encodes(self, x:torch.Tensor): return x
    def __call__(self, b, **kwargs):
        spend('transforms')
        return super().__call__(b, **kwargs)

class Model(nn.Module):
    def __init__(self): super().__init__(); self.lin = nn.Linear(1, 1)
    def forward(self, x): return self.lin(x.view(-1, 1)).view(-1)

def make_dls(kind):
    tr, va = items(BS*N_TRAIN), items(BS*N_VALID)
    if kind == 'fastai':
        return DataLoaders.from_dsets(tr, va, bs=BS, shuffle=False, num_workers=0, device=torch.device('cpu'), after_batch=[SlowTfm()],
                                      create_batch=slow_collate(fa_collate))
    return DataLoaders(*(TorchDL(ds, batch_size=BS, num_workers=0, collate_fn=slow_collate(default_collate)) for ds in (tr, va)))

def profiled_fit(waits, kind, mode, clock=None):
    "Profile a fit with `waits` in force on loaders of `kind`, timed the `mode` way (injected through the recorder seam on a CPU), on `clock` (None: the real one)"
    host = clock or time.perf_counter
    with spend.using(waits, clock), recorder_with(host, mode):
        learn = Learner(make_dls(kind), Model(), loss_func=F.mse_loss, opt_func=SGD, lr=1e-3)
        learn.remove_cb(ProgressCallback)
        learn.profile(show_report=False, sync=mode)
        with learn.no_logging(): learn.fit(EPOCHS)
    assert learn.profile_result.sync == mode
    return learn.simple_profile_results


@pytest.fixture(scope='module', params=[('fastai', 'none'), ('torch', 'none'), ('fastai', 'events'), ('torch', 'events')], ids='-'.join)
def config(request): return request.param

@pytest.fixture(scope='module')
def results(config):
    "The waits on the manual clock: each sub-step holds exactly its wait"
    return profiled_fit(WAITS, *config, clock=ManualClock())

@pytest.fixture(scope='module')
def real(config):
    "The waits spun on the real clock"
    torch.set_num_threads(1)
    return profiled_fit(REAL_WAITS, *config)

@pytest.mark.parametrize('phase', ['train', 'valid'])
@pytest.mark.parametrize('step', SUB)
def test_sub_step_medians(config, results, real, phase, step):
    """Each sub-step holds exactly its known wait in every batch, on the manual clock; on the real clock its median is at
    least its spun wait (however loaded the machine: an upper bound would not survive load), which fails when the wait
    lands in another part. A torch loader has no transforms: no row, and its waits are not injected."""
    kind, mode = config
    if kind == 'torch' and step == 'transforms':
        for r in (results, real): assert not ((r.Phase == phase) & (r.Step == 'transforms')).any()
        return
    r = row(results, phase, step)
    assert r['Action'] == 'draw'
    for c in ('Mean Duration', 'Median Duration', 'Max Duration'): assert r[c] == pytest.approx(WAITS[step], abs=1e-12), (c, r[c])
    assert row(real, phase, step)['Median Duration'] >= REAL_WAITS[step]
    for r in (results, real): assert row(r, phase, step)['Number of Calls'] == EPOCHS*((N_TRAIN if phase == 'train' else N_VALID) - 1)

@pytest.mark.parametrize('phase', ['train', 'valid'])
def test_sub_steps_add_up_to_draw(config, results, real, phase):
    "wait + transfer + transforms is the draw, mean and total, on either clock; on the manual clock the draw is exactly their waits"
    for r in (results, real):
        parts = r[(r.Phase == phase) & (r.Action == 'draw') & (r.Step != 'draw')]
        assert set(parts.Step) == (set(SUB) if config[0] == 'fastai' else {'wait', 'transfer'})
        for c in ('Mean Duration', 'Total Time'): assert parts[c].sum() == pytest.approx(row(r, phase, 'draw')[c], rel=1e-9, abs=1e-12)
    parts = SUB if config[0] == 'fastai' else SUB[:2]
    assert row(results, phase, 'draw')['Max Duration'] == pytest.approx(sum(WAITS[s] for s in parts), abs=1e-12)

def test_nothing_left_wrapped(config):
    "After the fits, fastai's `to_device` and the loaders' `after_batch` are their own again"
    import fastai.data.load as load
    from fastai.torch_core import to_device
    assert load.to_device is to_device

# ------------------------------------------------------------------------------------------ the rows everywhere else
def quick_fit(tmp_path, **kwargs):
    "A short profiled fit on the fastai kind, nothing injected, writing CSV and JSON to `tmp_path`"
    learn = Learner(make_dls('fastai'), Model(), loss_func=F.mse_loss, opt_func=SGD, lr=1e-3, path=tmp_path)
    learn.remove_cb(ProgressCallback)
    learn.profile(show_report=False, save_csv=True, save_json=True, **kwargs)
    with learn.no_logging(): learn.fit(1)
    return learn

def test_exports_and_summaries_keep_the_split(tmp_path):
    "The CSV and JSON hold the draw's parts; `keep_raw=False` summaries give the same calls and totals; a comparison compares them"
    import pandas as pd
    from fastxtend_prof.core.saved import load_json
    from fastxtend_prof.verdicts.compare import compare_profiles
    learn = quick_fit(tmp_path)
    res = learn.simple_profile_results
    keys = lambda df: set(zip(df.Phase, df.Action, df.Step))
    assert {(p, 'draw', s) for p in ('train', 'valid') for s in SUB} <= keys(res)
    csv = pd.read_csv(tmp_path/'simple_profile.csv')
    assert keys(csv) == keys(res)
    back, _ = load_json(tmp_path/'simple_profile.json')
    assert keys(back) == keys(res)
    lean = quick_fit(tmp_path/'lean', keep_raw=False).simple_profile_results
    for p in ('train', 'valid'):
        for s in SUB: assert row(lean, p, s)['Number of Calls'] == row(res, p, s)['Number of Calls']
        parts = lean[(lean.Phase == p) & (lean.Action == 'draw') & (lean.Step != 'draw')]
        assert parts['Total Time'].sum() == pytest.approx(row(lean, p, 'draw')['Total Time'], rel=1e-9)
    cmp = compare_profiles(tmp_path/'simple_profile.json', tmp_path/'lean'/'simple_profile.json')
    assert {('train', s) for s in SUB} <= set(zip(cmp.Phase, cmp.Step))

def test_ranks_merge_the_split():
    "Two ranks' results merge into one table with the draw's parts, which still add up to the draw"
    from fastxtend_prof.features.distributed import rank_table, merge_ranks
    res = profiled_fit({}, 'torch', 'none')
    merged = merge_ranks(rank_table({0: res, 1: res}))
    for p in ('train', 'valid'):
        parts = merged[(merged.Phase == p) & (merged.Action == 'draw') & (merged.Step != 'draw')]
        assert set(parts.Step) == {'wait', 'transfer'}
        assert parts['Mean Duration'].sum() == pytest.approx(row(merged, p, 'draw')['Mean Duration'], rel=1e-9)

def test_unprofiled_fit_wraps_nothing():
    "Without a profiler fastai runs its own loop: fastai's `to_device` and `_loaders` while it trains, its own pipelines"
    import fastai.data.load as load
    from fastai.torch_core import to_device
    from fastai.callback.core import Callback
    loaders, seen = load._loaders, []
    class Look(Callback):
        def before_batch(self): seen.append((load.to_device is to_device, load._loaders is loaders, type(self.learn.dl.after_batch).__name__))
    learn = Learner(make_dls('fastai'), Model(), loss_func=F.mse_loss, opt_func=SGD, lr=1e-3, cbs=Look())
    learn.remove_cb(ProgressCallback)
    with learn.no_logging(): learn.fit(1)
    assert seen and set(seen) == {(True, True, 'Pipeline')}

def test_profiled_fit_keeps_the_loaders_pipelines():
    """Profiled, the draw is split by wrapping the module names fastai's `DataLoader.__iter__` looks up, never the loader's
    own pipelines: a callback sees the same `Pipeline` objects, with the loader's `split_idx`, and all is restored after"""
    import fastai.data.load as load
    from fastai.torch_core import to_device
    from fastai.callback.core import Callback
    dls = make_dls('fastai')
    own = {(i, nm): getattr(dl, nm) for i, dl in enumerate(dls.loaders) for nm in ('after_item', 'before_batch', 'after_batch')}
    loaders, seen = load._loaders, []
    class Look(Callback):
        def before_batch(self):
            dl = self.learn.dl
            seen.append((load.to_device is to_device, load._loaders is loaders,
                         all(getattr(dl, nm) is own[(int(not self.training), nm)] for nm in ('after_item', 'before_batch', 'after_batch')),
                         dl.after_batch.split_idx == getattr(dl.dataset, 'split_idx', None)))
    learn = Learner(dls, Model(), loss_func=F.mse_loss, opt_func=SGD, lr=1e-3, cbs=Look())
    learn.remove_cb(ProgressCallback)
    learn.profile(show_report=False)
    with learn.no_logging(): learn.fit(1)
    assert seen and set(seen) == {(False, True, True, True)}   # `to_device` wrapped while it ran (the loaders have a device), the pipelines fastai's own
    assert load.to_device is to_device and load._loaders is loaders
    assert row(learn.simple_profile_results, 'train', 'transforms')['Number of Calls'] > 0

def test_a_callback_drawing_from_another_loader_leaves_the_split_exact():
    """A callback that takes a batch of another fastai loader in `before_draw` (inside the draw) and in `after_batch`
    (between draws): that loader's marks are overwritten by the draw's own (the last of each counts) or dropped as older
    than the draw, so transfer and transforms stay exactly their waits, and the callback's time is part of the wait"""
    from fastai.callback.core import Callback
    class Peek(Callback):
        def before_draw(self): self.learn.dls.valid.one_batch()
        def after_batch(self): self.learn.dls.valid.one_batch()
    with spend.using(WAITS, ManualClock()) as sp, recorder_with(sp.clock, 'none'):
        learn = Learner(make_dls('fastai'), Model(), loss_func=F.mse_loss, opt_func=SGD, lr=1e-3, cbs=Peek())
        learn.remove_cb(ProgressCallback)
        learn.profile(show_report=False)
        with learn.no_logging(): learn.fit(1)
    res = learn.simple_profile_results
    for step, want in (('wait', WAITS['wait'] + sum(WAITS.values())), ('transfer', WAITS['transfer']), ('transforms', WAITS['transforms'])):
        for c in ('Mean Duration', 'Max Duration'): assert row(res, 'train', step)[c] == pytest.approx(want, abs=1e-12), (step, c)

class Batches:
    "A loader of neither kind: a plain iterable of ready batches"
    def __init__(self, dl): self.batches = list(dl)
    def __len__(self): return len(self.batches)
    def __iter__(self): return iter(self.batches)

def test_other_loaders_get_wait_and_transfer():
    "A loader that is neither a fastai nor a torch DataLoader: the loop still marks the hand-over; no transforms row"
    dls = make_dls('torch')
    dls.loaders = [Batches(dls.train), Batches(dls.valid)]
    learn = Learner(dls, Model(), loss_func=F.mse_loss, opt_func=SGD, lr=1e-3)
    learn.remove_cb(ProgressCallback)
    learn.profile(show_report=False)
    with learn.no_logging(): learn.fit(1)
    res = learn.simple_profile_results
    parts = res[(res.Phase == 'train') & (res.Action == 'draw') & (res.Step != 'draw')]
    assert set(parts.Step) == {'wait', 'transfer'}
    assert parts['Mean Duration'].sum() == pytest.approx(row(res, 'train', 'draw')['Mean Duration'], rel=1e-9)

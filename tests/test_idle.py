"""Why the GPU idled (`learn.profile(idle=True)`), on a CPU: real fastai fits timed in `sync='events'` on `FakeDevice`, a
simulated asynchronous accelerator whose host clock moves only where a callback spends time and whose queue runs the
work launched on it, so every idle stretch is known exactly. A synchronisation is `FakeDevice.item()`: the host waits for
the queue, and a warning as torch's sync debug mode gives it (from the caller's line) reaches the watch.

The fit: a 0.5 ms draw, a forward that queues 6 ms, `Item.after_loss` reading the loss (a sync), 3 ms of host work at the
start of the backward, which queues 6 ms, and `LossLogger.after_batch` syncing after every batch, as fastai's Recorder
does on a GPU. Without `Item` the host's 3 ms run while the forward's 6 ms do: the batch is exactly 3 ms shorter."""
import math, threading, warnings
import pytest, torch
from torch import nn
from fastai.learner import Learner
from fastai.data.core import DataLoaders
from fastai.callback.core import Callback
from fastai.callback.progress import ProgressCallback
import fastxtend_prof.all  # noqa: F401
from fastxtend_prof.profiler.testing import FakeDevice
from fastxtend_prof.features.idle import SYNC_MESSAGE, SyncWatch, idle_text
from conftest import recorder_with, cpu_learner

class Sim(Callback):
    "Known work in each step: host time on the fake device's clock, device work queued on it"
    order = 0
    def __init__(self, dev, w): self.dev, self.w = dev, w
    def before_draw(self): self.dev.host(self.w.get('draw', 0))
    def before_batch(self):
        k = self.w.get('launches', 1)
        for _ in range(k): self.dev.launch(self.w['fwd']/k); self.dev.host(self.w.get('launch', 1e-4))
    def before_backward(self): self.dev.host(self.w.get('bwd_host', 0)); self.dev.launch(self.w['bwd'])
    def before_step(self): self.dev.host(self.w.get('step', 0))

class Item(Callback):
    order = 0
    def __init__(self, dev): self.dev = dev
    def after_loss(self): self.dev.item()

class LossLogger(Callback):
    order = 60
    def __init__(self, dev): self.dev = dev
    def after_batch(self):
        if self.training: self.dev.item()

ITEM = dict(fwd=6e-3, bwd=6e-3, bwd_host=3e-3, step=2e-4, draw=5e-4)

def fit(w, item=True, n=24, **kw):
    dev = FakeDevice()
    x = torch.randn(n*8, 4); y = torch.randn(n*8, 1)
    dls = DataLoaders.from_dsets(list(zip(x, y)), list(zip(x[:16], y[:16])), bs=8, num_workers=0, device='cpu')
    learn = Learner(dls, nn.Linear(4, 1), loss_func=nn.MSELoss(), cbs=[Sim(dev, w), LossLogger(dev)] + ([Item(dev)] if item else []))
    learn.remove_cb(ProgressCallback)
    with recorder_with(dev.clock, 'events', dev):
        learn.profile(idle=kw.pop('idle', True), show_report=False, **kw)
        with learn.no_logging(): learn.fit(1)
    return learn

def iteration(learn): return learn.simple_profile_results.set_index(['Phase', 'Step']).loc[('train', 'iteration'), 'Mean Duration']

@pytest.fixture(scope='module')
def item_runs():
    return fit(ITEM), fit(ITEM, item=False)

def test_a_sync_is_named_by_callback_and_line_and_its_gain_is_what_removing_it_saves(item_runs):
    a, b = item_runs
    c = a.profile_result.idle.causes
    top = c.iloc[0]
    assert top.Cause == 'sync' and top.Where.startswith('Item.after_loss (test_idle.py:') and top['Per Batch'] == 1, c
    measured = iteration(a) - iteration(b)
    assert measured == pytest.approx(3e-3, abs=1e-9)  # the workload: the host's 3 ms no longer overlap the forward
    assert top.Idle == pytest.approx(measured, abs=1e-9)
    assert top['Gain Low'] <= measured <= top['Gain High']
    # the sync fastai's Recorder makes on a GPU (here LossLogger): what the draw and the forward's launch cost after it
    logger = c[c.Where.str.startswith('LossLogger.after_batch')].iloc[0]
    assert logger.Idle == pytest.approx(6e-4, rel=0.1)
    assert not (c.Cause != 'sync').any()  # every idle stretch followed a sync, which the work behind it would have covered
    adv = [x for x in a.profile_result.advice if x.rule == 'gpu_idle']
    assert adv and adv[0].severity == 'warning' and 'Item.after_loss' in adv[0].verdict and '.item()' in adv[0].suggestion

def test_the_idle_time_is_a_column_of_the_train_steps(item_runs):
    r = item_runs[0].simple_profile_results.set_index(['Phase', 'Step'])['GPU Idle']
    assert r[('train', 'backward')] == pytest.approx(3e-3, abs=1e-6)  # the host's 3 ms with the device drained
    assert r[('train', 'iteration')] == pytest.approx(r[('train', 'draw')] + r[('train', 'batch')] + r[('train', 'other')])
    assert math.isnan(r[('valid', 'predict')])

def test_a_loader_that_sleeps_puts_the_idle_on_the_draw():
    c = fit(dict(fwd=1e-3, bwd=1e-3, draw=20e-3), item=False).profile_result.idle.causes
    assert c.iloc[0].Cause == 'data' and c.iloc[0].Share > 0.7, c

def test_many_small_launches_put_the_idle_on_launching():
    c = fit(dict(fwd=2e-3, launches=40, launch=1e-4, bwd=1e-3), item=False).profile_result.idle.causes
    assert c.iloc[0].Cause == 'launch' and c.iloc[0].Idle == pytest.approx(3e-3, rel=0.05), c  # 40 launches of 0.1 ms for 2 ms of work

def test_a_slow_optimizer_step_is_its_own_cause():
    c = fit(dict(fwd=1e-3, bwd=1e-3, step=5e-3), item=False).profile_result.idle.causes
    assert c.iloc[0].Cause == 'optimizer', c

def test_without_the_sync_watch_the_idle_stays_with_the_steps():
    c = fit(ITEM, idle=dict(syncs=False)).profile_result.idle.causes
    assert not (c.Cause == 'sync').any() and c.iloc[0].Cause == 'launch', c  # the backward's 3 ms

def test_the_watch_leaves_warnings_as_they_were_and_passes_other_warnings_on():
    filters, show = list(warnings.filters), warnings.showwarning
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter('always')
        w = SyncWatch(clock=lambda: 1.0, cuda=False)
        w.start()
        warnings.warn('a warning of the user', UserWarning)
        warnings.warn(f'{SYNC_MESSAGE} (here)', UserWarning)
        t = threading.Thread(target=lambda: warnings.warn(f'{SYNC_MESSAGE} (another thread)', UserWarning)); t.start(); t.join()
        w.uninstall()
        warnings.warn(f'{SYNC_MESSAGE} (after)', UserWarning)
    assert [str(x.message) for x in seen] == ['a warning of the user', f'{SYNC_MESSAGE} (after)']  # the watch's own swallowed while on
    assert len(w.syncs) == 1 and w.syncs[0][1].startswith('test_the_watch_leaves')  # the other thread's is not the training loop's
    assert warnings.filters == filters and warnings.showwarning is show

def test_on_a_cpu_it_says_in_one_line_that_it_needs_a_gpu():
    learn = cpu_learner()
    learn.profile(idle=True, show_report=False)
    with learn.no_logging(): learn.fit(1)
    lines = [l for l in learn.profile_result.lines() if l.startswith('GPU idle')]
    assert lines == ['GPU idle: not measured (needs a GPU: the model trains on the cpu).']
    assert 'GPU Idle' not in learn.simple_profile_results
    assert idle_text(None, 'x') == 'GPU idle: not measured (x).'

def test_the_saved_run_holds_the_causes(item_runs, tmp_path):
    import json, jsonschema
    from pathlib import Path
    from fastxtend_prof.core.saved import save_profile, load_profile
    a = item_runs[0]
    save_profile(a.profile_result.saved(a), tmp_path/'run.json')
    doc = json.loads((tmp_path/'run.json').read_text())
    jsonschema.validate(doc, json.loads((Path(__import__('fastxtend_prof').__file__).parent/'run.schema.json').read_text()))
    assert doc['metadata']['idle']['causes'][0]['Where'].startswith('Item.after_loss')
    assert 'GPU Idle' in load_profile(tmp_path/'run.json').results

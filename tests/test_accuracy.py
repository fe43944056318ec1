"""Accuracy: a workload whose every step takes a known extra time, measured through a real fastai fit.

Two clocks, for two questions:
- What the profiler computes, on an injected clock (`ManualClock`, through `make_recorder`'s `clock`): each wait advances
  the clock instead of spinning, and so do known amounts in every callback event (`Tick`), so time passes only where the
  test says it does. Each step must then hold exactly its wait and the events that belong to it by the design's table of
  boundaries, in every batch and every timing mode (`sync='none'`, and `'device'` and `'events'` through the seam: a no-op
  synchronisation; device events that read the same clock). This cannot flake, and a wait or an event charged to the
  wrong step, or a boundary moved past a callback, changes two steps by a known amount.
- That the recorder reads the real clock at the right moments, on the real clock with the waits spun: only what survives
  a loaded machine is asserted (a spin of s seconds takes at least s of wall time, so a step's median is at least its
  wait; the steps fit in their batch and the phase's rows add up to it, which hold on any clock)."""
import time
import pytest, torch
from torch import nn
import torch.nn.functional as F
from fastai.data.core import DataLoaders
from fastai.learner import Learner, Recorder
from fastai.optimizer import SGD
from fastai.callback.progress import ProgressCallback
import fastxtend_prof.all  # noqa: F401  (adds Learner.profile)
from conftest import row, ManualClock, Spend, Tick, recorder_with

# Seconds each step of a batch takes, on top of the real work: on the manual clock (free: no two alike, so that no
# swap goes unseen), and spun on the real clock (a few ms: well above a step's own few µs of work, so that a wait charged
# elsewhere leaves its step far below it, and short, to keep the suite fast).
WAITS = dict(draw=0.015, forward=0.020, loss=0.010, backward=0.025, opt_step=0.016, zero_grad=0.011)
REAL_WAITS = dict(draw=0.003, forward=0.004, loss=0.002, backward=0.005, opt_step=0.003, zero_grad=0.002)
# Seconds of callback work in each event, on the manual clock: by a callback between the profiler's Pre and Post (TICKS),
# and by one ordered after fastai's Recorder (LATE_TICKS)
TICKS = dict(before_draw=1e-4, before_batch=2e-4, after_pred=3e-4, after_loss=4e-4, before_backward=5e-4, after_backward=6e-4,
             before_step=7e-4, after_step=8e-4, after_batch=9e-4)
LATE_TICKS = dict(after_batch=1.1e-3)
N_TRAIN, N_VALID, BS, EPOCHS = 12, 10, 8, 2

def expected(phase):
    "Seconds of each step of a steady batch of `phase` on the manual clock, by the design's table of boundaries"
    w, k = WAITS, TICKS
    pred = k['before_batch'] + w['forward'] + k['after_pred']  # callbacks' before_batch and after_pred work is the forward's
    loss = w['loss'] + k['after_loss']
    steps = dict(forward=pred, loss=loss, backward=k['before_backward'] + w['backward'] + k['after_backward'],
                 opt_step=k['before_step'] + w['opt_step'] + k['after_step'], zero_grad=w['zero_grad']) if phase == 'train' else dict(predict=pred, loss=loss)
    between = k['after_batch']  # after_batch work of callbacks between Pre and Post: in the batch, in none of its steps
    return dict(draw=w['draw'] + k['before_draw'], **steps, batch=sum(steps.values()) + between, other=LATE_TICKS['after_batch'])

spend = Spend(WAITS)

class SlowDL:
    "A DataLoader stand-in: the `n` batches of `dl`, made in advance, each taking the `draw` wait to hand over"
    def __init__(self, dl, n): self.dl, self.batches = dl, list(dl)[:n]
    def __len__(self): return len(self.batches)
    def __iter__(self):
        for b in self.batches:
            spend('draw')
            yield b
    def __getattr__(self, k): return getattr(self.dl, k)

# Each wait comes at the end of its step's own work. On this shared VM the code that runs right after a spin finds its
# caches cold and runs several times slower (real time of the step, which the profiler rightly charges to it): at the
# end, only fastai's dispatch to the step's closing mark follows it.
class SlowModel(nn.Module):
    def __init__(self):
        super().__init__(); self.lin = nn.Linear(1, 1)
        for p in self.lin.parameters(): p.register_post_accumulate_grad_hook(self._accumulated)
        self._left = 0
    def _accumulated(self, p):
        "The backward's last work: the wait comes after both parameters' gradients are in"
        self._left -= 1
        if self._left == 0: spend('backward')
    def forward(self, x):
        out = self.lin(x.view(-1, 1)).view(-1)
        self._left = 2
        spend('forward')
        return out

def slow_loss(pred, y):
    loss = F.mse_loss(pred, y)
    spend('loss')
    return loss

def make_learner(cbs=()):
    n = BS*max(N_TRAIN, N_VALID)
    x = torch.randn(n); y = 2*x + 1
    ds = list(zip(x, y))
    dls = DataLoaders.from_dsets(ds, ds, bs=BS, shuffle=False, drop_last=False, num_workers=0, device=torch.device('cpu'))
    dls.loaders = [SlowDL(dls.train, N_TRAIN), SlowDL(dls.valid, N_VALID)]
    learn = Learner(dls, SlowModel(), loss_func=slow_loss, opt_func=SGD, lr=1e-3, cbs=list(cbs))
    learn.remove_cb(ProgressCallback)
    learn.create_opt()
    step, zero = learn.opt.step, learn.opt.zero_grad
    def slow_step(*a, **k): r = step(*a, **k); spend('opt_step'); return r
    def slow_zero(*a, **k): r = zero(*a, **k); spend('zero_grad'); return r
    learn.opt.step, learn.opt.zero_grad = slow_step, slow_zero
    return learn

def profiled_fit(waits, mode, clock=None):
    "Profile the workload with `waits` in force, timed the `mode` way (injected through the recorder seam on a CPU), on `clock` (None: the real one)"
    host = clock or time.perf_counter
    cbs = [Tick(clock, TICKS), Tick(clock, LATE_TICKS, order=Recorder.order + 1)] if clock is not None else []
    with spend.using(waits, clock), recorder_with(host, mode):
        learn = make_learner(cbs).profile(show_report=False, sync=mode)
        with learn.no_logging(): learn.fit(EPOCHS)
    assert learn.profile_result.sync == mode
    return learn.simple_profile_results

@pytest.fixture(scope='module', params=['none', 'device', 'events'])
def mode(request): return request.param

@pytest.fixture(scope='module')
def results(mode):
    "The workload on the manual clock: time passes only in the waits and the callbacks' ticks"
    return profiled_fit(WAITS, mode, ManualClock())

@pytest.fixture(scope='module')
def real(mode):
    "The workload on the real clock, every wait spun"
    torch.set_num_threads(1)
    return profiled_fit(REAL_WAITS, mode)

STEPS = [('train', 'draw', 'draw'), ('train', 'forward', 'forward'), ('train', 'loss', 'loss'), ('train', 'backward', 'backward'),
         ('train', 'opt_step', 'opt_step'), ('train', 'zero_grad', 'zero_grad'),
         ('valid', 'draw', 'draw'), ('valid', 'predict', 'forward'), ('valid', 'loss', 'loss')]

@pytest.mark.parametrize('phase,step,key', STEPS)
def test_step_means(mode, results, phase, step, key):
    "Each step holds exactly its wait and its events' callback work, in every batch: the mean, the median and the max alike"
    r, want = row(results, phase, step), expected(phase)[step]
    for c in ('Mean Duration', 'Median Duration', 'Max Duration'): assert r[c] == pytest.approx(want, abs=1e-12), (c, r[c], want)
    n = (N_TRAIN if phase == 'train' else N_VALID) - 1
    assert r['Number of Calls'] == EPOCHS*n
    if mode == 'events': assert r['Host Mean Duration'] == pytest.approx(want, abs=1e-12)   # the events read the same clock

@pytest.mark.parametrize('phase,step,key', STEPS)
def test_real_waits_land_in_their_steps(mode, real, phase, step, key):
    """On the real clock, however loaded the machine: every call of the step spins its wait, which takes at least that long,
    so the step's median is at least the wait (an upper bound would not survive load: a spin's overshoot, when the
    scheduler takes the core away at its deadline, is real time that the profiler rightly charges). A wait charged to a
    neighbouring step leaves this one with its own few microseconds of work, far below its wait."""
    assert row(real, phase, step)['Median Duration'] >= REAL_WAITS[key]
    assert row(real, phase, step)['Number of Calls'] == EPOCHS*((N_TRAIN if phase == 'train' else N_VALID) - 1)

PARTS = (('train', ('forward', 'loss', 'backward', 'opt_step', 'zero_grad')), ('valid', ('predict', 'loss')))

def test_batch_holds_its_steps(results, real):
    "The steps inside `batch` are disjoint parts of it: on the manual clock the rest is exactly the callbacks' after_batch work; on the real clock, the steps fit in it"
    for phase, steps in PARTS:
        gap = lambda r: row(r, phase, 'batch')['Mean Duration'] - sum(row(r, phase, s)['Mean Duration'] for s in steps)
        assert row(results, phase, 'batch')['Median Duration'] == pytest.approx(expected(phase)['batch'], abs=1e-12)
        assert gap(results) == pytest.approx(TICKS['after_batch'], abs=1e-12)
        assert gap(real) >= -1e-12   # exact on any clock: each batch's steps are disjoint intervals inside it

def test_other_gets_no_wait(results):
    "`other` holds the late callbacks' after_batch work and nothing else; the loop's last draw, which finds the loader empty, is its own row"
    for phase, n in (('train', N_TRAIN), ('valid', N_VALID)):
        r = row(results, phase, 'other')
        assert r['Median Duration'] == pytest.approx(LATE_TICKS['after_batch'], abs=1e-12)
        assert r['Total Time'] == pytest.approx(EPOCHS*(n - 1)*LATE_TICKS['after_batch'], abs=1e-12)
        last = row(results, phase, 'last_draw')  # a draw's: the callbacks' before_draw work, then the loader's StopIteration
        assert last['Number of Calls'] == EPOCHS and last['Total Time'] == pytest.approx(EPOCHS*TICKS['before_draw'], abs=1e-12)

@pytest.mark.parametrize('phase', ['train', 'valid'])
def test_partition(results, real, phase):
    "draw + batch + other + last_draw + warmup add up to the phase's time, on either clock"
    for res in (results, real):
        top = res[(res.Phase == phase) & (res.Action == res.Step)]
        assert set(top.Step) == {'draw', 'batch', 'other', 'last_draw', 'warmup'}
        assert top['Total Time'].sum() == pytest.approx(row(res, 'fit', phase)['Total Time'], rel=1e-9)

def test_samples_per_second(results):
    r = row(results, 'train', 'batch')
    assert r['Samples/Second'] == pytest.approx(BS*r['Number of Calls']/r['Total Time'])
    assert row(results, 'fit', 'train')['Samples/Second'] == pytest.approx(EPOCHS*N_TRAIN*BS/row(results, 'fit', 'train')['Total Time'])

ITEM, DROPPED = 0.010, 5  # seconds to make each item (a sleep: load lengthens it, never shortens it); items past the last full batch

class SleepyItems:
    "A dataset whose every item takes `ITEM` seconds to make"
    def __init__(self, n): self.x = torch.randn(n)
    def __len__(self): return len(self.x)
    def __getitem__(self, i): time.sleep(ITEM); return self.x[i], 2*self.x[i]

class Line(nn.Module):
    def __init__(self): super().__init__(); self.lin = nn.Linear(1, 1)
    def forward(self, x): return self.lin(x.view(-1, 1)).view(-1)

def test_a_dropped_partial_batch_is_the_loaders():
    """fastai's `drop_last` makes the items of the partial batch and then drops them, in the draw that finds the loader
    empty: that work is the loop's `last_draw` row, the loader's, never the last batch's `other` (which a callback rule reads).
    The bound on `other` is half the dropped items' sleeps, which the old booking put in it whole; its own work is µs"""
    from fastai.data.load import DataLoader
    train = DataLoader(SleepyItems(3*BS + DROPPED), bs=BS, drop_last=True, num_workers=0)
    valid = DataLoader(SleepyItems(BS), bs=BS, num_workers=0)
    learn = Learner(DataLoaders(train, valid, device=torch.device('cpu')), Line(), loss_func=F.mse_loss, opt_func=SGD, lr=1e-3)
    learn.profile(show_report=False)
    with learn.no_logging(): learn.fit(EPOCHS)
    res = learn.simple_profile_results
    last = row(res, 'train', 'last_draw')
    assert last['Number of Calls'] == EPOCHS and last['Total Time'] >= EPOCHS*DROPPED*ITEM, last
    assert row(res, 'train', 'other')['Max Duration'] < DROPPED*ITEM/2, row(res, 'train', 'other')
    top = res[(res.Phase == 'train') & (res.Action == res.Step)]
    assert top['Total Time'].sum() == pytest.approx(row(res, 'fit', 'train')['Total Time'], rel=1e-9)

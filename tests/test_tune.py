"""`learn.speed_find()` on real Learners: it finds the loader workers a data-bound run needs and proves the gain, leaves a
compute-bound run alone, survives a trial that fails, stays in its budget, and puts the Learner back so exactly that the
training that follows is bit-identical to one without it (synthetic, vision with `aug_transforms`, tabular)."""
import collections, copy, json, math, multiprocessing, random, re, time, warnings
from dataclasses import replace
from functools import partial
from types import SimpleNamespace
import numpy as np, pandas as pd, pytest, torch
from torch import nn
from fastai.basics import set_seed
from fastai.data.core import DataLoaders
from fastai.learner import Learner
from fastai.optimizer import OptimWrapper
from fastai.callback.progress import ProgressCallback
from fastai.callback.training import GradientAccumulation
from fastai.callback.fp16 import MixedPrecision
from fastai.callback.core import Callback
from fastai.callback.schedule import fit_one_cycle  # noqa: F401  (adds Learner.fit_one_cycle)
import fastxtend_prof.all  # noqa: F401  (adds Learner.profile and Learner.speed_find)
import fastxtend_prof.tune.search
from fastxtend_prof.tune.search import (plan, predict_workers, tune_context, steady_times, SETTERS, LearnerState, set_aside, set_num_workers,
                                 run_trial, cores, probe_loader, probe_handoff)
from fastxtend_prof.features.stages import WAITING
from fastxtend_prof.core.features import RandomStates
from fastxtend_prof.profiler.testing import busy_cores
from fastxtend_prof.core.recorder import Step
from conftest import busy, ManualClock
from test_applications import _vision, digits_dir, image_dls, adult_like, state, differences, run, one_thread, SEED  # noqa: F401  (fixtures: digits_dir, one_thread)

ITEM, BS, COMPUTE = 1.5e-3, 8, 1e-3  # the run: items busy-wait 1.5 ms, batches of 8, 1 ms of compute
HAND = dict(handoff=1e-3, receive=2e-3)  # a probed hand-over (`probe_handoff`; this VM reads 0.1-0.6 ms for a small batch): round numbers

class BusyItems(torch.utils.data.Dataset):
    "Items that cost `item` seconds of CPU each (a busy wait), or sleep them, or `spend` them (on an injected clock); `fail_in_workers`: raise when loaded in a worker process"
    def __init__(self, n, item=ITEM, fail_in_workers=False, sleep=False, spend=None):
        self.n, self.item, self.fail, self.sleep, self.spend = n, item, fail_in_workers, sleep, spend
    def __len__(self): return self.n
    def __getitem__(self, i):
        if self.fail and torch.utils.data.get_worker_info() is not None: raise RuntimeError('this dataset breaks in worker processes')
        if self.spend is not None: self.spend(self.item)
        elif self.sleep: time.sleep(self.item)
        else: busy(self.item)
        g = torch.Generator().manual_seed(i)
        return torch.randn(4, generator=g), torch.randn(1, generator=g)

class BusyModel(nn.Module):
    "A linear model whose forward also costs `compute` seconds (a busy wait, or `spend` on an injected clock): a fixed compute cost"
    def __init__(self, compute=COMPUTE, spend=None): super().__init__(); self.lin, self.compute, self.spend = nn.Linear(4, 1), compute, spend or busy
    def forward(self, x):
        self.spend(self.compute)
        return self.lin(x)

def busy_learner(item=ITEM, compute=COMPUTE, n_batches=60, fail_in_workers=False, sleep=False, spend=None, **kw):
    dls = DataLoaders.from_dsets(BusyItems(BS*n_batches, item, fail_in_workers, sleep, spend), BusyItems(4*BS, 0), bs=BS, num_workers=0)
    return Learner(dls, BusyModel(compute, spend), loss_func=nn.MSELoss(), **kw)

def snapshot(learn) -> dict:
    "What speed_find must leave as it found: weights, optimizer state, loaders' settings, every random state"
    opt = learn.opt.state_dict() if learn.opt is not None else None
    return dict(weights={k: v.detach().clone() for k, v in learn.model.state_dict().items()},
                opt=copy.deepcopy(opt), grads=[None if p.grad is None else p.grad.clone() for p in learn.model.parameters()],
                loaders=[(dl.fake_l.num_workers, dl.fake_l.pin_memory, dl.pin_memory, dl.bs, dl.device, dl.rng.getstate()) for dl in learn.dls.loaders],
                rng=(random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()), cbs=list(learn.cbs),
                training=learn.model.training)

def assert_same(a:dict, b:dict):
    assert a['weights'].keys() == b['weights'].keys() and all(torch.equal(a['weights'][k], b['weights'][k]) for k in a['weights'])
    assert (a['opt'] is None) == (b['opt'] is None)
    if a['opt'] is not None:
        sa, sb = a['opt']['state'], b['opt']['state']
        assert len(sa) == len(sb)
        for x, y in zip(sa.values() if isinstance(sa, dict) else sa, sb.values() if isinstance(sb, dict) else sb):
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) if torch.is_tensor(x[k]) else x[k] == y[k] for k in x)
        assert a['opt'].get('param_groups', a['opt'].get('hypers')) is not None
    assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(a['grads'], b['grads']))
    assert a['loaders'] == b['loaders'] and a['rng'][0] == b['rng'][0] and a['rng'][1] == b['rng'][1] and torch.equal(a['rng'][2], b['rng'][2])
    assert a['cbs'] == b['cbs'] and a['training'] == b['training']

# ------------------------------------------------------------------------------------------------ a data-bound run
def test_data_bound_run_gets_workers_and_proof(capsys, monkeypatch):
    "The issue's run: the tuner picks workers, the speed-up is significant and within 30% of the prediction; nothing changed"
    # The loader read as computing, so the workers stay within the cores: the prediction this test holds to 30%. Beyond the
    # cores (a loader that waits) the prediction is a quiet machine's: on 2 loaded cores 8 workers measured 14.9 ms a batch
    # against 8.4 predicted. That case is `test_speed_find_gives_a_waiting_loader_more_workers_than_cores`.
    real = fastxtend_prof.tune.search.probe_loader
    monkeypatch.setattr(fastxtend_prof.tune.search, 'probe_loader', lambda learn, **kw: (1., *real(learn, **kw)[1:]))
    monkeypatch.setattr(fastxtend_prof.tune.search, 'SPARE', 0)  # workers within the cores: a spare worker on sleeping items beats the cores' bound
    # Items that sleep 5 ms: loader workers that spin would take the cores the main process's compute needs, and on a busy
    # machine (CI runs under load, test processes beside spinning ones) 2 workers then measured 37% slower than predicted.
    # Sleeping items load the same whatever else runs; the tuner's logic and prediction are the same. 5 ms, not the issue's
    # 1.5: under CI's load the loop's own CPU work grew to about 18 ms a batch, the 12 ms of waiting was no longer most of
    # the iteration, and 2 workers measured no gain at all (31.6 against 31.7 ms), so the test skipped instead of judging.
    learn = busy_learner(item=5e-3, sleep=True)
    with learn.no_bar(): learn.fit(1)  # an optimizer with state, weights that moved
    before = snapshot(learn)
    res = learn.speed_find(max_time=60)
    assert_same(before, snapshot(learn))
    out = capsys.readouterr().out
    judged = lambda r: bool(r.fixes) and r.trials[r.trials.Accepted]['Error %'].abs().max() <= 30
    for _ in range(2):  # a busy spell slows a trial, not the prediction: measure again before blaming the tuner
        if judged(res): break
        time.sleep(1)
        res = learn.speed_find(max_time=60, show=False)
    if not judged(res): skip_if_the_cores_are_taken(learn, res)
    t = res.trials
    kept = t[t.Accepted]
    assert len(kept) >= 1 and res.fixes and res.fixes[0].kind == 'num_workers' and res.fixes[0].value >= 1, res.text()
    k = kept.iloc[-1]
    assert k['p-value'] < 0.01 and k['CI High %'] < 0, res.text()
    assert kept['Error %'].abs().max() <= 30, res.text()
    assert 'speed_find: start' in out and 'put back' in out
    assert res.seconds < 60 and 'faster with num_workers=' in res.verdict

def skip_if_the_cores_are_taken(learn, res):
    "Skip (with the numbers) when this machine, measured without the tuner, gets no real speed-up from 2 workers"
    state = LearnerState(learn)
    try:
        with learn.removed_cbs(set_aside(learn)):
            medians = {}
            for k in (0, 2):
                undo = set_num_workers(learn, k)
                medians[k] = steady_times(run_trial(learn, 40, 3, math.inf).results)
                undo()
    finally: state.restore()
    it, wait = medians[0][Step.ITERATION], medians[0][Step.WAIT]
    pred, got = predict_workers(wait, it, 0, 2, cores()), medians[2][Step.ITERATION]
    # Only when 2 workers really gave no speed-up: a skip that also asked whether `got` matched the prediction would
    # excuse a broken prediction as a busy machine
    if got > 0.85*it:
        pytest.skip(f'the cores are taken by other work: measured without the tuner, 2 workers gave {got*1e3:.1f} ms a batch against '
                    f'{it*1e3:.1f} ms with none (predicted {pred*1e3:.1f} ms), so the tuner cannot be judged here:\n{res.text()}')

def test_apply_sets_the_workers_and_says_how_to_keep_them(capsys):
    # Loading that sleeps, 10 ms an item (80 ms a batch): workers help however busy the machine is. At 1 ms an item CI's load
    # made the gain too small to be sure of (one worker: 20.8 -> 17.1 ms a batch, p 0.03); at 3 ms a loaded CI machine's loop
    # grew to 47 ms a batch without workers and 30 ms with 5 (median), a gain its spread left at p 0.21. With 80 ms of
    # waiting a batch the loop's own work, however slow the load makes it, is a small part of what the workers take away.
    learn = busy_learner(item=10e-3, n_batches=45, sleep=True)
    res = learn.speed_find(max_time=60, batches=30, apply=True)
    assert res.fixes, res.text()
    k = res.fixes[0].value
    assert all(dl.fake_l.num_workers == k for dl in learn.dls.loaders)
    out = capsys.readouterr().out
    assert f'num_workers: 0 → {k}' in out and f'num_workers={k}' in out
    learn.fit(1)  # the Learner trains with its new loaders

def test_compute_bound_run_is_left_alone():
    # A forward of 20 ms: at 4 ms, a loaded CI run's loop (fastai's own Python per batch, with a third of a core) grew
    # until the forward was 41% of the iteration, under the 50% that makes a run compute-bound
    learn = busy_learner(item=0, compute=20e-3, n_batches=45)
    before = snapshot(learn)
    res = learn.speed_find(max_time=60, batches=30, show=False)
    assert not res.fixes and not res.trials.Accepted.any()
    assert res.verdict.startswith('no change') and 'compute-bound' in res.verdict, res.verdict
    assert_same(before, snapshot(learn))

def test_a_failing_trial_is_reported_and_the_learner_restored():
    "A dataset that breaks in worker processes: the workers' trial fails, the table says so, the Learner is as it was"
    learn = busy_learner(fail_in_workers=True, n_batches=45)
    with learn.no_bar(): learn.fit(1)
    before = snapshot(learn)
    res = learn.speed_find(max_time=60, batches=30, show=False)
    failed = res.trials[res.trials.Note.str.startswith('failed')]
    assert len(failed) == 1 and 'worker processes' in failed.Note.iloc[0], res.text()
    assert not res.fixes
    assert_same(before, snapshot(learn))
    learn.fit(1)

def test_interrupt_inside_a_trial_restores_and_raises():
    "Ctrl-C in a trial: the Learner is put back, and the interrupt goes on to the caller"
    learn = busy_learner(n_batches=45)
    with learn.no_bar(): learn.fit(1)
    before = snapshot(learn)
    class Interrupt(nn.Module):
        def __init__(self, inner): super().__init__(); self.inner, self.n = inner, 0
        def forward(self, x):
            self.n += 1
            if self.n == 50: raise KeyboardInterrupt
            return self.inner(x)
    learn.model = Interrupt(learn.model)
    before = snapshot(learn)
    with pytest.raises(KeyboardInterrupt): learn.speed_find(max_time=60, batches=30, show=False)
    assert_same(before, snapshot(learn))

# ------------------------------------------------------------------------------------------------ budget and errors
def test_budget_holds(monkeypatch, sync_mode):
    """On an injected clock that the tuner's budget and the trials' profiles share: the items and the forward spend their
    time on it (13 ms a batch) and nothing else does, so a trial that stops at the deadline ends the search within one
    batch of it, and the loader's probe within one more batch of loading. (On the real clock the search's own work after the deadline, building the trial's profile and putting
    the Learner back, is what a loaded machine stretches: 0.32 s at a load of about 10 on 2 cores, over a bound of 0.3 s.)
    Breaks it: a trial that ignores the deadline (its 44 batches take 0.57 s)"""
    res = busy_learner().speed_find(max_batches=44, show=False)  # warmup 3, 40 batches and the last one, left out
    assert len(res.trials) == 1 and any('max_batches' in n for n in res.notes), res.text()
    clock = ManualClock()
    sync_mode(clock)
    monkeypatch.setattr(fastxtend_prof.tune.search, 'time', SimpleNamespace(monotonic=clock, perf_counter=time.perf_counter))
    learn = busy_learner(spend=clock.spend)
    res = learn.speed_find(max_time=0.4, show=False)
    # a trial stops at the end of the batch the deadline falls in; the loader's probe then makes its one batch (it gets a
    # tenth of what is left of the budget, and at least a batch)
    assert res.seconds <= 0.4 + (BS*ITEM + COMPUTE) + BS*ITEM + 1e-9, res.seconds
    assert res.notes and ('budget' in res.notes[0] or 'budget' in ' '.join(res.trials.Note)), res.text()

@pytest.mark.parametrize('kw, msg', [(dict(max_time=0), 'max_time'), (dict(batches=1), 'batches'), (dict(allow='bf16'), 'allow'),
                                      (dict(allow=('batch_size', 'x')), 'allow'), (dict(max_batches=10), 'max_batches'),
                                      (dict(sync='gpu'), 'sync'), (dict(warmup=-1), 'warmup'), (dict(warmup=80), 'warmup')])
def test_bad_options_fail_at_the_call(kw, msg):
    learn = busy_learner(n_batches=10)
    with pytest.raises(ValueError, match=msg): learn.speed_find(show=False, **kw)
    assert learn.profile_result is None  # nothing was profiled

def test_not_inside_a_fit():
    from fastai.callback.core import Callback
    learn = busy_learner(n_batches=4)
    class Tune(Callback):
        def before_fit(self): self.learn.speed_find(show=False)
    with pytest.raises(RuntimeError, match='between fits'): learn.fit(1, cbs=Tune())

# ------------------------------------------------------------------------------------------- what users attach
def test_one_cycle_accumulation_mixed_precision_progress_bar_then_identical_training():
    "A Learner with GradientAccumulation, MixedPrecision and a progress bar: speed_find, then fit_one_cycle, bit-identical to no speed_find"
    def build():
        set_seed(SEED, reproducible=True)
        return busy_learner(item=2e-4, compute=0, n_batches=45, cbs=[GradientAccumulation(4*BS), MixedPrecision()])
    def train(learn, tune):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # autocast and GradScaler without CUDA: fastai's own warnings
            learn.fit_one_cycle(1, 1e-2)
            if tune:
                res = learn.speed_find(max_time=60, batches=30, show=False)
                assert len(res.trials) >= 1
            learn.fit_one_cycle(1, 1e-2)
        return learn
    a, b = train(build(), False), train(build(), True)
    assert any(isinstance(cb, ProgressCallback) for cb in b.cbs)
    assert not differences(state(a), state(b))

def test_inside_profiling_the_trials_stay_out_of_the_report():
    learn = busy_learner(item=2e-4, n_batches=45)
    with learn.profiling(show_report=False):
        learn.fit(1)
        res = learn.speed_find(max_time=60, batches=30, show=False)
        learn.fit(1)
    assert len(res.trials) >= 1
    r = learn.profile_result
    assert '2 fits' in r.title, r.title
    assert r.results[(r.results.Phase == 'train') & (r.results.Step == 'iteration')]['Number of Calls'].iloc[0] == 2*(45 - 1)

class SlowStep(Callback):
    "Sleeps `s` seconds before each optimizer step (it lands in `opt_step`): a host-bound step whose share load can't shrink"
    def __init__(self, s): self.s = s
    def before_step(self): time.sleep(self.s)

def test_foreach_is_tried_on_a_host_bound_optimizer_step():
    "Many small parameters and a torch AdamW without foreach: the optimizer step is the bottleneck; foreach or fused is tried, and undone"
    class Many(nn.Module):
        def __init__(self): super().__init__(); self.ps = nn.ParameterList([nn.Parameter(torch.zeros(3)) for _ in range(300)])
        def forward(self, x): return x[:, :1] + sum(p.sum() for p in self.ps[:2])
    dls = DataLoaders.from_dsets(BusyItems(BS*45, 0), BusyItems(2*BS, 0), bs=BS, num_workers=0)
    # The 300 parameters' step alone is 0.4 ms of a 2 ms iteration on a quiet machine (19%); under CI's load the iteration's
    # median grew to 42 ms while the steps' medians did not (a batch is preempted somewhere, a step rarely), and the step
    # came out 4% of it, under the 10% the tuner acts on. 20 ms of sleep in the step keeps it the bottleneck under load.
    learn = Learner(dls, Many(), loss_func=nn.MSELoss(), opt_func=partial(OptimWrapper, opt=torch.optim.AdamW, foreach=False, fused=False),
                    cbs=SlowStep(20e-3))
    with learn.no_bar(): learn.fit(1)
    before = snapshot(learn)
    res = learn.speed_find(max_time=60, batches=30, show=False)
    assert {'foreach=True', 'fused=True'} & set(res.trials.Change), res.text()  # the fused kernel runs on the CPU too: either may come first
    assert_same(before, snapshot(learn))
    assert all(g['foreach'] is False and g['fused'] is False for g in learn.opt.opt.param_groups)

def test_torch_adamw_is_tried_for_fastais_adam_when_allowed():
    """fastai's own Adam on 300 small parameters: the step is the bottleneck (a 20 ms sleep in it keeps it so under load,
    as above). Without `allow` nothing of the optimizer is tried and the notes say what `allow='torch_optimizer'` would
    try; with it, torch's fused AdamW is tried in fastai Adam's place, and the Learner is put back with its own Adam and
    state"""
    class Many(nn.Module):
        def __init__(self): super().__init__(); self.ps = nn.ParameterList([nn.Parameter(torch.zeros(3)) for _ in range(300)])
        def forward(self, x): return x[:, :1] + sum(p.sum() for p in self.ps[:2])
    dls = DataLoaders.from_dsets(BusyItems(BS*45, 0), BusyItems(2*BS, 0), bs=BS, num_workers=0)
    learn = Learner(dls, Many(), loss_func=nn.MSELoss(), cbs=SlowStep(20e-3))
    with learn.no_bar(): learn.fit(1)
    opt, before = learn.opt, snapshot(learn)
    res = learn.speed_find(max_time=60, batches=30, show=False)
    assert 'torch_optimizer' not in set(res.trials.Kind) and "allow='torch_optimizer'" in ' '.join(res.notes), res.text()
    res = learn.speed_find(max_time=60, batches=30, allow='torch_optimizer', show=False)
    assert "torch's fused AdamW" in set(res.trials.Change), res.text()
    assert_same(before, snapshot(learn))
    assert learn.opt is opt and type(opt).__name__ == 'Optimizer'

# ---------------------------------------------------------------------------------------- the accelerator paths, faked
GPU_CTX = dict(device='cuda', model_device=torch.device('cuda'), cores=8, fastai_loader=True, num_workers=4, pin_memory=False, n_batches=100,
               bs=64, dls_device=None, optimizer='AdamW', foreach=True, fused=False, fused_ok=True, conv=True, channels_last=False, mixed_precision=False)

def test_plan_on_an_accelerator():
    "A GPU run's profile (faked): pinned memory, transforms on the device, fused, channels_last; mixed precision only when allowed"
    times = {Step.ITERATION: 0.1, Step.WAIT: 0.001, Step.TRANSFER: 0.02, Step.TRANSFORMS: 0.02, Step.FORWARD: 0.02, Step.BACKWARD: 0.02,
             Step.OPT_STEP: 0.015, Step.OTHER: 0.002}
    fixes, _ = plan(times, GPU_CTX)
    assert {f.kind for f in fixes} == {'pin_memory', 'transforms_on_device', 'fused', 'channels_last'}
    assert [f.predicted for f in fixes] == sorted(f.predicted for f in fixes)  # the most promising first
    assert {f.kind for f in plan(times, GPU_CTX, allow=('mixed_precision',))[0]} >= {'mixed_precision'}
    cpu = {**GPU_CTX, 'device': 'cpu', 'model_device': torch.device('cpu')}
    fixes, notes = plan(times, cpu, allow=('mixed_precision',))
    assert {f.kind for f in fixes} == {'fused'} and any('accelerator' in n for n in notes)

def test_worker_prediction_knows_the_cores():
    "0 workers: 12 ms of loading and 1 ms of compute a batch; on 2 cores the workers can't beat (12+1+1)/2 ms"
    assert predict_workers(0.012, 0.013, 0, 0, 2) == pytest.approx(0.013)
    assert predict_workers(0.012, 0.013, 0, 1, 2) == pytest.approx(0.012)  # not probed: the hand-over left out, a bound
    assert predict_workers(0.012, 0.013, 0, 1, 2, **HAND) == pytest.approx(0.013)  # 1 ms to hand each batch over
    assert predict_workers(0.012, 0.013, 0, 2, 2, **HAND) == pytest.approx(0.007)
    assert predict_workers(0.012, 0.013, 0, 4, 16, **HAND) == pytest.approx(0.00325)
    times = {Step.ITERATION: 0.013, Step.WAIT: 0.012, Step.FORWARD: 0.001}
    fixes, _ = plan(times, {**GPU_CTX, 'device': 'cpu', 'cores': 2, 'num_workers': 0, **HAND})
    assert fixes[0].kind == 'num_workers' and fixes[0].value == 3 and 'the 2 cores bound it' in fixes[0].why  # the cores and a spare
    assert fixes[0].predicted == pytest.approx(predict_workers(0.012, 0.013, 0, 3, 2, **HAND))  # the spare's own prediction
    assert 'handing a batch over costs a worker 1 ms and the loop 2 ms (measured)' in fixes[0].why
    fixes, notes = plan(times, {**GPU_CTX, 'device': 'cpu', 'cores': 2, 'num_workers': 2})
    assert not any(f.kind == 'num_workers' for f in fixes) and any('2 cores' in n for n in notes)

def test_a_loader_that_computes_gets_a_spare_worker(monkeypatch):
    """The cores bound a loader that computes: 2 workers on 2 cores are predicted at the cores' bound, 3 no faster (the
    loop's share of the cores shrinks), and 3 are planned, since batches come back in order and a worker the scheduler
    sets aside holds up those behind it (on this 2-core VM the sweep measured 3 workers 2-9% faster than 2 in eight runs
    of nine, even in the ninth: `benchmarks/speed_find_sweep.py`)"""
    times, ctx = {Step.ITERATION: 0.013, Step.WAIT: 0.012, Step.FORWARD: 0.001}, {**GPU_CTX, 'device': 'cpu', 'cores': 2, 'num_workers': 0, **HAND}
    h, r = HAND['handoff'], HAND['receive']
    assert predict_workers(0.012, 0.013, 0, 2, 2, **HAND) == pytest.approx((0.012 + h + 0.001)/2)
    assert predict_workers(0.012, 0.013, 0, 3, 2, **HAND) == pytest.approx(0.001 + r + (0.012 + h)*2/(3*2))
    assert [f.value for f in plan(times, ctx)[0]] == [3]
    assert [f.value for f in plan(times, {**ctx, 'n_batches': 2})[0]] == [2]  # never more workers than batches
    monkeypatch.setattr(fastxtend_prof.tune.search, 'SPARE', 0)
    assert [f.value for f in plan(times, ctx)[0]] == [2]

def test_a_waiting_loader_is_planned_workers_with_headroom(monkeypatch):
    """A loader that waits: the count is chosen as if loading took `SLACK` times longer, so the workers run ahead of the loop
    instead of only just keeping up; the prediction shown is without the headroom, and no faster than the loop's own work
    and its taking each batch from a worker (`receive`, probed): 12 ms of loading, 3 ms of the loop's own, 4 workers (3 without
    the headroom) and 5 ms predicted; the sweep benchmark's storage-bound loader 4 (3 with the headroom of 1.25)"""
    times, ctx = {Step.ITERATION: 0.015, Step.WAIT: 0.012, Step.FORWARD: 0.003}, {**GPU_CTX, 'device': 'cpu', 'cores': 2, 'num_workers': 0, 'loader_share': 0.1, **HAND}
    fixes, _ = plan(times, ctx)
    assert [(f.kind, f.value) for f in fixes] == [('num_workers', 4)] and fixes[0].predicted == pytest.approx(0.003 + HAND['receive'])
    # the storage-bound loader of `benchmarks/speed_find_sweep.py` as measured (the start 19.1 ms a batch, 14.5 ms of it
    # waiting; the loader alone 14.9 ms a batch, on a core 12% of it): 4 workers. With 1.25 the knee was 3, which measured
    # 4-11% slower than the best of 3 to 6 workers in six comparisons; 4 were 0-8% slower
    sweep = {Step.ITERATION: 0.0191, Step.WAIT: 0.0145, Step.FORWARD: 0.002}
    assert [f.value for f in plan(sweep, {**ctx, 'loader_share': 0.124, 'loader_batch': 0.0149})[0]] == [4]
    monkeypatch.setattr(fastxtend_prof.tune.search, 'SLACK', 1.25)
    assert [f.value for f in plan(sweep, {**ctx, 'loader_share': 0.124, 'loader_batch': 0.0149})[0]] == [3]
    monkeypatch.setattr(fastxtend_prof.tune.search, 'SLACK', 1.)
    assert [f.value for f in plan(times, ctx)[0]] == [3]
    fast = {**ctx, 'receive': 0.}  # the loop's floor without the hand-over: more workers, faster
    assert [f.value for f in plan(times, fast)[0]] == [5] and plan(times, fast)[0][0].predicted == pytest.approx(0.003)

@pytest.mark.parametrize('share,k,top', [(0.1, 7, 8), (0.3, 5, 6), (0.6, 3, 2), (math.nan, 3, 2)])
def test_a_loader_that_waits_is_planned_more_workers_than_cores(share, k, top):
    "The loader alone computes `share` of its time: the cores bound counts only that share, and up to n/share workers (4 a core, `top`) are considered; the fewest within `KNEE` of the best prediction with headroom (`SLACK`: `k`) are planned, and a spare worker where the cores bound a loader that computes"
    times, ctx = {Step.ITERATION: 0.013, Step.WAIT: 0.012, Step.FORWARD: 0.001}, {**GPU_CTX, 'device': 'cpu', 'cores': 2, 'num_workers': 0, **HAND}
    fixes, _ = plan(times, {**ctx, 'loader_share': share})
    assert [(f.kind, f.value) for f in fixes] == [('num_workers', k)]
    if share < WAITING: assert fixes[0].predicted == pytest.approx(predict_workers(0.012, 0.013, 0, k, 2, share, **HAND)) and 'waits the rest' in fixes[0].why
    assert predict_workers(0.012, 0.013, 0, 8, 2, 0.1, **HAND) == pytest.approx(0.001 + HAND['receive'])  # the loop's own work and its taking each batch bound it: 8 workers make one every 1.6 ms, the cores need (1.2 + 1 + 1)/2 ms
    fixes, notes = plan(times, {**ctx, 'num_workers': top, 'loader_share': share})
    assert not any(f.kind == 'num_workers' for f in fixes) and any(n.startswith(f'num_workers: already {top}') for n in notes)

def test_workers_ahead_of_the_loop_get_no_more():
    """With workers that, by the loader's own time alone (`probe_loader`), make batches faster than the loop takes them, the
    wait left is the hand-over: no more workers are planned, and the note says why. (speed_find on sleeping 1.5 ms items
    kept 6 workers at 3.35 ms a batch, then tried 8: not faster, and a third of its time.) Slower workers get more, predicted
    from the loader's own time rather than from the iteration"""
    times = {Step.ITERATION: 0.0068, Step.WAIT: 0.0044, Step.FORWARD: 0.0024}
    ctx = {**GPU_CTX, 'device': 'cpu', 'cores': 2, 'num_workers': 6, 'loader_share': 0.1, **HAND}
    fixes, notes = plan(times, {**ctx, 'loader_batch': 0.013})   # 6 workers: a batch every 2.3 ms
    assert not fixes and any('ahead of the loop' in n and 'hand-over' in n for n in notes), notes
    fixes, _ = plan(times, {**ctx, 'loader_batch': 0.04})   # 6 workers: a batch every 6.8 ms, the loop's pace
    assert [(f.kind, f.value) for f in fixes] == [('num_workers', 8)]
    assert fixes[0].predicted == pytest.approx(predict_workers(0.0044, 0.0068, 6, 8, 2, 0.1, 0.04, **HAND)) == pytest.approx(0.041/8)

def test_the_probe_tells_a_waiting_loader_from_a_computing_one():
    """The train loader alone, without workers: items that sleep need a core a small share of the time, items that
    busy-wait all of it, the same with 4 more processes spinning on the cores (the time the thread waits for a core is
    not counted either way); the workers are put back"""
    sleepy, spinning = busy_learner(item=10e-3, sleep=True, n_batches=10), busy_learner(item=10e-3, n_batches=10)
    for learn in (sleepy, spinning): set_num_workers(learn, 3)
    got = []
    for n in (0, 4):
        with busy_cores(n): (s, sb, _), (c, cb, _) = probe_loader(sleepy), probe_loader(spinning)
        assert s < 0.2 and c > 0.8, (n, s, c)
        assert sb >= 8*10e-3 and cb >= 8*10e-3, (sb, cb)  # its seconds a batch: 8 items of 10 ms at least
        got.append((s, c))
    assert abs(got[0][0] - got[1][0]) < 0.1 and abs(got[0][1] - got[1][1]) < 0.1, got
    assert [dl.fake_l.num_workers for dl in sleepy.dls.loaders] == [3, 3]
    # the batch transforms' own seconds (the loop runs them, whatever the workers): a transform that sleeps 5 ms a batch
    dl, tfms = sleepy.dls.train, sleepy.dls.train.after_batch
    def slow(b):
        time.sleep(5e-3)
        return tfms(b)
    dl.after_batch = slow
    s, sb, main = probe_loader(sleepy)
    assert 5e-3 <= main < 6e-3 + 0.1*sb and sb >= 8*10e-3 + 5e-3 and dl.after_batch is slow, (main, sb)
    dl.after_batch = tfms
    assert probe_loader(sleepy)[2] < 2e-3 and dl.__dict__['after_batch'] is tfms
    with pytest.raises(TypeError, match='fastai DataLoader'):
        probe_loader(type('L', (), {'dls': type('D', (), {'train': torch.utils.data.DataLoader(range(4))})()})())

class WorkerSlow(collections.namedtuple('WorkerSlow', 'x')):
    ("A batch's part that takes `MAKE` seconds to make anywhere, `WORKER` more in a loader worker, and the loop `LOOP` "
     "seconds to unpickle (sleeping each time)")
    MAKE, WORKER, LOOP = 10e-3, 20e-3, 10e-3
    def __new__(cls, x):
        time.sleep(cls.MAKE + (cls.WORKER if torch.utils.data.get_worker_info() is not None else 0.))
        return super().__new__(cls, x)
    def __reduce__(self): return _unpickle_slowly, (self.x,)

def _unpickle_slowly(x):
    time.sleep(WorkerSlow.LOOP)
    return tuple.__new__(WorkerSlow, (x,))  # not made again

def test_the_hand_over_is_measured_on_the_machine():
    """`probe_handoff` measures what a batch costs a worker more than the loop (`handoff`) and what the loop's taking a
    ready batch costs (`receive`): a batch that takes 10 ms to make in the loop and 30 ms in a worker, and 10 ms to
    unpickle (sleeps: waits load cannot shorten), reads about 20 ms and 10 ms; the random states are not drawn from, no
    worker is left; a batch that does not collate is NaN, NaN"""
    learn = busy_learner(item=0, n_batches=4)
    batch = (torch.zeros(8, 4), WorkerSlow(torch.zeros(8)))
    states, children = RandomStates(), multiprocessing.active_children()
    handoff, receive = probe_handoff(learn, batch, batches=8)
    assert RandomStates() == states and multiprocessing.active_children() == children
    # 20 ms and 10 ms; a receive that counted the worker's 20 ms would read 30 ms or more, which load only lengthens (18.6 ms was read under CI's load)
    assert 15e-3 <= handoff < 28e-3 and 9.5e-3 <= receive < 28e-3, (handoff, receive)
    small = probe_handoff(learn)  # the loader's own first batch: two small tensors
    assert all(0 < v < 10e-3 for v in small), small
    assert all(v != v for v in probe_handoff(learn, (torch.zeros(2), object())))

def test_speed_find_gives_a_waiting_loader_more_workers_than_cores(monkeypatch):
    "Items that sleep 10 ms (storage): on 2 cores speed_find tries and keeps more than 2 workers; the Learner is put back"
    monkeypatch.setattr(fastxtend_prof.tune.search, 'cores', lambda: 2)  # the same plan on any machine
    learn = busy_learner(item=10e-3, sleep=True)  # 80 ms of loading a batch, 1 ms of compute
    before = snapshot(learn)
    res = learn.speed_find(max_time=90, show=False)
    assert_same(before, snapshot(learn))
    assert res.start.loader_share < WAITING, res.text()
    assert res.fixes and res.fixes[0].kind == 'num_workers' and res.fixes[0].value > 2, res.text()
    assert 'more workers than the 2 cores can help' in res.fixes[0].why, res.fixes[0].why

def test_setters_undo_exactly():
    "Each change the tuner makes on a CPU Learner, the GPU ones included, is undone to the last attribute"
    v = busy_learner(n_batches=4)
    v.model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(1))
    v.model(torch.zeros(1, 3, 5, 5))
    v.opt_func = partial(OptimWrapper, opt=torch.optim.AdamW)
    v.create_opt()
    for p in v.model.parameters(): p.grad = torch.ones_like(p)
    v.opt.step()
    ctx = tune_context(v)
    strides = [p.stride() for p in v.model.parameters()]
    for kind, value in (('pin_memory', True), ('channels_last', True), ('transforms_on_device', 'cpu'), ('foreach', True), ('fused', True),
                        ('batch_size', 16), ('num_workers', 3), ('mixed_precision', True)):
        undo = SETTERS[kind](v, value)
        assert tune_context(v) != ctx or kind in ('transforms_on_device',), kind
        if kind == 'fused':
            for p in v.model.parameters(): p.grad = torch.ones_like(p)
            v.opt.step()  # the fused kernel runs on the state the unfused one made
        undo()
        now = tune_context(v)
        assert replace(now, dls_device=None) == replace(ctx, dls_device=None), kind
        assert [p.stride() for p in v.model.parameters()] == strides, kind

def test_an_undo_puts_back_what_was_not_the_objects_own():
    """A setter's undo leaves each object as it was, to its `__dict__`: its own value and a property's put back; a class's
    default or method not left behind as the object's own (the loader's batch transforms that `probe_loader` times are
    the class's method on a plain fastai DataLoader). Breaks it: an undo that sets back every value read"""
    from fastxtend_prof.tune.search import _assign
    class Thing:
        default = 1
        def method(self): return 'class'
        @property
        def prop(self): return self._prop
        @prop.setter
        def prop(self, v): self._prop = v
    o = Thing(); o.mine, o.prop = 2, 3
    before = dict(vars(o))
    undo = _assign([o], default=10, method=lambda: 'set', mine=20, prop=30)
    assert (o.default, o.method(), o.mine, o.prop) == (10, 'set', 20, 30)
    undo()
    assert vars(o) == before and (o.default, o.method(), o.mine, o.prop) == (1, 'class', 2, 3)
    from fastai.data.load import DataLoader as FastaiLoader
    for learn in (busy_learner(n_batches=4),  # a TfmdDL: its own `after_batch`, a Pipeline
                  Learner(DataLoaders(*(FastaiLoader(BusyItems(n, 0), bs=BS) for n in (4*BS, BS)), device='cpu'), BusyModel(0),
                          loss_func=nn.MSELoss())):  # a plain DataLoader: its class's method
        dl = learn.dls.train
        own = 'after_batch' in vars(dl)
        probe_loader(learn)
        assert ('after_batch' in vars(dl)) == own and dl.fake_l.num_workers == 0, type(dl)

# ------------------------------------------------------------------------------------ fastai's applications, unchanged
def _identical_after_tuning(build, first, then, **find):
    "Seed, build, `first`, (speed_find), `then`: with and without the tuner the weights and metrics are bit-identical"
    plain = state(run(build, lambda l: (first(l), then(l)), False))
    tuned = state(run(build, lambda l: (first(l), l.speed_find(show=False, **find), then(l)), False))
    diff = differences(plain, tuned)
    assert not diff, 'speed_find changed the training that followed: ' + '; '.join(diff[:5])

@pytest.mark.apps
def test_vision_with_aug_transforms_unchanged_by_tuning(digits_dir):  # noqa: F811 (pytest's fixture, imported above)
    v = _vision()
    build = lambda: v.vision_learner(image_dls(v, digits_dir), v.resnet18, pretrained=False)
    _identical_after_tuning(build, lambda l: l.fit_one_cycle(1, 1e-3), lambda l: l.fit_one_cycle(1, 1e-3), batches=4, warmup=1, max_time=60)

@pytest.mark.apps
def test_tabular_unchanged_by_tuning():
    from fastai.tabular.all import TabularDataLoaders, tabular_learner, Categorify, FillMissing, Normalize
    df = adult_like()
    def build():
        dls = TabularDataLoaders.from_df(df, y_names='salary', cat_names=['workclass', 'education'], cont_names=['age', 'hours'],
                                         procs=[Categorify, FillMissing, Normalize], bs=64, num_workers=0)
        return tabular_learner(dls, layers=[32, 16])
    _identical_after_tuning(build, lambda l: l.fit_one_cycle(1, 1e-2), lambda l: l.fit_one_cycle(1, 1e-2), batches=8, warmup=1, max_time=60)

def test_a_fix_from_outside_the_package_is_tried_kept_saved_loaded_and_applied(tmp_path, monkeypatch, sync_mode):
    """A fix that is not a switch, added from outside the package with `register_strategy` and no edit of it: the forward's
    pause, read from the Learner (`needs`), set to a tenth. `speed_find` plans, tries and keeps it (on an injected clock, as
    below), puts the Learner back and saves it; `load_speed` takes its value through the fix's own `check`, and `apply` sets
    it on a Learner built again with what its `persist` adds; the text says what it was. A value its check refuses, and the
    fix once unknown, are refused in one line"""
    from fastxtend_prof.tune.search import STRATEGIES, Strategy, Fix, register_strategy, load_speed
    monkeypatch.setattr(fastxtend_prof.tune.search, 'STRATEGIES', dict(STRATEGIES))  # the package's table as it was after the test
    clock = ManualClock()
    sync_mode(clock)
    monkeypatch.setattr(fastxtend_prof.tune.search, 'time', SimpleNamespace(monotonic=clock, perf_counter=time.perf_counter))
    class Pinned(Callback): "What the fix's `persist` adds, for later fits"
    def predict(times, ctx, allow):
        c = ctx.needs['pause']
        return ([Fix('pause', c/10, Step.FORWARD, times[Step.ITERATION] - 0.9*c, f'the forward pauses {c:g} s')], []) if c > 1e-3 else ([], [])
    def apply(learn, v):
        old, learn.model.compute = learn.model.compute, v
        return lambda: setattr(learn.model, 'compute', old)
    register_strategy('pause', Strategy(predict, apply, 'speed only', 'pause={:g} s'.format, 'set `model.compute = {v:g}`',
                                        needs=lambda learn: learn.model.compute, was=lambda ctx: ctx.needs['pause'],
                                        check=lambda v: isinstance(v, float) and 0 < v < 1, persist=lambda learn, v: learn.add_cb(Pinned())))
    learn = busy_learner(item=0., compute=40e-3, spend=clock.spend, n_batches=30)
    path = tmp_path/'speed.json'
    res = learn.speed_find(max_time=60, batches=20, show=False, save=path)
    mine = [f for f in res.fixes if f.kind == 'pause']
    assert len(mine) == 1 and mine[0].value == pytest.approx(4e-3), res.text()
    assert learn.model.compute == 40e-3 and not any(isinstance(cb, Pinned) for cb in learn.cbs), 'the Learner was not put back'
    assert 'pause: 0.04 → 0.004; to keep it, set `model.compute = 0.004`' in res.apply_text(), res.apply_text()
    # JSON as any reader takes it: a measure not taken (the core wait, the loader's probe) is null, never NaN
    saved = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f'{c} in {path.name}: not JSON'))
    assert saved['start']['loader_share'] is None and math.isnan(load_speed(path).start.loader_share), saved['start']
    assert saved['start']['needs']['pause'] == 0.04 and any(f['kind'] == 'pause' for f in saved['fixes']), saved  # beside the package's own needs
    loaded = load_speed(path)
    assert loaded.apply_text() == res.apply_text()
    again = busy_learner(item=0., compute=40e-3, n_batches=30)  # the Learner built again, as a new session would
    loaded.apply(again, show=False)
    assert again.model.compute == pytest.approx(4e-3) and sum(isinstance(cb, Pinned) for cb in again.cbs) == 1
    for f in saved['fixes']:
        if f['kind'] == 'pause': f['value'] = 2.0
    path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r'values out of range: pause=2\.0'): load_speed(path)
    del fastxtend_prof.tune.search.STRATEGIES['pause']
    with pytest.raises(ValueError, match=r"unknown fixes \['pause'\]"): load_speed(path)

def _moving_level_searches(monkeypatch, sync_mode, saves:float, searches:int, seed:int, predicted:float=0.7, **kw) -> list:
    """`searches` searches of a registered fix that makes the forward `1 - saves` as long, on an injected clock where
    every trial runs at its own level (each trial's time times a level drawn anew, sd 0.15 on the log scale: the
    machine faster or slower for a whole trial, which no trial's own batches show); the order inside each pair of
    blocks drawn from a seeded generator; the fix predicts an iteration `predicted` as long. Their results"""
    from fastxtend_prof.tune.search import STRATEGIES, Strategy, Fix
    clock, rng, level = ManualClock(), np.random.default_rng(seed), [1.]
    sync_mode(clock)
    monkeypatch.setattr(fastxtend_prof.tune.search, 'time', SimpleNamespace(monotonic=clock, perf_counter=time.perf_counter))
    monkeypatch.setattr(fastxtend_prof.tune.search, 'pair_order', lambda: random.Random(seed))
    learn = busy_learner(item=0., compute=10e-3, spend=lambda s: clock.spend(s*level[0]), n_batches=30)
    def predict(times, ctx, allow):
        return [Fix('shorter', True, Step.FORWARD, times[Step.ITERATION]*predicted, 'the forward waits')], []
    def apply(learn, on):
        old, learn.model.compute = learn.model.compute, learn.model.compute*(1 - saves)
        return lambda: setattr(learn.model, 'compute', old)
    monkeypatch.setitem(STRATEGIES, 'shorter', Strategy(predict, apply, 'speed only', lambda v: 'a shorter forward', 'wait less'))
    monkeypatch.setattr(fastxtend_prof.tune.search, 'plan', lambda times, ctx, allow, done: (
        [] if 'shorter' in done else predict(times, ctx, allow)[0], []))
    trial = fastxtend_prof.tune.search.run_trial
    def at_its_own_level(*a, **k):
        level[0] = float(np.exp(rng.normal(0, 0.15)))
        return trial(*a, **k)
    monkeypatch.setattr(fastxtend_prof.tune.search, 'run_trial', at_its_own_level)
    out = [learn.speed_find(max_time=600, batches=20, show=False, **kw) for _ in range(searches)]
    assert learn.model.compute == 10e-3, 'the Learner was put back'
    return out

def test_a_fix_that_changes_nothing_is_kept_at_the_searchs_level(monkeypatch, sync_mode):
    """Each trial at its own level (an injected clock, so load cannot move it): the fix that changes nothing is judged in
    pairs of blocks run in turns with the best so far, so a level that the fix's trial happened to run at is the
    pairs' spread, not a gain. Judged trial against trial (the tuner before it ran fixes in turns) at `min_change` 5%,
    the fix was kept in 3 of these 12 searches, each a fix's trial at a lower level than the start's (−5%, −8% and −11%, p
    under 1e-50); in pairs, at most at the level `alpha`/2 the first fix gets (0.005: two kept of 12 has a chance under
    0.2%)"""
    res = _moving_level_searches(monkeypatch, sync_mode, 0., 12, seed=0, predicted=0.4, block=5, min_change=5)
    kept = [r for r in res if r.fixes]
    assert len(kept) <= 1, [r.verdict for r in kept]
    rows = pd.concat([r.trials[r.trials.Kind == 'shorter'] for r in res])
    assert (rows.Level == 0.005).all() and (rows.Pairs >= 4).all(), rows[['Pairs', 'Level', 'Note']]

def test_a_fix_that_saves_30_percent_is_kept_though_each_trial_runs_at_its_own_level(monkeypatch, sync_mode, capsys):
    """The same moving level, a fix that saves 30% of the forward's wait: kept every time, its interval about the
    saving it makes (the pairs take out the level), the progress line saying how it was measured"""
    res = _moving_level_searches(monkeypatch, sync_mode, 0.3, 4, seed=1, block=5)
    assert all(r.fixes for r in res), [r.text() for r in res if not r.fixes]
    for r in res:
        row = r.trials[r.trials.Kind == 'shorter'].iloc[0]
        assert row['CI Low %'] < -25 < row['CI High %'] or -40 < row['Change %'] < -20, r.text()
    out = ' '.join(capsys.readouterr().out.split())
    assert re.search(r'kept \(\d+ pairs of 5-batch blocks; the best so far \S+ \S+ a batch beside it\)', res[0].trials.Note.iloc[1]) and 'against the best so far' in res[0].text(), res[0].text()
    assert out == ''  # show=False

def test_blocks_pool_into_one_trial():
    """`pooled`: a later block's batches follow an earlier one's, step by step, its other fields its own (a fix's blocks in
    turns are one row, one profile for the plan); a step only the later block timed, or one kept as a summary, stays its"""
    from fastxtend_prof.tune.search import pooled
    from fastxtend_prof.core.saved import SavedProfile
    from fastxtend_prof.core.recorder import StepSummary
    it, fwd, loss = ('train', 'iteration'), ('train', 'forward'), ('train', 'loss')
    summary = StepSummary().update(np.array([7., 8.]))
    first = SavedProfile(pd.DataFrame(), {'num_workers': 0}, {it: np.array([1., 2.]), fwd: np.array([5.]), loss: summary}, 'first')
    again = SavedProfile(pd.DataFrame(), {'num_workers': 3}, {it: np.array([3.]), loss: np.array([4.])}, 'again')
    both = pooled(first, again)
    assert both.distributions[it].tolist() == [1., 2., 3.] and both.distributions[loss].tolist() == [4.]
    assert set(both.distributions) == {it, loss} and both.metadata == {'num_workers': 3} and both.source == 'again'
    assert first.distributions[it].tolist() == [1., 2.] and again.distributions[it].tolist() == [3.], 'neither look changed'

def test_register_strategy_refuses_what_it_cannot_use(monkeypatch):
    "A name taken, a bad name, no `keep`, an unknown `changes` or `reprobe`, a setter that is not callable: refused in one line each"
    from fastxtend_prof.tune.search import STRATEGIES, Strategy, register_strategy, allowed
    monkeypatch.setattr(fastxtend_prof.tune.search, 'STRATEGIES', dict(STRATEGIES))
    ok = Strategy(lambda t, c, a: ([], []), lambda learn, v: (lambda: None), 'speed only', str, 'keep it')
    for kind, s, msg in (('num_workers', ok, 'a strategy already'), ('not a name', ok, 'identifier'), ('mine', replace(ok, keep=''), '`keep`'),
                         ('mine', replace(ok, changes='speed'), '`changes`'), ('mine', replace(ok, reprobe='all'), '`reprobe`'),
                         ('mine', replace(ok, apply=3), '`apply`'), ('mine', 'a strategy', 'is a `Strategy`')):
        with pytest.raises((ValueError, TypeError), match=msg): register_strategy(kind, s)
    assert 'mine' not in fastxtend_prof.tune.search.STRATEGIES and 'mine' not in allowed()
    register_strategy('mine', replace(ok, changes='numerics'))
    assert allowed()[-1] == 'mine'  # `allow` takes a registered fix that changes the numerics
    register_strategy('num_workers', replace(fastxtend_prof.tune.search.STRATEGIES['num_workers'], keep='mine'), overwrite=True)

def test_a_fix_is_an_entry_of_the_strategy_table_and_each_trial_goes_to_the_record(tmp_path, monkeypatch, sync_mode):
    """A strategy added to `STRATEGIES` is planned, tried, kept and undone like the built-in ones: here the forward
    spends 40 ms, and the entry makes it a tenth. On an injected clock that the trials' profiles and the tuner share,
    so the gain is what the entry made, whatever the load (on the real clock a 40 ms sleep cut to 4 came out -23%, p 0.15,
    in a CI run: the loop's own work grew to 30-50 ms a batch under load). The record gets a line per fix measured,
    predicted against measured, and `calibration` reads it"""
    from fastxtend_prof.tune.search import STRATEGIES, Strategy, Fix, calibration
    clock = ManualClock()
    sync_mode(clock)
    monkeypatch.setattr(fastxtend_prof.tune.search, 'time', SimpleNamespace(monotonic=clock, perf_counter=time.perf_counter))
    learn = busy_learner(item=0., compute=40e-3, spend=clock.spend, n_batches=30)
    def predict(times, ctx, allow):
        f = times[Step.FORWARD]
        return [Fix('sleep_less', True, Step.FORWARD, times[Step.ITERATION] - 0.9*f, 'the forward sleeps')], []
    def apply(learn, on):
        m = learn.model
        old = m.compute
        m.compute = old/10
        def undo(): m.compute = old
        return undo
    monkeypatch.setitem(STRATEGIES, 'sleep_less', Strategy(predict, apply, 'speed only', lambda v: 'a shorter sleep', 'sleep less'))
    record = tmp_path/'record.csv'
    monkeypatch.setenv('FASTXTEND_PROF_SPEED_RECORD', str(record))
    res = learn.speed_find(max_time=60, batches=20, show=False)
    assert [f.kind for f in res.fixes][:1] == ['sleep_less'] and learn.model.compute == 40e-3, res.text()
    assert 'a shorter sleep: on; to keep it, sleep less' in res.apply_text(), res.apply_text()
    rec = pd.read_csv(record)  # a line per fix measured (on a busy machine the loader's wait may get a trial of workers too)
    assert len(rec) == len(res.trials) - 1 and list(rec.fix) == list(res.trials.Change[1:]) and list(rec.kind) == list(res.trials.Kind[1:])
    mine, row = rec[rec.kind == 'sleep_less'].iloc[0], res.trials.set_index('Kind').loc['sleep_less']
    assert mine.fix == 'a shorter sleep' and mine.kept and mine.predicted_s == pytest.approx(row.Predicted) and mine.measured_s == pytest.approx(row.Mean)
    assert mine.error_pct == pytest.approx(100*(row.Mean/row.Predicted - 1)) and mine.median_s == pytest.approx(row.Median)
    again = learn.speed_find(max_time=60, batches=20, show=False, record=record)  # appended, one header
    cal = calibration(record)
    assert cal['fixes'] == len(res.trials) + len(again.trials) - 2 and cal['worst_abs_error_pct'] >= cal['median_abs_error_pct'] >= 0, cal
    assert cal['by_kind']['sleep_less']['fixes'] >= 2 and len(cal['by_kind']['sleep_less']['range']) == 2, cal
    # no record before the first search: no range (no machine's stands for another's); with 5 fixes of the kind in the
    # record, each trial's prediction is shown with the range its record's trials landed in
    assert res.trials['Predicted Low'].isna().all(), res.trials
    from fastxtend_prof.tune.search import record_ranges
    rec = pd.read_csv(record)
    pd.concat([rec] + [rec[rec.kind == 'sleep_less'].iloc[:1]]*5).to_csv(record, index=False)
    ranges = record_ranges(record)
    assert 'sleep_less' in ranges, ranges
    third = learn.speed_find(max_time=60, batches=20, show=False, record=record)
    t = third.trials[third.trials.Kind == 'sleep_less']
    assert ((t['Predicted Low'] < t.Predicted) & (t.Predicted < t['Predicted High'])).all(), t
    assert t['Predicted Low'].iloc[0] == pytest.approx(t.Predicted.iloc[0]*ranges['sleep_less'][0]), (t, ranges)
    from fastxtend_prof.core.fmt import format_duration
    assert f"{format_duration(t['Predicted Low'].iloc[0])} to {format_duration(t['Predicted High'].iloc[0])}" in third.text(), third.text()
    for text in ('', 'a,b\n1,2\n', '\x00\xff garbage'):
        (tmp_path/'bad.csv').write_text(text, encoding='latin-1')
        with pytest.raises(ValueError, match='not a speed_find record'): calibration(tmp_path/'bad.csv')

def test_a_trial_is_predicted_and_shown_by_its_mean(tmp_path):
    """Workers far ahead hand over their batches in bursts: most batches take the hand-over alone, one waits for the
    next burst, and the throughput is the mean (4 workers on items sleeping 10 ms measured a median of 5.6 ms a batch and
    a mean of 21.4). A trial's error and predicted change, the table, the verdict and the record say the mean; the
    record keeps the median beside it"""
    from fastxtend_prof.tune.search import _measured, _row, _verdict, _KEY, Fix, SpeedResult, TRIAL_COLS, TuneContext, append_record
    from fastxtend_prof.verdicts.stats import CHANGE, CI_LOW, CI_HIGH, P_VALUE
    from fastxtend_prof.core.fmt import format_duration
    fake = lambda d: SimpleNamespace(distributions={_KEY: np.asarray(d)}, metadata={'batch_size': 8},
                                     results=pd.DataFrame(columns=['Phase', 'Step']))
    start, burst = _measured(fake([0.08]*8)), _measured(fake([0.002]*7 + [0.074]))  # a burst of 7, then a wait: mean 11 ms, median 2 ms
    assert burst['Median'] == pytest.approx(0.002) and burst['Mean'] == pytest.approx(0.011)
    f = Fix('num_workers', 8, Step.WAIT, 0.011)
    rows = [_row(0, None, start, {}, False, 'the configuration as it was', 1.),
            _row(1, f, burst, {CHANGE: -86., CI_LOW: -90., CI_HIGH: -80., P_VALUE: 1e-6}, True, 'kept', 1., start['Mean'])]
    assert rows[1]['Error %'] == pytest.approx(0, abs=1e-9) and rows[1]['Predicted %'] == pytest.approx(100*(0.011/0.08 - 1))
    res = SpeedResult(pd.DataFrame(rows).reindex(columns=list(TRIAL_COLS)).astype({'Accepted': bool}), [f],
                      _verdict(rows, [f], {}), start=TuneContext(bs=8))
    assert f'train iteration {format_duration(0.08)} → {format_duration(0.011)} a batch on average' in res.verdict, res.verdict
    table = res.text(200).splitlines()
    head = next(l for l in table if l.startswith('#'))
    row = re.split(r'\s{2,}', next(l for l in table if l.startswith('1 ')).strip())  # #, change, predicted, mean, ...
    assert re.split(r'\s{2,}', head)[3] == 'Mean' and row[3] == format_duration(0.011), res.text(200)
    rec = pd.read_csv(append_record(res, tmp_path/'record.csv'))
    assert (rec.measured_s.iloc[0], rec.median_s.iloc[0], rec.error_pct.iloc[0]) == (pytest.approx(0.011), pytest.approx(0.002), pytest.approx(0, abs=1e-6))

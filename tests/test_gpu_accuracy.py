"""Device-true accuracy on a real CUDA GPU (marked `gpu`; skipped where torch sees no CUDA device).

Every step of a fastai fit queues a known amount of GPU work: a `torch.cuda._sleep` kernel whose length is calibrated
against CUDA events before the fit (forward 8 ms, loss 3 ms, backward 12 ms, optimizer step 5 ms, zero_grad 2 ms; the
valid loop's predict and loss the same). The model itself is one tiny linear layer, so the sleeps are nearly all the
device's work. On the host these steps only *launch* the kernels, which takes microseconds.

- `sync='events'` (what `'auto'` picks on a GPU) and `sync='device'` must report every step within 5% or 0.3 ms of its
  known GPU work, whichever is larger; `'device'` may also add up to 1 ms of the host's launch latency, which it times
  because it starts each step on an idle GPU (measured on an H100: backward 12.6 ms for 12.0 ms of work).
- `sync='none'` times the host only: it is expected to miss the GPU work (each step well under half of it), and the
  profiler's own advice says so (`host_timing`). The test asserts that miss, so the limitation stays documented.
"""
import statistics
import pytest, torch
from torch import nn
import torch.nn.functional as F
from fastai.data.core import DataLoaders
from fastai.learner import Learner
from fastai.optimizer import SGD
from fastai.callback.progress import ProgressCallback
import fastxtend_prof.all  # noqa: F401  (adds Learner.profile)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device; this machine has none')]

WORK_MS = dict(forward=8., loss=3., backward=12., opt_step=5., zero_grad=2.)
N_TRAIN, N_VALID, BS, EPOCHS = 12, 6, 64, 2

def kernel_ms(cycles:int) -> float:
    "Median device time of a `torch.cuda._sleep(cycles)` kernel, timed with CUDA events"
    times = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); torch.cuda._sleep(cycles); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)

@pytest.fixture(scope='module')
def work():
    "Per step: `(cycles, known ms)`, the cycles calibrated against CUDA events and the kernel's measured length the truth"
    torch.cuda.init(); kernel_ms(1_000_000)  # first launch, clocks up
    per_ms = 50_000_000/kernel_ms(50_000_000)
    out = {}
    for step, ms in WORK_MS.items():
        cycles = int(ms*per_ms)
        out[step] = (cycles, kernel_ms(cycles))
        assert abs(out[step][1] - ms) < 0.1*ms, (step, out[step])  # the calibration itself holds
    return out

class _SleepGrad(torch.autograd.Function):
    "Identity whose backward queues the backward's GPU work"
    cycles = 0
    @staticmethod
    def forward(ctx, x): return x.view_as(x)
    @staticmethod
    def backward(ctx, g):
        torch.cuda._sleep(_SleepGrad.cycles)
        return g

class SleepModel(nn.Module):
    def __init__(self, cycles): super().__init__(); self.lin, self.cycles = nn.Linear(16, 16), cycles
    def forward(self, x):
        torch.cuda._sleep(self.cycles)
        return _SleepGrad.apply(self.lin(x))

def make_learner(work):
    cyc = {k: c for k, (c, _) in work.items()}
    _SleepGrad.cycles = cyc['backward']
    x = torch.randn(BS*N_TRAIN, 16); y = torch.randn(BS*N_TRAIN, 16)
    ds = list(zip(x, y))
    dls = DataLoaders.from_dsets(ds, ds[:BS*N_VALID], bs=BS, shuffle=False, drop_last=True, num_workers=0, device=torch.device('cuda'))
    def loss(pred, y):
        torch.cuda._sleep(cyc['loss'])
        return F.mse_loss(pred, y)
    learn = Learner(dls, SleepModel(cyc['forward']), loss_func=loss, opt_func=SGD, lr=1e-3)
    learn.remove_cb(ProgressCallback)
    learn.model.cuda()
    learn.create_opt()
    step, zero = learn.opt.step, learn.opt.zero_grad
    def slow_step(*a, **k): torch.cuda._sleep(cyc['opt_step']); return step(*a, **k)
    def slow_zero(*a, **k): torch.cuda._sleep(cyc['zero_grad']); return zero(*a, **k)
    learn.opt.step, learn.opt.zero_grad = slow_step, slow_zero
    return learn

def profiled(work, sync):
    learn = make_learner(work).profile(show_report=False, sync=sync)
    with learn.no_logging(): learn.fit(EPOCHS)
    torch.cuda.synchronize()
    return learn

# `sync='device'` starts every step on an idle GPU, so the host's work before the step's first kernel counts too: on an
# H100, backward +0.6 ms (autograd hands the Python Function's backward to its device thread), loss +0.1 ms
LATE = dict(events=0., auto=0., device=1e-3)
STEPS = [('train', 'forward', 'forward'), ('train', 'loss', 'loss'), ('train', 'backward', 'backward'),
         ('train', 'opt_step', 'opt_step'), ('train', 'zero_grad', 'zero_grad'), ('valid', 'predict', 'forward'), ('valid', 'loss', 'loss')]

@pytest.mark.parametrize('sync', ['events', 'device', 'auto'])
def test_device_modes_see_each_steps_gpu_work(work, sync):
    learn = profiled(work, sync)
    assert learn.profile_result.sync == ('events' if sync == 'auto' else sync)
    r = learn.simple_profile_results.set_index(['Phase', 'Step'])
    for phase, step, key in STEPS:
        known, got = work[key][1]/1e3, r.loc[(phase, step), 'Mean Duration']
        print(f'sync={sync:6} {phase:5} {step:9} known {known*1e3:6.3f} ms  measured {got*1e3:6.3f} ms')
        tol = max(0.05*known, 3e-4)
        assert -tol <= got - known <= tol + LATE[sync], (phase, step, got, known)
        n = (N_TRAIN if phase == 'train' else N_VALID) - 1
        assert r.loc[(phase, step), 'Number of Calls'] == EPOCHS*n
    for phase in ('train', 'valid'):   # the partition holds on the device too
        top = r.loc[phase][r.loc[phase].index.isin(['draw', 'batch', 'other', 'warmup'])]['Total Time'].sum()
        assert top == pytest.approx(r.loc[('fit', phase), 'Total Time'], rel=0.02)

def test_host_timing_misses_the_gpu_work_and_says_so(work):
    "Expected: `sync='none'` sees only the kernel launches; the GPU's time lands wherever the host next waits"
    learn = profiled(work, 'none')
    r = learn.simple_profile_results.set_index(['Phase', 'Step'])
    for phase, step, key in STEPS:
        assert r.loc[(phase, step), 'Mean Duration'] < 0.5*work[key][1]/1e3, (phase, step)
    assert 'host_timing' in {a.rule for a in learn.profile_result.advice}

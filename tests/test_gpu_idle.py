"""Why the GPU idled, on a real CUDA GPU (marked `gpu`; skipped where torch sees no CUDA device).

Each fit is built from known work: GPU work as `torch.cuda._sleep` kernels (calibrated against CUDA events), host work as
`time.sleep`, so what the device waits for is known:

- a callback that calls `.item()` on the loss every batch, after a 6 ms forward and before 3 ms of host work and a 6 ms
  backward: the idle time after it is put on that callback by name, and the gain predicted for removing it holds, within
  its interval, against the same fit without the callback;
- a loader whose items sleep: the idle time is put on the draw ('data');
- a model of many tiny kernels: on launching ('launch').

The sync debug mode is the process's: the tests also check it is back off after each fit."""
import time
import pytest, torch
from torch import nn
import torch.nn.functional as F
from fastai.data.core import DataLoaders
from fastai.learner import Learner
from fastai.optimizer import SGD
from fastai.callback.core import Callback
from fastai.callback.progress import ProgressCallback
import fastxtend_prof.all  # noqa: F401  (adds Learner.profile)
from test_gpu_accuracy import kernel_ms, _SleepGrad, SleepModel  # the known GPU work: a forward and a backward of `_sleep` kernels

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device; this machine has none')]

@pytest.fixture(scope='module')
def per_ms():
    "`torch.cuda._sleep` cycles a millisecond, calibrated against CUDA events"
    torch.cuda.init(); kernel_ms(1_000_000)
    return 50_000_000/kernel_ms(50_000_000)

class HostWork(Callback):
    "`s` seconds of host work at the start of the backward (after the profiler's mark), as a callback's Python would take"
    def __init__(self, s): self.s = s
    def before_backward(self): time.sleep(self.s)

class ItemLoss(Callback):
    "Reads the loss every batch: a synchronisation the GPU then idles after"
    def __init__(self): self.vals = []
    def after_loss(self):
        if self.training: self.vals.append(self.learn.loss.item())

def dls_of(n, bs=16, item_sleep=0.):
    class DS(torch.utils.data.Dataset):
        def __init__(self, n): self.x, self.y = torch.randn(n, 16), torch.randn(n, 16)
        def __len__(self): return len(self.x)
        def __getitem__(self, i):
            if item_sleep: time.sleep(item_sleep)
            return self.x[i], self.y[i]
    return DataLoaders.from_dsets(DS(n*bs), DS(4*bs), bs=bs, shuffle=False, drop_last=True, num_workers=0, device=torch.device('cuda'))

def fit(learn, **kw):
    learn.remove_cb(ProgressCallback)
    learn.model.cuda()
    learn.profile(show_report=False, idle=True, **kw)
    with learn.no_logging(): learn.fit(1)
    torch.cuda.synchronize()
    assert torch.cuda.get_sync_debug_mode() == 0  # the watch put torch's mode back
    return learn

def iteration(learn): return learn.simple_profile_results.set_index(['Phase', 'Step']).loc[('train', 'iteration'), 'Mean Duration']

def test_an_item_in_a_callback_is_named_and_its_gain_holds(per_ms):
    _SleepGrad.cycles = int(6*per_ms)
    make = lambda cbs: Learner(dls_of(41), SleepModel(int(6*per_ms)), loss_func=F.mse_loss, opt_func=SGD, lr=1e-3, cbs=cbs)
    with_item = fit(make([HostWork(3e-3), ItemLoss()]))
    without = fit(make([HostWork(3e-3)]))
    r = with_item.profile_result
    print('\n'.join(r.lines()))
    c = r.idle.causes
    top = c.iloc[0]
    assert top.Cause == 'sync' and top.Where.startswith('ItemLoss.after_loss (test_gpu_idle.py:'), c
    measured = iteration(with_item) - iteration(without)
    print(f"predicted {top.Idle*1e3:.3f} ms ({top['Gain Low']*1e3:.3f} to {top['Gain High']*1e3:.3f}), measured {measured*1e3:.3f} ms")
    assert 2.5e-3 < measured < 4.5e-3, measured  # the workload did what it should: the 3 ms of host work no longer overlap the forward
    assert top['Gain Low'] <= measured <= top['Gain High'], (measured, top.to_dict())
    assert 'gpu_idle' in {a.rule for a in r.advice} and any('ItemLoss.after_loss' in a.verdict for a in r.advice)
    assert not any(w.startswith('ItemLoss') for w in without.profile_result.idle.causes.Where)

def test_a_sleeping_loader_puts_the_idle_on_the_draw(per_ms):
    _SleepGrad.cycles = int(0.5*per_ms)
    learn = fit(Learner(dls_of(21, item_sleep=5e-4), SleepModel(int(0.5*per_ms)), loss_func=F.mse_loss, opt_func=SGD, lr=1e-3))
    c = learn.profile_result.idle.causes
    print(learn.profile_result.lines()[-1])
    assert c.iloc[0].Cause == 'data' and c.iloc[0].Share > 0.5, c

class Tiny(nn.Module):
    "One small layer applied 300 times: hundreds of kernels of a few µs each, two parameters"
    def __init__(self): super().__init__(); self.lin = nn.Linear(16, 16)
    def forward(self, x):
        for _ in range(300): x = torch.tanh(self.lin(x))
        return x

def test_many_tiny_kernels_put_the_idle_on_launching():
    learn = fit(Learner(dls_of(21), Tiny(), loss_func=F.mse_loss, opt_func=SGD, lr=1e-3))
    c = learn.profile_result.idle.causes
    print(learn.profile_result.lines()[-1])
    assert c.iloc[0].Cause == 'launch', c

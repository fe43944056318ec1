"""The GPU's activity and energy (`learn.profile(hardware=True)`): on a CPU through a fake NVML reader (300 W, GPM at
known values, its energy counter moving with the host's clock), and on a real NVIDIA GPU (marked `gpu`)."""
import math, time
import pytest, torch
from torch import nn
from fastai.learner import Learner
from fastai.data.core import DataLoaders
from fastai.callback.core import Callback
from fastai.callback.progress import ProgressCallback
import fastxtend_prof.all  # noqa: F401
from conftest import cpu_learner
from fastxtend_prof.features import hardware

class FakeNvml:
    "A GPU drawing 300 W whose GPM metrics read 40%: energy from the host clock, so load on the machine cannot change it"
    def __init__(self, gpm=True): self.name, self.gpm, self.t0, self.live = 'Fake GPU', gpm, time.perf_counter(), set()
    def energy(self): return 300*(time.perf_counter() - self.t0)
    def sample(self):
        if not self.gpm: return None
        s = object(); self.live.add(s); return s
    def metrics(self, a, b): self.live.discard(a); return {c: 40. for c in hardware.GPM_METRICS}
    def free(self, s): self.live.discard(s)

class Wait(Callback):
    def __init__(self, s): self.s = s
    def before_batch(self): time.sleep(self.s)

def fit(monkeypatch, epochs, wait, gpm=True, batches=20, **kw):
    fake = FakeNvml(gpm)
    monkeypatch.setattr(hardware, 'open_device', lambda device: (fake, ''))
    x = torch.randn(8*batches, 4)
    dls = DataLoaders.from_dsets(list(zip(x, x[:, :1])), list(zip(x[:16], x[:16, :1])), bs=8, num_workers=0, device='cpu')
    learn = Learner(dls, nn.Linear(4, 1), loss_func=nn.MSELoss(), cbs=Wait(wait))
    learn.remove_cb(ProgressCallback)
    learn.profile(hardware=dict(every=0.05), show_report=False, **kw)
    with learn.no_logging(): learn.fit(epochs)
    return learn, fake

def test_energy_and_activity_per_epoch(monkeypatch):
    learn, fake = fit(monkeypatch, 2, 0.06)  # 22 batches of 60 ms: epochs of about 1.3 s
    w = learn.profile_result.hardware.windows
    assert list(w.Epochs) == ['0', '1'] and (w.Seconds >= 1).all(), w
    assert w['Power W'].to_numpy() == pytest.approx(300, rel=0.02)
    assert w['Samples'].tolist() == [176., 176.] and w['Samples/J'].to_numpy() == pytest.approx(176/w['Energy J'].to_numpy())
    assert w['SM Active %'].tolist() == [40., 40.]
    assert not fake.live  # every GPM sample freed
    text = learn.profile_result.lines()[-1]
    assert text.startswith('GPU activity and energy on cpu (Fake GPU)') and 'SM active' in text

def test_short_epochs_make_windows_of_at_least_a_second_and_no_gpm_says_so(monkeypatch):
    # epochs of 6 batches of 20 ms (0.12 s; a second only past 170 ms a batch, 3.7x the 46 ms a CI run under load took, when
    # epochs of 22 batches lasted a second each)
    learn, _ = fit(monkeypatch, 12, 0.02, gpm=False, batches=5)
    p = learn.profile_result.hardware
    assert (p.windows.Seconds >= 1).all() and '-' in p.windows.Epochs.iloc[0], p.windows  # several epochs a window
    ends = [e.split('-') for e in p.windows.Epochs]
    assert ends[0][0] == '0' and ends[-1][-1] == '11' and all(int(a[-1]) + 1 == int(b[0]) for a, b in zip(ends, ends[1:]))  # every epoch once
    assert math.isnan(p.windows['SM Active %'].iloc[0])
    assert 'GPM metrics (SM and tensor-core activity) not available on this GPU' in learn.profile_result.lines()[-1]

def test_on_a_cpu_it_says_in_one_line_that_it_needs_a_gpu():
    learn = cpu_learner()
    learn.profile(hardware=True, show_report=False)
    with learn.no_logging(): learn.fit(1)
    assert learn.profile_result.lines()[-1] == 'GPU activity and energy: not read (needs an NVIDIA GPU: the model trains on the cpu).'

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device; this machine has none')
def test_on_a_gpu_energy_and_gpm_are_read():
    class MatMuls(Callback):
        def before_batch(self):
            a = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16)
            for _ in range(20): a = a @ a; a = a/a.norm()
    x = torch.randn(8*60, 4)
    dls = DataLoaders.from_dsets(list(zip(x, x[:, :1])), list(zip(x[:16], x[:16, :1])), bs=8, num_workers=0, device='cuda')
    learn = Learner(dls, nn.Linear(4, 1).cuda(), loss_func=nn.MSELoss(), cbs=MatMuls())
    learn.remove_cb(ProgressCallback)
    learn.profile(hardware=True, show_report=False)
    t = time.perf_counter()
    with learn.no_logging(): learn.fit(3)
    print(f'fit {time.perf_counter() - t:.1f} s'); print(learn.profile_result.lines()[-1])
    p = learn.profile_result.hardware
    assert p is not None and len(p.windows) and (p.windows.Seconds >= 1).all(), p
    assert (p.windows['Power W'] > 30).all() and (p.windows['Power W'] < 2000).all()
    major = torch.cuda.get_device_capability()[0]
    if major >= 9: assert p.gpm and (p.windows['SM Active %'] > 5).all() and (p.windows['Tensor Active %'] > 1).all(), p.windows

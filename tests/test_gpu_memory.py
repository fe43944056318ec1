"""Memory per step on a real CUDA GPU (marked `gpu`; skipped where torch sees no CUDA device).

The forward of a tiny model allocates a known tensor (64 MiB) and keeps it until the batch ends: the forward's peak
and its change must grow by that against a run without it, to 4 KiB (the caching allocator rounds large blocks to
2 MiB, and 64 MiB is a multiple; fastai's own small tensors come and go), the fit's peak too, and the report must name
the device and its capacity."""
import gc
import pytest, torch
from torch import nn
import torch.nn.functional as F
from fastai.basics import Learner, DataLoaders, SGD, Callback
from fastai.callback.progress import ProgressCallback
import fastxtend_prof.all  # noqa: F401  (adds Learner.profile)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device; this machine has none')]

SIZE = 64*2**20
N_TRAIN, BS = 12, 64

class Holder(nn.Module):
    "A linear layer whose forward allocates `size` bytes on the device, kept (in `kept`) until the batch ends"
    def __init__(self, size): super().__init__(); self.lin, self.size, self.kept = nn.Linear(8, 1), size, None
    def forward(self, x):
        if self.size: self.kept = torch.empty(self.size, dtype=torch.uint8, device=x.device)
        return self.lin(x).view(-1)

class Release(Callback):
    order = 100  # after the profiler's marks: the tensor lives through every step of the batch
    def after_batch(self): self.learn.model.kept = None

def fit(size, **kw):
    gc.collect()  # what earlier tests left in reference cycles (Learners and their tensors) goes before this fit, not during it
    x = torch.randn(BS*N_TRAIN, 8); y = x.sum(1)
    dls = DataLoaders.from_dsets(list(zip(x, y)), list(zip(x[:BS*2], y[:BS*2])), bs=BS, num_workers=0, device=torch.device('cuda'))
    learn = Learner(dls, Holder(size), loss_func=F.mse_loss, opt_func=SGD, lr=1e-3, cbs=[Release()])
    learn.remove_cb(ProgressCallback)
    learn.profile(**{'show_report': False, 'memory': dict(every=1), **kw})
    with learn.no_logging(): learn.fit(1)
    return learn

@pytest.fixture(scope='module')
def runs():
    torch.cuda.init(); fit(0)  # the first fit pays the context, cuBLAS's workspace and the allocator's first blocks
    base = fit(0).profile_result  # the result alone: a Learner kept alive keeps fastai's small tensors on the device
                                  # (2,560 bytes on an H100), which would sit under the next fit's peaks
    return base, fit(SIZE).profile_result

def test_forward_peak_and_change_show_the_tensor(runs):
    base, big = (r.results.set_index(['Phase', 'Step']) for r in runs)
    for col in ('Peak Memory', 'Memory Change'):  # within 4 KiB: fastai's small tensors (a loss, 512-byte blocks) come and go with
        grew = big.loc[('train', 'forward'), col] - base.loc[('train', 'forward'), col]  # Python's collector (H100: 512 B)
        assert abs(grew - SIZE) <= 4096, (col, grew)
    assert abs(big.loc[('fit', 'fit'), 'Peak Memory'] - base.loc[('fit', 'fit'), 'Peak Memory'] - SIZE) <= 4096

def test_report_names_the_device_and_capacity(runs):
    prof = runs[1].memory
    assert prof.device.startswith('cuda') and prof.model == torch.cuda.get_device_name()
    assert prof.capacity == torch.cuda.get_device_properties(0).total_memory
    assert prof.fit_peak >= SIZE

def test_memory_off_reads_nothing():
    learn = fit(SIZE, memory=False)
    assert 'Peak Memory' not in learn.simple_profile_results and learn.profile_result.memory is None

class Linear(nn.Module):
    def __init__(self, d): super().__init__(); self.lin = nn.Linear(d, 1)
    def forward(self, x): return self.lin(x).view(-1)

def test_transfer_row_shows_the_batch():
    """A fastai loader moves each batch to the GPU inside the draw: the `transfer` row's peak stands the batch's size above
    the loader's wait. Its change is zero: fastai lets the previous batch go when it splits the new one into `xb` and `yb`,
    after the transforms and before `before_batch`, so from the second batch on the new batch replaces the old one."""
    d = 1024
    x, y = torch.randn(BS*N_TRAIN, d), torch.randn(BS*N_TRAIN)
    dls = DataLoaders.from_dsets(list(zip(x, y)), list(zip(x[:BS*2], y[:BS*2])), bs=BS, num_workers=0, device=torch.device('cuda'))
    learn = Learner(dls, Linear(d), loss_func=F.mse_loss, opt_func=SGD, lr=1e-3)
    learn.remove_cb(ProgressCallback)
    learn.profile(show_report=False, memory=dict(every=1))
    with learn.no_logging(): learn.fit(1)
    r = learn.simple_profile_results.set_index(['Phase', 'Step'])
    batch = BS*d*4 + 512  # x, float32; y's 256 bytes take the allocator's smallest block, 512
    grew = r.loc[('train', 'transfer'), 'Peak Memory'] - r.loc[('train', 'wait'), 'Peak Memory']
    assert abs(grew - batch) <= 1024, r.loc[('train', ['wait', 'transfer'])]
    assert r.loc[('train', 'transfer'), 'Memory Change'] == r.loc[('train', 'draw'), 'Memory Change'] == 0

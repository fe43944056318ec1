"""FLOPs and MFU on a real CUDA GPU (marked `gpu`; skipped where torch sees no CUDA device).

A matmul-heavy model (three 4,096² Linear layers, batches of 4,096) trains under fastai's bf16 `MixedPrecision`: its
FLOPs per batch are the formula's, the type read is bf16, the forward's MFU against the measured bf16 peak is between
0.3 and 1.2, and, on a device in the datasheet table, the datasheet MFU is below the measured-peak MFU (no device beats
its datasheet) and above 0.1. Device time (`sync='events'`) is what the FLOP/s divide by; FLOPs are opt-in (`flops=True`)."""
import pytest, torch
from torch import nn
import torch.nn.functional as F
from fastai.basics import Learner, DataLoaders, SGD
from fastai.callback.fp16 import MixedPrecision
from fastai.callback.progress import ProgressCallback
import fastxtend_prof.all  # noqa: F401  (adds Learner.profile)
from fastxtend_prof.features.flops import datasheet_peak
from conftest import row

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device; this machine has none')]
D, BS, N = 4096, 4096, 12

def test_bf16_matmul_model_mfu():
    x = torch.randn(BS*N, D); y = torch.randn(BS*N, D)
    dls = DataLoaders.from_dsets(list(zip(x, y)), list(zip(x[:BS], y[:BS])), bs=BS, num_workers=0, device=torch.device('cuda'))
    model = nn.Sequential(*[nn.Linear(D, D, bias=False) for _ in range(3)])
    learn = Learner(dls, model, loss_func=F.mse_loss, opt_func=SGD, lr=1e-6, cbs=[MixedPrecision(amp_mode='bf16')])
    learn.remove_cb(ProgressCallback)
    learn.profile(show_report=False, sync='events', flops=True)
    with learn.no_logging(): learn.fit(1)
    prof, res = learn.profile_result.flops, learn.simple_profile_results
    assert prof.dtype == 'bf16'
    c = next(iter(prof.counts.values()))
    assert c['forward'] == 3*2*BS*D*D and c['backward'] == 2*3*2*BS*D*D - 2*BS*D*D  # no input gradient for the first layer
    fwd = row(res, 'train', 'forward')
    print(f"{prof.device_name}: forward {fwd['FLOP/s']/1e12:.0f} TFLOP/s, measured peak {prof.measured_peak/1e12:.0f}, "
          f"datasheet {prof.datasheet_peak/1e12:.0f}: MFU {fwd['MFU']:.0%} of measured, {fwd['Datasheet MFU']:.0%} of datasheet")
    assert 0.3 <= fwd['MFU'] <= 1.2
    if datasheet_peak(prof.device_name, 'bf16')[0] == datasheet_peak(prof.device_name, 'bf16')[0]:
        assert 0.1 <= fwd['Datasheet MFU'] <= fwd['MFU']

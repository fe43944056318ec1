"""Memory per step through a real fastai fit, on a CPU, through the seam the timing modes also have: `make_memory` is
replaced by a `FakeMemory` that the model, the loss, the backward and the optimizer move by known amounts. Checks the
memory columns of the results, the fit's peak, sampling every few batches, the report's block, the advice, the files
and the loggers' summary values; and that on a CPU without the seam nothing is tracked and the report says so."""
import json
import pytest, torch
from torch import nn
import torch.nn.functional as F
from fastai.basics import Learner, DataLoaders, SGD
from fastai.callback.progress import ProgressCallback
import fastxtend_prof.all  # noqa: F401  (adds Learner.profile)
from fastxtend_prof.features import memory
from fastxtend_prof.features.memory import memory_stats
from fastxtend_prof.profiler.testing import FakeMemory
from fastxtend_prof.features.loggers import summary_values

KiB = 1024
RESIDENT, ACT, LOSS, GRAD, STATE, TMP = 100*KiB, 64*KiB, 4*KiB, 16*KiB, 32*KiB, 8*KiB
N_TRAIN, N_VALID, BS = 12, 4, 8

class _Grad(torch.autograd.Function):
    "Moves the fake allocator as a backward does: the gradients come, the forward's activations and the loss go"
    mem = None
    @staticmethod
    def forward(ctx, x): return x.view_as(x)
    @staticmethod
    def backward(ctx, g):
        _Grad.mem.alloc(GRAD); _Grad.mem.free(ACT + LOSS)
        return g

class Model(nn.Module):
    def __init__(self, mem): super().__init__(); self.lin, self.mem = nn.Linear(1, 1), mem
    def forward(self, x):
        self.mem.alloc(ACT)
        if not self.training: self.mem.free(ACT)  # no backward in validation: the activations go at once
        return _Grad.apply(self.lin(x.view(-1, 1))).view(-1)

def learner(mem, capacity_bs=BS):
    _Grad.mem = mem
    x = torch.randn(BS*N_TRAIN); y = 2*x
    dls = DataLoaders.from_dsets(list(zip(x, y)), list(zip(x[:BS*N_VALID], y[:BS*N_VALID])), bs=BS, num_workers=0, device=torch.device('cpu'))
    def loss(p, t):
        mem.alloc(LOSS)
        if not torch.is_grad_enabled(): mem.free(LOSS)
        return F.mse_loss(p, t)
    learn = Learner(dls, Model(mem), loss_func=loss, opt_func=SGD, lr=1e-3)
    learn.remove_cb(ProgressCallback)
    learn.create_opt()
    step, zero, first = learn.opt.step, learn.opt.zero_grad, [True]
    def slow_step(*a, **k):
        if first[0]: mem.alloc(STATE); first[0] = False  # the optimizer's state, allocated at its first step and kept
        mem.alloc(TMP); mem.free(TMP)  # a temporary: in the step's peak, not in its change
        return step(*a, **k)
    def slow_zero(*a, **k):
        mem.free(GRAD)
        return zero(*a, **k)
    learn.opt.step, learn.opt.zero_grad = slow_step, slow_zero
    return learn

@pytest.fixture
def fake(monkeypatch):
    "A fake accelerator allocator behind `make_memory`, with the model resident"
    mem = FakeMemory(capacity=2*2**20, model='fake accelerator')
    mem.alloc(RESIDENT)
    monkeypatch.setattr(memory, 'make_memory', lambda memory, device: (mem, '') if memory is not False else (None, 'memory=False'))
    return mem

def fit(learn, **kw):
    learn.profile(**{'show_report': False, **kw})
    with learn.no_logging(): learn.fit(1)
    return learn

def test_memory_per_step(fake):
    learn = fit(learner(fake), memory=dict(every=1))
    r = learn.simple_profile_results.set_index(['Phase', 'Step'])
    steady = RESIDENT + STATE  # after the first step, the optimizer's state is resident too
    peak = lambda s: r.loc[('train', s), 'Peak Memory']
    change = lambda s: r.loc[('train', s), 'Memory Change']
    assert peak('forward') == steady + ACT and change('forward') == ACT
    assert peak('loss') == steady + ACT + LOSS and change('loss') == LOSS
    assert peak('backward') == steady + ACT + LOSS + GRAD and change('backward') == GRAD - ACT - LOSS
    assert peak('opt_step') == steady + GRAD + TMP and change('opt_step') == 0  # the state came in the warmup batch only
    assert peak('zero_grad') == steady + GRAD and change('zero_grad') == -GRAD
    assert change('batch') == 0 and change('draw') == 0 and change('iteration') == 0
    assert r.loc[('valid', 'predict'), 'Peak Memory'] == steady + ACT and r.loc[('valid', 'predict'), 'Memory Change'] == 0
    assert r.loc[('fit', 'fit'), 'Peak Memory'] == steady + ACT + LOSS + GRAD == learn.profile_result.memory.fit_peak
    assert r.loc[('train', 'iteration'), 'Memory Batches'] == N_TRAIN
    assert learn.profile_result.memory.capacity == 2*2**20

def test_sampled_every_few_batches(fake):
    learn = fit(learner(fake), memory=dict(every=5))
    r = learn.simple_profile_results.set_index(['Phase', 'Step'])
    assert r.loc[('train', 'forward'), 'Memory Batches'] == len(range(0, N_TRAIN, 5))
    assert r.loc[('valid', 'predict'), 'Memory Batches'] == len(range(0, N_VALID, 5))
    assert r.loc[('fit', 'fit'), 'Peak Memory'] == RESIDENT + STATE + ACT + LOSS + GRAD   # the peak still counts every batch
    reads = fake.reads
    fit(learner(fake), memory=dict(every=1))
    assert fake.reads - reads > 3*reads, 'the batches in between read nothing'

def test_report_advice_files_and_loggers(fake, tmp_path, capsys):
    learn = learner(fake)
    learn.path = tmp_path
    fit(learn, show_report=True, plain=True, save_json=True, save_csv=True)
    out = capsys.readouterr().out
    assert 'Memory on cpu (fake accelerator): fit peak 216 KiB of 2 MiB (11%)' in out and 'train/backward' in out
    adv = {a.rule: a for a in learn.profile_result.advice}
    assert 'memory_headroom' in adv and adv['memory_headroom'].evidence['batch_size'] == BS
    doc = json.loads((tmp_path/'simple_profile.json').read_text())
    rows = {(d['Phase'], d['Step']): d for d in doc['results']}
    assert rows[('train', 'backward')]['Peak Memory'] == RESIDENT + STATE + ACT + LOSS + GRAD
    assert doc['metadata']['memory'] == dict(device='cpu', model='fake accelerator', capacity_bytes=2*2**20,
                                             fit_peak_bytes=RESIDENT + STATE + ACT + LOSS + GRAD, every=10)
    assert 'Peak Memory' in (tmp_path/'simple_profile.csv').read_text().splitlines()[0]
    vals = summary_values(learn.simple_profile_results)
    assert vals['profile/fit/fit_peak_memory_bytes'] == RESIDENT + STATE + ACT + LOSS + GRAD

def test_near_capacity_names_the_step(fake):
    fake.cap = RESIDENT + STATE + ACT + LOSS + GRAD + 1024  # the fit peaks within 1 KiB of the device's memory
    learn = fit(learner(fake), memory=dict(every=1))
    a, = [a for a in learn.profile_result.advice if a.rule == 'memory_near_capacity']
    assert a.evidence['step'] == 'backward' and 'GradientAccumulation' in a.suggestion

def test_memory_off(fake, capsys):
    "`memory=False` switches the feature off: the allocator is never read, and (unlike a cpu, where it ran and found nothing) no line says so"
    learn = fit(learner(fake), memory=False, show_report=True, plain=True)
    assert 'Peak Memory' not in learn.simple_profile_results and learn.profile_result.memory is None
    assert fake.reads == 0 and 'memory' not in [f.name for f in learn.profile_result.features]
    assert not any(l.startswith('Memory') for l in capsys.readouterr().out.splitlines())

def test_cpu_without_seam_says_so(capsys):
    learn = fit(learner(FakeMemory()), show_report=True, plain=True)
    assert 'Peak Memory' not in learn.simple_profile_results and learn.profile_result.memory is None
    assert 'Memory: not tracked (the model trains on the cpu).' in capsys.readouterr().out
    with pytest.warns(UserWarning, match='memory=True: the model trains on the cpu'): fit(learner(FakeMemory()), memory=True)

@pytest.mark.parametrize('kw, msg', [(dict(memory='yes'), "`memory` must be True, False, 'auto'"), (dict(memory=dict(every=0)), '`memory` must be'),
                                     (dict(memory_every=5), r'`memory_every` is no longer an option.*`memory=dict\(every=N\)`')])
def test_bad_options_fail_at_profile(kw, msg):
    with pytest.raises(ValueError, match=msg): learner(FakeMemory()).profile(**kw)

def test_memory_stats_of_an_empty_profile():
    assert memory_stats(None).empty

def test_tensorboard_gets_the_memory_block(fake, tmp_path):
    pytest.importorskip('tensorboard')
    from fastai.callback.tensorboard import TensorBoardCallback
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    learn = learner(fake)
    learn.add_cb(TensorBoardCallback(log_dir=str(tmp_path), trace_model=False, log_preds=False))
    fit(learn, logger_callback='tensorboard')
    ea = EventAccumulator(str(tmp_path), size_guidance={'tensors': 0})
    ea.Reload()
    (text,) = ea.Tensors('simple_profile_memory/text_summary')
    assert 'Memory on cpu (fake accelerator): fit peak 216 KiB' in text.tensor_proto.string_val[0].decode()

# ---- the draw's parts: a batch copied to the device, a batch transform's temporary ------------------------------------
from fasttransform import Transform
from torch.utils.data import DataLoader as TorchDL
BATCH_BYTES, TFM_TMP = 40*KiB, 12*KiB

class OnDevice(torch.Tensor):
    "A tensor that has arrived on the device: moving it there again is torch's no-op"

def copying_tensor(mem):
    class Copying(torch.Tensor):
        "A host tensor whose move to the device allocates the batch there (in the fake allocator)"
        def to(self, *args, **kwargs):
            mem.alloc(BATCH_BYTES)
            return self.as_subclass(OnDevice).to(*args, **kwargs)
    return Copying

class TmpTfm(Transform):
    "A batch transform that needs a temporary on the device"
    order, mem = 10, None
    def encodes(self, x:torch.Tensor): return x
    def __call__(self, b, **kwargs):
        TmpTfm.mem.alloc(TFM_TMP); TmpTfm.mem.free(TFM_TMP)
        return super().__call__(b, **kwargs)

@pytest.mark.parametrize('kind', ['fastai', 'torch'])
def test_draw_parts_memory(fake, kind):
    from fastai.callback.core import Callback
    class LetGo(Callback):
        order = 100  # after the profiler's marks: the batch stays on the device until the batch ends
        def after_batch(self): fake.free(BATCH_BYTES)
    Copying, TmpTfm.mem = copying_tensor(fake), fake
    x = torch.randn(BS*N_TRAIN)
    ds = list(zip(x.as_subclass(Copying), 2*x))
    dls = (DataLoaders.from_dsets(ds, ds[:BS*N_VALID], bs=BS, num_workers=0, device=torch.device('cpu'), after_batch=[TmpTfm()]) if kind == 'fastai'
           else DataLoaders(TorchDL(ds, batch_size=BS), TorchDL(ds[:BS*N_VALID], batch_size=BS), device=torch.device('cpu')))
    learn = learner(fake)
    learn.dls = dls
    learn.add_cb(LetGo())
    r = fit(learn, memory=dict(every=1)).simple_profile_results.set_index(['Phase', 'Step'])
    assert r.loc[('train', 'transfer'), 'Memory Change'] == BATCH_BYTES
    assert r.loc[('train', 'wait'), 'Memory Change'] == 0
    assert r.loc[('train', 'draw'), 'Memory Change'] == BATCH_BYTES
    if kind == 'fastai':  # the loader moves the batch, then transforms it: the temporary comes on top of the batch
        assert r.loc[('train', 'transforms'), 'Peak Memory'] - r.loc[('train', 'wait'), 'Peak Memory'] == BATCH_BYTES + TFM_TMP
        assert r.loc[('train', 'transforms'), 'Memory Change'] == 0
    else: assert ('train', 'transforms') not in r.index

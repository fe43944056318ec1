"""The loader stages (`learn.profile(stages=True)`, nbs/34_stages): known delays show in their own rows, in the workers
when there are workers; the workers' rows account for every item the loop received; the loader, fastai and fasttransform
are as they were after the fit, also when it fails; a loader that is not fastai's is said to be unseen. Bit-identity with
the stages on is checked with the applications (`test_applications.assert_unchanged` profiles with `stages=True`) and
the observe-only cases (their `all` option).

The delays are spent two ways. On an injected clock (`stages.CLOCK`, a `ManualClock` each worker advances in its own
copy), the rows must hold them exactly: load cannot shift them. As sleeps on the real clock, each row's median must be
at least its sleep (load makes a sleep longer, never shorter) and under twice it: the row holds its own delay and none
of the others'."""
import time
import numpy as np, pytest, torch
from torch import nn
import fastai.data.load as _load
import fasttransform.transform as _ft
from fastai.vision.all import DataBlock, ImageBlock, CategoryBlock, PILImageBW, TensorImage, Transform, Resize, fa_collate, Learner
from fastai.data.core import DataLoaders
import fastxtend_prof.all  # noqa: F401  (adds Learner.profile)
from fastxtend_prof import stages
from fastxtend_prof.testing import ManualClock

DECODE, ITEM, BATCH, COLLATE = 5e-3, 10e-3, 15e-3, 20e-3  # the delays of the decoding, the item transform, the batch transform, the collation
BS, N = 8, 48  # 4 train batches (drop_last) and 2 valid batches a fit

SPEND = {0: time.sleep}  # how the delays are spent: sleeping, or advancing the injected clock

class SleepyItem(Transform):
    order = 5
    def encodes(self, x:TensorImage): SPEND[0](ITEM); return x

class SleepyBatch(Transform):
    def encodes(self, x:TensorImage): SPEND[0](BATCH); return x

def sleepy_collate(b): SPEND[0](COLLATE); return fa_collate(b)

def _digits():
    from sklearn.datasets import load_digits
    return load_digits()
DIGITS = _digits()
def decode(i): SPEND[0](DECODE); return PILImageBW.create((DIGITS.images[i]*16).astype(np.uint8))
def label(i): return DIGITS.target[i]

def learner(num_workers:int):
    dblock = DataBlock(blocks=(ImageBlock(PILImageBW), CategoryBlock), get_x=decode, get_y=label,
                       item_tfms=[Resize(8), SleepyItem()], batch_tfms=[SleepyBatch()])
    dls = dblock.dataloaders(list(range(N)), bs=BS, num_workers=num_workers, create_batch=sleepy_collate, device='cpu')
    return Learner(dls, nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))

def fit(learn, **kw):
    learn.profile(stages=True, show_report=False, **kw)
    with learn.no_logging(): learn.fit(1)
    return learn.profile_result.payload('stages').set_index(['Phase', 'Stage', 'Where'])

@pytest.fixture(params=['injected clock', 'sleeps'])
def near(request, monkeypatch):
    "How close a row must be to its delay: exactly on the injected clock; at least the sleep and under twice it on the real one"
    if request.param == 'sleeps':
        def near(got, want): assert want <= got < 2*want, f'{got*1e3:.3f} ms for a sleep of {want*1e3:.3f} ms'
        near.exact = False
        return near
    clock = ManualClock()
    monkeypatch.setattr(stages, 'CLOCK', clock)
    monkeypatch.setitem(SPEND, 0, clock.spend)
    def near(got, want): assert abs(got - want) < 1e-9, f'{got*1e3:.6f} ms on the injected clock for {want*1e3:.3f} ms'
    near.exact = True
    return near

@pytest.mark.parametrize('num_workers', [0, 2])
def test_known_delays_show_in_their_rows(num_workers, near):
    learn = learner(num_workers)
    table = fit(learn)
    assert_near = near
    where = 'main' if num_workers == 0 else 'workers'
    for phase, dl in (('train', learn.dls.train), ('valid', learn.dls.valid)):
        t = table.loc[phase]
        assert_near(t.loc[('x: decode', where), 'Median Duration'], DECODE)
        assert_near(t.loc[('after_item: SleepyItem', where), 'Median Duration'], ITEM)
        assert_near(t.loc[('item', where), 'Median Duration'], DECODE + ITEM)
        # each part of an item counted once: the fetch holds none of the decoding, and the parts' shares add up to the item
        assert t.loc[('fetch', where), 'Median Duration'] < DECODE/2
        parts = t.xs(where, level='Where')
        parts = parts[(parts.Per == 'item') & (parts.index != 'item')]
        assert 0.9 <= parts.Share.sum() <= 1 + 1e-9, parts.Share
        assert_near(t.loc[('collate', where), 'Median Duration'], COLLATE)
        assert_near(t.loc[('after_batch: SleepyBatch', 'main'), 'Median Duration'], BATCH)
        n_items = len(dl)*BS if dl.drop_last else len(dl.dataset)
        assert t.loc[('item', where), 'Number of Calls'] == n_items  # every item the loop received, once
        assert t.loc[('collate', where), 'Number of Calls'] == len(dl)
        if num_workers:
            per_worker = [t.loc[('item', f'worker {w}'), 'Number of Calls'] for w in range(num_workers)]
            assert sum(per_worker) == n_items and all(per_worker), per_worker
            assert 'main' not in t.xs('item', level='Stage').index  # items are made in the workers only
        # the share of an item's time: exactly the delays' on the injected clock; the largest part with sleeps
        share = t.loc[('after_item: SleepyItem', where), 'Share']
        if near.exact: assert share == pytest.approx(ITEM/(DECODE + ITEM), abs=1e-9)
        else: assert share == parts.Share.max()
    lines = '\n'.join(learn.profile_result.lines())
    assert 'Loader stages (train' in lines and 'Loader stages (valid' in lines and 'after_item: SleepyItem' in lines

def test_everything_is_put_back_after_a_failing_fit():
    learn = learner(2)
    before = dict(learn.dls.train.__dict__), _load._loaders, _ft.compose_tfms
    class Boom(Exception): pass
    learn.profile(stages=True, show_report=False)
    from fastai.callback.core import Callback
    class Fail(Callback):
        def after_batch(self):
            if self.iter == 1: raise Boom('a failing fit')
    with pytest.raises(Boom), learn.no_logging(): learn.fit(1, cbs=Fail())
    after = dict(learn.dls.train.__dict__), _load._loaders, _ft.compose_tfms
    assert after[1] is before[1] and after[2] is before[2]
    methods = ('create_item', 'do_item', 'create_batch', 'create_batches')
    assert {k: after[0][k] for k in methods if k in after[0]} == {k: before[0][k] for k in methods if k in before[0]}
    assert not stages._State.watched
    # and the loader still works unprofiled: plain batches, not `Timed` ones
    b = next(iter(learn.dls.train))
    assert isinstance(b, tuple) and isinstance(b[0], torch.Tensor)

def test_a_plain_pytorch_loader_is_said_unseen():
    from torch.utils.data import DataLoader, TensorDataset
    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=8), DataLoader(TensorDataset(x, y), batch_size=8))
    learn = Learner(dls, nn.Linear(4, 2), loss_func=nn.CrossEntropyLoss())
    learn.profile(stages=True, show_report=False)
    with learn.no_logging(): learn.fit(1)
    assert learn.profile_result.payload('stages') is None
    f = next(f for f in learn.profile_result.features if f.name == 'stages')
    assert 'fastai DataLoaders only' in f.why

"""The loader stages (`learn.profile(stages=True)`, nbs/34_stages): known delays show in their own rows, in the workers
when there are workers, for fastai's loaders and plain PyTorch ones; the workers' rows account for every item the loop
received; the loader, fastai, fasttransform and torch are as they were after the fit, also when it fails; persistent
workers and iterable datasets are left alone, and said to be. The queue, the first batch of each pass, the files, the
comparison of two profiles and the advice by stage. Bit-identity with the stages on is checked with the applications
(`test_applications.assert_unchanged` profiles with `stages=True`) and the observe-only cases (their `all` option).

The delays are spent two ways. On an injected clock (`stages.CLOCK`, a `ManualClock` each worker advances in its own
copy), the rows must hold them exactly: load cannot shift them, and each row holds its own delay and none of the
others'. As sleeps on the real clock, each row's median must be at least its sleep: load makes a sleep longer, never
shorter, and without bound (a 10 ms sleep took 20.8 ms at the median in a loaded CI run), so no upper bound holds.
The queue judges real time against sleeps long enough that load cannot tip it (a batch that takes 140 ms of sleeps to
make, a loop of 400 ms); the advice's prediction is checked exactly, on the injected clock. The best case is held
exactly, on the injected clock, to a run made alike with the item sleep removed; the workers it says would keep up, to
runs with 1 and 2 workers."""
import contextlib, io, time
import numpy as np, pandas as pd, pytest, torch
from torch import nn
import fastai.data.load as _load
import fasttransform.transform as _ft
from fastai.vision.all import DataBlock, ImageBlock, CategoryBlock, PILImageBW, TensorImage, Transform, Resize, fa_collate, Learner, RandomSplitter
from fastai.data.core import DataLoaders
import fastxtend_prof.all  # noqa: F401  (adds Learner.profile)
from fastxtend_prof.features import stages
from fastxtend_prof.profiler.testing import ManualClock, busy_cores

DECODE, ITEM, BATCH, COLLATE = 5e-3, 10e-3, 15e-3, 20e-3  # the delays of the decoding, the item transform, the batch transform, the collation
BS, N = 8, 48  # 4 train batches (drop_last) and 2 valid batches a fit

SPEND = {0: time.sleep}  # how the delays are spent: sleeping, or advancing the injected clock

ON = {'item': True}  # whether SleepyItem sleeps (a test turns it off)

class SleepyItem(Transform):
    order = 5
    def encodes(self, x:TensorImage):
        if ON['item']: SPEND[0](ITEM)
        return x

class SleepyBatch(Transform):
    def encodes(self, x:TensorImage): SPEND[0](BATCH); return x

def sleepy_collate(b): SPEND[0](COLLATE); return fa_collate(b)

def _digits():
    from sklearn.datasets import load_digits
    return load_digits()
DIGITS = _digits()
def decode(i): SPEND[0](DECODE); return PILImageBW.create((DIGITS.images[i]*16).astype(np.uint8))
def label(i): return DIGITS.target[i]

def learner(num_workers:int, n:int=N, model=None):
    dblock = DataBlock(blocks=(ImageBlock(PILImageBW), CategoryBlock), get_x=decode, get_y=label, splitter=RandomSplitter(seed=0),  # every valid label in train
                       item_tfms=[Resize(8), SleepyItem()], batch_tfms=[SleepyBatch()])
    dls = dblock.dataloaders(list(range(n)), bs=BS, num_workers=num_workers, create_batch=sleepy_collate, device='cpu')
    return Learner(dls, model or nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))

def fit(learn, **kw):
    learn.profile(stages=True, show_report=False, **kw)
    with learn.no_logging(): learn.fit(1)
    return learn.profile_result.payload('stages').set_index(['Phase', 'Stage', 'Where'])

@pytest.fixture(params=['injected clock', 'sleeps'])
def near(request, monkeypatch):
    "How close a row must be to its delay: exactly on the injected clock; at least the sleep on the real one (load lengthens a sleep without bound: a 10 ms one took 20.8 ms at the median in a loaded CI run)"
    if request.param == 'sleeps':
        def near(got, want): assert want <= got, f'{got*1e3:.3f} ms for a sleep of {want*1e3:.3f} ms'
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
        if near.exact: assert abs(t.loc[('fetch', where), 'Median Duration']) < 1e-9
        parts = t.xs(where, level='Where')
        parts = parts[(parts.Per == 'item') & (parts.index != 'item')]
        assert 0.9 <= parts.Share.sum() <= 1 + 1e-9, parts.Share
        assert_near(t.loc[('collate', where), 'Median Duration'], COLLATE)
        assert_near(t.loc[('after_batch: SleepyBatch', 'main'), 'Median Duration'], BATCH)
        # each pass's first batch: in the main process, BS items and their collation (the workers' own clocks don't reach it)
        assert t.loc[('first batch', 'main'), 'Number of Calls'] == 1
        if not num_workers: assert_near(t.loc[('first batch', 'main'), 'Median Duration'], BS*(DECODE + ITEM) + COLLATE)
        n_items = len(dl)*BS if dl.drop_last else len(dl.dataset)
        assert t.loc[('item', where), 'Number of Calls'] == n_items  # every item the loop received, once
        assert t.loc[('collate', where), 'Number of Calls'] == len(dl)
        if num_workers:
            per_worker = [t.loc[('item', f'worker {w}'), 'Number of Calls'] for w in range(num_workers)]
            assert sum(per_worker) == n_items and all(per_worker), per_worker
            assert 'main' not in t.xs('item', level='Stage').index  # items are made in the workers only
        # the share of an item's time: exactly the delays' on the injected clock. Not with sleeps: a loaded machine
        # stretches a 5 ms sleep past a 10 ms one often enough that their order is the load's (issue 59)
        share = t.loc[('after_item: SleepyItem', where), 'Share']
        if near.exact: assert share == pytest.approx(ITEM/(DECODE + ITEM), abs=1e-9)
    lines = ' '.join(' '.join(learn.profile_result.lines()).split())  # the lines unwrapped
    assert 'Loader stages (train' in lines and 'Loader stages (valid' in lines and 'after_item: SleepyItem' in lines
    assert ('persistent_workers' in lines) == bool(num_workers)  # the workers' start-up, paid at every pass
    if not near.exact:  # the queue, from the profile's real-clock rows: without workers the loop waits for every batch
        q = learn.profile_result.payload('stages').attrs['queue']['train']
        assert q['batches'] >= 2 and (num_workers or q['waited'] == q['batches']), q

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

class SleepyDataset(torch.utils.data.Dataset):
    "A map-style dataset whose items take `DECODE` each to read"
    def __len__(self): return N
    def __getitem__(self, i): SPEND[0](DECODE); return torch.tensor(DIGITS.images[i], dtype=torch.float32).flatten(), int(DIGITS.target[i])

def torch_learner(num_workers:int, **kw):
    from torch.utils.data import DataLoader
    mk = lambda: DataLoader(SleepyDataset(), batch_size=BS, num_workers=num_workers, collate_fn=sleepy_collate_torch, **kw)
    return Learner(DataLoaders(mk(), mk()), nn.Linear(64, 10), loss_func=nn.CrossEntropyLoss())

def sleepy_collate_torch(b): SPEND[0](COLLATE); return torch.utils.data.default_collate(b)

@pytest.mark.parametrize('num_workers', [0, 2])
def test_a_plain_pytorch_loader_shows_its_dataset_and_collation(num_workers, near):
    learn = torch_learner(num_workers)
    table = fit(learn)
    where = 'main' if num_workers == 0 else 'workers'
    for phase in ('train', 'valid'):
        t = table.loc[phase]
        near(t.loc[('dataset', where), 'Median Duration'], BS*DECODE)   # a batch's items, read one by one
        near(t.loc[('collate', where), 'Median Duration'], COLLATE)
        assert t.loc[('collate', where), 'Number of Calls'] == N//BS
        assert t.loc[('first batch', 'main'), 'Number of Calls'] == 1
    assert 'Loader stages (train: 6 batches, made in' in ' '.join(' '.join(learn.profile_result.lines()).split())
    from torch.utils.data import _utils, dataloader
    assert _utils.fetch._MapDatasetFetcher.fetch.__qualname__ == '_MapDatasetFetcher.fetch'  # torch's own, put back
    assert dataloader._MultiProcessingDataLoaderIter._next_data.__qualname__ == '_MultiProcessingDataLoaderIter._next_data'

def test_persistent_workers_and_iterable_datasets_are_left_alone():
    "Persistent workers outlive the fit with what was forked into them: left unwatched, their batches plain ever after"
    learn = torch_learner(2, persistent_workers=True)
    table = fit(learn)
    assert set(table.index.get_level_values('Where')) == {'main'}  # only the first batch, in the loop's process
    with learn.no_logging(): learn.fit(1)   # the same workers, unprofiled: plain batches
    b = next(iter(learn.dls.train))
    assert isinstance(b, list) and isinstance(b[0], torch.Tensor)
    class Stream(torch.utils.data.IterableDataset):
        def __len__(self): return 16
        def __iter__(self): return ((torch.randn(64), 1) for _ in range(16))
    from torch.utils.data import DataLoader
    learn = Learner(DataLoaders(DataLoader(Stream(), batch_size=8), DataLoader(Stream(), batch_size=8)), nn.Linear(64, 10), loss_func=nn.CrossEntropyLoss())
    learn.profile(stages=True, show_report=False)
    with learn.no_logging(): learn.fit(1)
    assert learn.profile_result.payload('stages') is None
    f = next(f for f in learn.profile_result.features if f.name == 'stages')
    assert 'iterable-style' in f.why

class SlowForward(nn.Module):
    "A model whose forward sleeps: the loop's own time, long against what the workers need to keep a batch ready"
    def __init__(self, secs): super().__init__(); self.secs, self.lin = secs, nn.Linear(64, 10)
    def forward(self, x): time.sleep(self.secs); return self.lin(x.flatten(1))

def test_the_queue_says_when_workers_keep_up():
    """A batch takes 140 ms to make (its items and collation sleep), the loop 800 ms more (a sleeping forward): two workers
    make one every 70 ms, so batches are ready when the loop asks; without workers the loop waits for each (140 ms).
    800 ms, not 150: in a loaded CI run half the batches of the 150 ms loop came about 21 ms late from the workers, over
    the bar of 10% of the iteration (19.6 ms); with 400 ms, 3 of 8 came late in a loaded run of 5 test processes (a
    median wait of 81 ms); the bar is now about 90 ms"""
    qs = {}
    for w in (0, 2):
        learn = learner(w, n=96, model=SlowForward(0.8))
        with learn.no_bar(): fit(learn)
        qs[w] = learn.profile_result.payload('stages').attrs['queue']['train']
        text = ' '.join(' '.join(learn.profile_result.lines()).split())  # the lines unwrapped
        assert 'Queue: ' + ' '.join(stages.queue_line(qs[w]).split()) in text  # the train loop's queue in words
    assert qs[0]['waited'] == qs[0]['batches'] >= 7, qs  # the loader works in the loop's own process
    assert qs[2]['waited'] <= 2 and qs[2]['batches'] == qs[0]['batches'], qs  # prefetched by the workers (a batch or two may come late on a busy machine)

def test_csv_json_and_the_comparison_carry_the_stages(tmp_path):
    "`save_csv` writes the stages beside the results; `save_json` keeps them, and a comparison of two profiles shows each stage where its run made it"
    paths = {}
    for w in (0, 2):
        learn = learner(w); learn.path = tmp_path
        learn.profile(stages=True, show_report=False, save_csv=True, csv_name=f'w{w}.csv', save_json=f'w{w}.json')
        with learn.no_logging(): learn.fit(1)
        payload = learn.profile_result.payload('stages')
        back = pd.read_csv(tmp_path/f'w{w}_stages.csv')
        assert list(back.columns) == list(payload.columns) and len(back) == len(payload)
        assert np.allclose(back['Median Duration'], payload['Median Duration'])
        paths[w] = tmp_path/f'w{w}.json'
    from fastxtend_prof.verdicts.compare import compare_profiles, comparison_text
    cmp = compare_profiles(paths[0], paths[2])
    st = cmp.attrs['stages'].set_index(['Phase', 'Stage'])
    assert st.loc[('train', 'collate'), 'Base Where'] == 'main' and st.loc[('train', 'collate'), 'New Where'] == 'workers'
    assert st.loc[('train', 'after_batch: SleepyBatch'), 'New Where'] == 'main'
    assert st.loc[('train', 'after_item: SleepyItem'), 'Base Median'] >= ITEM and st.loc[('train', 'after_item: SleepyItem'), 'New Median'] >= ITEM
    assert 'Loader stages, medians' in comparison_text(cmp, 120)

@pytest.mark.parametrize('num_workers', [0, 2])
def test_the_advice_names_the_costliest_stage_and_predicts_the_gain(num_workers, monkeypatch, sync_mode):
    """A loader whose item transform waits 10 ms an item (80 ms a batch, of 140 ms in all) makes the loop wait: the advice
    names that transform and predicts the iteration without it. Without workers everything runs in this process, on an
    injected clock that the profile and the stages share: the prediction must be exactly what a run without that wait
    measures. With two workers (each its own copy of any clock) the waits are sleeps (20 ms to decode, 40 ms in the
    transform, none in the loop): the advice must name the stage in the workers and predict a real gain. Its arithmetic
    with workers is checked exactly in 34_stages; a measured run without the wait is no check of it on a busy machine,
    where each sleep wakes late by what the other work decides, differently in the two runs (121 ms measured once
    against 90 ms ideal, 64 ms predicted when the first run's items took 768 ms a batch against 500)"""
    if num_workers == 0:
        clock = ManualClock()
        sync_mode(clock)
        monkeypatch.setattr(stages, 'CLOCK', clock)
        monkeypatch.setitem(SPEND, 0, clock.spend)
    else:  # the loop's own part kept small against what the workers take to make a batch
        for k, v in dict(DECODE=20e-3, ITEM=40e-3, BATCH=0.).items(): monkeypatch.setitem(globals(), k, v)
    learn = learner(num_workers, n=100)  # 80 train items: 10 whole batches (the items of a partial batch that `drop_last` drops are made, and waited for, all the same)
    with learn.no_bar(): fit(learn)
    adv = [a for a in learn.profile_result.advice if a.rule in ('data_bound', 'loader_stage')]
    assert [a.rule for a in adv] == ['data_bound', 'loader_stage'], learn.profile_result.advice  # right after the data-bound advice
    ev = adv[1].evidence
    rows = learn.profile_result.payload('stages')
    assert ev['stage'] == 'after_item: SleepyItem', rows[rows.Phase == 'train'].set_index(['Stage', 'Where']).iloc[:, 1:].to_string()
    assert ev['workers'] == num_workers and 'batch transform' in adv[1].suggestion
    assert BS*ITEM <= ev['stage_s_per_batch']  # exactly that on the injected clock (below)
    if num_workers:
        assert ev['iteration_s'] > 1.5*ev['iteration_without_s']  # the gain is real
        return
    exact = lambda got, want: got == pytest.approx(want, abs=1e-9)
    assert exact(ev['stage_s_per_batch'], BS*ITEM)
    assert exact(ev['iteration_s'], BS*(DECODE + ITEM) + COLLATE + BATCH) and exact(ev['iteration_without_s'], BS*DECODE + COLLATE + BATCH)
    monkeypatch.setitem(ON, 'item', False)  # the same loader without that wait
    learn = learner(num_workers, n=100)
    with learn.no_bar(): fit(learn)
    res = learn.simple_profile_results.set_index(['Phase', 'Step'])
    assert exact(ev['iteration_without_s'], res.loc[('train', 'iteration'), 'Mean Duration'])  # what it measures

class SpendingForward(nn.Module):
    "A forward that spends `secs` (`SPEND`: on the injected clock in the test below)"
    def __init__(self, secs): super().__init__(); self.lin, self.secs = nn.Linear(64, 10), secs
    def forward(self, x): SPEND[0](self.secs); return self.lin(x.flatten(1))

@pytest.mark.parametrize('forward, shown', [(0.5, True), (5., False)])
def test_the_stage_advice_shows_whatever_the_wait_share_when_a_fix_would_pay(forward, shown, monkeypatch, sync_mode):
    """On the injected clock: a loader of 140 ms a batch (80 ms of it the item transform) beside a forward of 500 ms waits
    21% of the iteration, under the data-bound advice's 30%, yet the item transform costs 12% of it: the stage advice
    comes as a note (severity info, first). Beside a forward of 5 s it would save 1.6%, under `STAGE_GAIN`: nothing"""
    clock = ManualClock()
    sync_mode(clock)
    monkeypatch.setattr(stages, 'CLOCK', clock)
    monkeypatch.setitem(SPEND, 0, clock.spend)
    learn = learner(0, n=100, model=SpendingForward(forward))
    with learn.no_bar(): fit(learn)
    rules = [a.rule for a in learn.profile_result.advice]
    assert 'data_bound' not in rules, learn.profile_result.advice
    if not shown:
        assert 'loader_stage' not in rules, learn.profile_result.advice
        return
    a = learn.profile_result.advice[0]
    assert a.rule == 'loader_stage' and a.severity == 'info' and a.evidence['stage'] == 'after_item: SleepyItem', learn.profile_result.advice
    it = BS*(DECODE + ITEM) + COLLATE + BATCH + forward
    assert a.evidence['iteration_s'] == pytest.approx(it, abs=1e-6) and a.evidence['iteration_without_s'] == pytest.approx(it - BS*ITEM, abs=1e-6)
    out = io.StringIO()
    with contextlib.redirect_stdout(out): learn.profile_result.show(plain=True)
    assert '[info] loader_stage' in out.getvalue(), out.getvalue()

def test_without_the_stages_the_data_bound_advice_names_them():
    learn = learner(0)
    learn.profile(show_report=False)
    with learn.no_logging(): learn.fit(1)
    (a,) = [a for a in learn.profile_result.advice if a.rule == 'data_bound']
    assert '`learn.profile(stages=True)`' in a.suggestion
    assert not [a for a in learn.profile_result.advice if a.rule == 'loader_stage']

def spin(s:float):
    "Compute (spin) for `s` seconds: a loader that needs its core"
    t = time.perf_counter()
    while time.perf_counter() - t < s: pass

def naps(s:float):
    """Sleep 3 × `s` seconds in 60 naps: a loader that waits, and wakes often (each wake-up waits for a core on a busy
    machine): as many wake-ups a second as 20 naps of `s`, beside a third as much of the loader's own work a second"""
    for _ in range(60): time.sleep(s/20)

@pytest.mark.parametrize('kind', ['sleeps', 'spins'])
def test_a_loader_that_waits_is_told_from_one_that_computes(kind, monkeypatch):
    """Items and collation that sleep: the workers compute a small share of the time they make batches, and more workers
    than cores can help; that spin: they need a core all along. The same, with the same share, with 4 more processes
    spinning on the machine's cores (`busy_cores`, on top of whatever else runs): what the stage did, not how long a busy
    machine made it. The sleeps are 60 naps each (1,020 wake-ups a batch of 420 ms): each wake-up waits for a core for as
    long as the load decides. Measured with CI's load and a test run beside it: sleeping 0.066 and 0.056, spinning near 1
    (quiet, then with the 4 processes). Counting those waits as work, as the share did before it was taken from the time
    the thread did not wait for a core, read the sleeping loader as 0.193 and 0.251 there, and fails here. The sleeps are
    three times the delays: at the delays themselves (20 naps each) the loader's own work, which a busy machine's shared
    caches slow as much as twofold, read 0.10 on a quiet machine and 0.20 in a loaded CI run. The spinning loader is held
    to the verdict's own bar (`stages.WAITING`, 0.5): a CI run read it at 0.79 beside its load, quiet, where the test
    asked 0.8"""
    monkeypatch.setitem(SPEND, 0, spin if kind == 'spins' else naps)
    shares = []
    for busy in (0, 4):
        with busy_cores(busy):
            learn = learner(2)
            fit(learn)
        p = learn.profile_result.payload('stages')
        shares.append(stages.compute_share(p[p.Phase == 'train'], 'workers'))
        text = ' '.join(' '.join(learn.profile_result.lines()).split())  # the lines unwrapped
        if kind == 'sleeps': assert shares[-1] < 0.15 and 'more workers than cores can help' in text, (busy, shares)
        else: assert shares[-1] > stages.WAITING and 'cores bound them' in text, (busy, shares)   # (0.79 in a CI run)
    # The sleeping loader's share is the one load would inflate (its wake-ups wait for a core): it must not move. A spinning
    # loader's is near 1 with or without the 4 processes, both above 0.8 (asserted above); in two loaded runs of the suite
    # it read 0.87 then 1.0 and 0.89 then 1.0, so their gap is not held to 0.1
    if kind == 'sleeps': assert abs(shares[0] - shares[1]) < 0.1, shares

# The best case: a loop whose forward sleeps, fed by a plain fastai DataLoader (no pipelines: its hooks are functions)
# whose items sleep `secs` each and are otherwise nearly free (in-memory tensors).
class SleepingItems(torch.utils.data.Dataset):
    "Items that sleep `secs` each (`SPEND`) while `ON['item']` (storage), else come from memory"
    def __init__(self, n, secs): self.x, self.y, self.secs = torch.randn(n, 64), torch.randint(0, 10, (n,)), secs
    def __len__(self): return len(self.x)
    def __getitem__(self, i):
        if ON['item']: SPEND[0](self.secs)
        return self.x[i], self.y[i]

class KnownForward(nn.Module):
    "A forward that sleeps (`SPEND`) the next of `sleeps` (seconds) at each call: the same known sequence in every run made alike"
    def __init__(self, sleeps): super().__init__(); self.sleeps, self.i, self.lin = list(sleeps), 0, nn.Linear(64, 10)
    def forward(self, x):
        SPEND[0](self.sleeps[self.i % len(self.sleeps)]); self.i += 1
        return self.lin(x)

def best_learner(num_workers:int, sleeps, n_train:int, item:float=5e-3):
    "Items that sleep `item` seconds each, a forward that sleeps `sleeps` in turn"
    from fastai.data.load import DataLoader as FastaiLoader
    mk = lambda n, shuffle: FastaiLoader(SleepingItems(n, item), bs=BS, shuffle=shuffle, drop_last=shuffle, num_workers=num_workers)
    return Learner(DataLoaders(mk(n_train, True), mk(2*BS, False), device='cpu'), KnownForward(sleeps), loss_func=nn.CrossEntropyLoss())

def steady(learn) -> tuple:
    "The train loop's steady batches: mean wait and mean iteration, from the profile's per-batch rows"
    wait, it = stages.waits_of(learn.profile_result)['train']
    return float(wait.mean()), float(it.mean())

def test_the_best_case_matches_a_run_without_the_item_sleep(monkeypatch, sync_mode):
    """The iteration predicted with a free loader, from a run whose items sleep 40 ms a batch, is the mean of the same run
    with the item sleep removed (its items then come from memory), and in its 95% interval. The forward sleeps a known
    sequence of 10 to 70 ms, the same in both runs. All in this process, on an injected clock that the profile and the
    stages share: each run holds its sleeps exactly, and nothing else. (On the real clock two runs at different moments
    of a loaded machine differ by what the load did in each: at a load of about 13 on 2 cores the run without the sleep
    measured 185 ms a batch, under the interval predicted from the first, from 189 ms.) Breaks it: the wait not taken off (40 ms
    too long). A plain fastai DataLoader, whose hooks are functions, not pipelines: `stages=True` failed on it before."""
    clock = ManualClock()
    sync_mode(clock)
    monkeypatch.setattr(stages, 'CLOCK', clock)
    monkeypatch.setitem(SPEND, 0, clock.spend)
    sleeps = np.random.default_rng(0).uniform(0.01, 0.07, 200)
    measured = {}
    for on in (True, False):
        monkeypatch.setitem(ON, 'item', on)
        learn = best_learner(0, sleeps, 48*BS)
        with learn.no_bar(): fit(learn)
        measured[on] = learn.profile_result.payload('stages').attrs['best']['train'], steady(learn)
    best, (wait_without, it_without) = measured[True][0], measured[False][1]
    exact = lambda got, want: got == pytest.approx(want, abs=1e-9)
    assert best['batches'] >= 40 and exact(best['measured'] - best['free'], BS*5e-3) and exact(wait_without, 0.), (best, wait_without)
    assert exact(best['free'], it_without) and best['free_low'] <= it_without <= best['free_high'], (best, it_without)
    assert best['speedup'] == pytest.approx(best['measured']/best['free'])
    assert best['speedup_low'] <= best['speedup'] <= best['speedup_high']

@pytest.fixture
def one_thread():
    """One torch thread in the loop's process: torch's pool of threads, each spinning while it waits for the others, is
    what a loaded machine stretches most (two threads on 2 cores under a load of about 9: the loop's own work 125-150 ms
    a batch beside its 100 ms sleep, and one worker then kept up)"""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

def test_the_workers_needed_are_the_fewest_that_keep_up(one_thread):
    """Items that sleep 840 ms a batch and a loop of 600 ms (a sleeping forward): with the loader free the loop would take
    about 600 ms; one worker makes a batch every 840 ms or so (the loop waits about 240 ms of 840, 29%), two every 420 ms
    (ready in time, 180 ms to spare). The count predicted from the run without workers is the fewest whose median wait is
    under 10% of the median iteration. A 600 ms loop, not 30: under load a batch from workers that keep up still costs the
    loop some milliseconds to receive, whatever the batch's own time (5 ms with 2 spinning processes on 2 cores, where a
    30 ms loop measured 13% waits with 2 and 3 workers; at a load of about 9, 14 ms of a 100 ms loop's 109; in a loaded
    test run beside other tests, 10.8% of a 200 ms loop; in a CI run, 11.7% of a 300 ms loop, about 35 ms: now half that
    share). Load also adds to each worker's core demand (a sleeping worker waits for a core when it wakes: 0.34 of its
    time under CI's load), which the prediction's cores bound absorbs: (0.34×840 + 600)/2 ms is still under the 667
    ms a loop that keeps up may take, where the loading counted whole, (840 + 600)/2, is over it for any count. The
    loop runs one torch thread (`one_thread`): with two, at a load of about 9, its own work took 125-150 ms a batch beside
    its sleep and one worker kept up. Breaks it: the loader's core share ignored (the cores bound then allows no count),
    or counting from 0 or past the fewest."""
    learn = best_learner(0, [0.6], 16*BS, item=105e-3)
    with learn.no_bar(): fit(learn)
    best = learn.profile_result.payload('stages').attrs['best']['train']
    share = {}
    for k in (1, 2):
        learn = best_learner(k, [0.6], 16*BS, item=105e-3)
        with learn.no_bar(): fit(learn)
        wait, it = stages.waits_of(learn.profile_result)['train']
        share[k] = float(np.median(wait)/np.median(it))  # a typical batch: one worker process the scheduler sets aside for a while makes a few batches late (means: 22% waits with 2 workers once, 4% in the next run)
    print(f"needed {best['needed']}, loop free {best['free']*1e3:.0f} ms, loader {best['load']*1e3:.0f} ms a batch; waits with 1 and 2 workers: {share}")
    fewest = next((k for k in (1, 2) if share[k] < stages.READY), None)  # the fewest whose typical batch was ready (`stages.READY`)
    assert best['needed'] == fewest == 2, (best, share)
    assert f"{best['needed']} workers would keep up" in stages.best_line(best)

"""Profiling data-parallel training: two gloo processes on the CPU (`torch.multiprocessing.start_processes`, the
`spawn` API with a preloaded forkserver; `num_workers=0`).

Rank 1 is made slow in `draw` on purpose (its dataset sleeps). Each route runs once per module, through the plain
route (`init_process_group` + `DistributedDataParallel`) and fastai's own (`distrib_ctx`, needs `accelerate`); the
tests read what each rank recorded. A third run makes rank 1 raise mid-fit: rank 0 must not hang.

The workers also call `gather_profile` directly after fit to check the room on its own; the end-to-end tests read
what `learn.profile()` itself gathered, printed and wrote on each rank."""
import contextlib, io, multiprocessing, os, pickle, socket, time, traceback, warnings
from datetime import timedelta
from pathlib import Path
import pytest, torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import row

WORLD, SLOW_RANK = 2, 1
BS, N_TRAIN, N_VALID = 16, 12, 2  # batches per rank and epoch
DRAW_SLEEP = 0.04  # s of extra draw per batch on the slow rank: well above what load adds to the other rank's step (25-50 ms a step under CI's load)
PG_TIMEOUT = 20  # s: the process group's own timeout (torch's collectives)
GATHER_TIMEOUT = 10  # s: how long rank 0 may wait for the other rank's profile
ALONE_TIMEOUT = 1.0  # s: rank 0 gathering alone, the other rank never reports
RUN_LIMIT = 120  # s: a run of the two processes that takes longer has hung (12-15 s on a quiet 2-core machine, 35 s under CI's load)
FAIL_AT = 3  # train batch at which the failing rank raises

# forkserver: one server process imports these once and forks every rank from that clean state, instead of each rank
# importing them anew as `spawn` does (seconds each on a small machine: DDP's first use imports torch._dynamo).
# Missing ones (accelerate) are skipped.
PRELOAD = ['fastxtend_prof.all', 'torch._dynamo', 'fastai.distributed', 'accelerate', __name__]

# ----------------------------------------------------------------------------------------------------------- workers
class _Items(torch.utils.data.Dataset):
    "Synthetic regression items; sleeps `delay` s per item (a slow disk)"
    def __init__(self, n, delay=0., seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 1, generator=g)
        self.y, self.delay = 2*self.x + 1, delay
    def __len__(self): return len(self.x)
    def __getitem__(self, i):
        if self.delay: time.sleep(self.delay)
        return self.x[i], self.y[i]

def _learner(rank, path, route):
    "A tiny regression Learner; the slow rank's items take `DRAW_SLEEP/BS` s each"
    from fastcore.basics import noop
    from fastai.data.core import DataLoaders
    from fastai.data.load import DataLoader
    from fastai.learner import Learner
    from fastai.losses import MSELossFlat
    from fastai.test_utils import RegModel
    from fastai.callback.progress import ProgressCallback
    share = WORLD if route == 'fastai' else 1  # fastai's DistributedDL splits one dataset between the ranks
    trn = _Items(N_TRAIN*BS*share, DRAW_SLEEP/BS if rank == SLOW_RANK else 0., seed=0 if share > 1 else rank)
    val = _Items(N_VALID*BS*share, seed=1)
    dls = DataLoaders(DataLoader(trn, bs=BS, shuffle=True, num_workers=0), DataLoader(val, bs=BS, num_workers=0), device='cpu')
    learn = Learner(dls, RegModel(), loss_func=MSELossFlat(), lr=1e-2, path=path)
    learn.remove_cbs([cb for cb in learn.cbs if isinstance(cb, ProgressCallback)])
    learn.logger = noop
    return learn

def _cpu_broadcast(self, t, rank):
    "fastai's `DistributedDL._broadcast` without its `.cuda()` (gloo broadcasts CPU tensors): a test-only workaround"
    t = torch.LongTensor(t)
    dist.broadcast(t, rank)
    return t.tolist()

def _fit(learn, route, rec, **kw):
    "Fit one epoch through `route`, recording stdout, warnings, the exception and the time taken in `rec`"
    buf, t0 = io.StringIO(), time.perf_counter()
    with warnings.catch_warnings(record=True) as w, contextlib.redirect_stdout(buf):
        warnings.simplefilter('always')
        try:
            with (learn.distrib_ctx(cpu=True) if route == 'fastai' else contextlib.nullcontext()): learn.fit(1, 1e-2, **kw)
        except Exception as e: rec['fit_error'] = e
    rec.update(stdout=buf.getvalue(), fit_warnings=[str(x.message) for x in w], fit_s=time.perf_counter() - t0)
    rec['own'] = getattr(learn, 'simple_profile_results', None)
    r = learn.profile_result
    rec['rank_results'] = None if r is None else r.rank_results
    return rec.get('fit_error')

def _gather(rec, name, results, **kw):
    "`gather_profile(results, **kw)` as `fit_ended` will call it, recording what this rank gets and sees"
    from fastxtend_prof.features.distributed import gather_profile, straggler_advice, format_merged
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        g = gather_profile(results, **kw)
    out = dict(s=time.perf_counter() - t0, warnings=[str(x.message) for x in w], is_main=g.is_main, merged=g.merged,
               ranks=g.ranks, failed=g.failed, missing=g.missing, error=g.error, note=g.note)
    if g.is_main and g.ranks is not None:
        out['advice'] = straggler_advice(g.ranks)
        out['report'] = format_merged(g.merged).to_string(index=False)
    rec[name] = out

def _straggler(rank, route, d, rec):
    "Profile a fit in which `SLOW_RANK` draws slowly, then gather; then rank 0 gathers alone (a rank that never reports)"
    learn = _learner(rank, d, route)
    if route == 'ddp':
        from torch.nn.parallel import DistributedDataParallel
        learn.model = DistributedDataParallel(learn.model)
    learn.profile(show_report=True, save_csv=True, csv_name='prof.csv', plain=True, flops=True)  # FLOPs are opt-in: their columns travel with each rank's results
    _fit(learn, route, rec)
    _gather(rec, 'gather', learn.simple_profile_results, timeout=GATHER_TIMEOUT)
    if rank == 0: _gather(rec, 'alone', learn.simple_profile_results, timeout=ALONE_TIMEOUT)

def _failing(rank, route, d, rec):
    "Rank `SLOW_RANK` raises at train batch `FAIL_AT`; each rank then gathers with `failed` set if its fit raised"
    from torch.nn.parallel import DistributedDataParallel
    from fastai.callback.core import Callback
    class Boom(Callback):
        def before_batch(self):
            if rank == SLOW_RANK and self.training and self.iter == FAIL_AT: raise ValueError(f'rank {rank} broke on purpose')
    learn = _learner(rank, d, route)
    learn.model = DistributedDataParallel(learn.model)
    learn.profile(show_report=True, save_csv=True, csv_name='prof.csv', plain=True).add_cb(Boom())
    t0 = time.perf_counter()
    exc = _fit(learn, route, rec)
    _gather(rec, 'gather', learn.simple_profile_results, timeout=GATHER_TIMEOUT, failed=exc if exc is not None else False)
    rec['total_s'] = time.perf_counter() - t0
    rec['fit_error'] = f'{type(exc).__name__}: {exc}' if exc is not None else None

SCENARIOS = dict(straggler=_straggler, failing=_failing)

def _worker(rank, world, port, out, route, scenario):
    "One rank: join the gloo group, run `scenario`, pickle what it saw to `out/rank{rank}/record.pkl`"
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    d = Path(out)/f'rank{rank}'
    d.mkdir(parents=True, exist_ok=True)
    rec = {}
    try:
        import fastxtend_prof.all  # noqa: F401  (Learner.profile, the before_draw event)
        import fastxtend_prof.features.distributed as fxd
        fxd.GATHER_TIMEOUT = GATHER_TIMEOUT  # what `learn.profile()`'s own gather will wait
        if route == 'fastai':
            from fastai.distributed import DistributedDL
            DistributedDL._broadcast = _cpu_broadcast
        dist.init_process_group('gloo', rank=rank, world_size=world, timeout=timedelta(seconds=PG_TIMEOUT))
        SCENARIOS[scenario](rank, route, d, rec)
    except BaseException: rec['worker_error'] = traceback.format_exc()
    finally:
        if dist.is_initialized(): dist.destroy_process_group()
        (d/'record.pkl').write_bytes(pickle.dumps(rec))

def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]

def _launch(path, route, scenario):
    "Run `scenario` on `WORLD` ranks; kill them and fail after `RUN_LIMIT` s; `({rank: record}, seconds)`"
    multiprocessing.set_forkserver_preload(PRELOAD)
    t0 = time.monotonic()
    ctx = mp.start_processes(_worker, args=(WORLD, _free_port(), str(path), route, scenario), nprocs=WORLD, join=False,
                             start_method='forkserver')
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() - t0 > RUN_LIMIT: pytest.fail(f'{scenario} ({route}) still running after {RUN_LIMIT} s: a rank hangs')
    finally:
        for p in ctx.processes:
            if p.is_alive(): p.kill()
    recs = {r: pickle.loads((Path(path)/f'rank{r}'/'record.pkl').read_bytes()) for r in range(WORLD)}
    for r, rec in recs.items(): assert 'worker_error' not in rec, f'rank {r} failed:\n{rec["worker_error"]}'
    return recs, time.monotonic() - t0

# -------------------------------------------------------------------------------------------------------- fixtures
def _route(name):
    if name == 'fastai': pytest.importorskip('accelerate', reason="fastai's distrib_ctx needs accelerate")
    return name

@pytest.fixture(scope='module', params=['ddp', 'fastai'])
def straggler(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f'straggler_{request.param}')
    recs, secs = _launch(path, _route(request.param), 'straggler')
    return path, recs, secs

@pytest.fixture(scope='module')
def failing(tmp_path_factory):
    path = tmp_path_factory.mktemp('failing')
    return (path, *_launch(path, 'ddp', 'failing'))

# ----------------------------------------------------------------------------------------------------------- tests
def test_rank0_gets_both_ranks(straggler):
    "Rank 0 holds the per-rank table of both ranks and the merged table; rank 1 holds neither"
    from fastxtend_prof.core.saved import RESULT_COLS
    from fastxtend_prof.features.distributed import RANK_COLS
    from fastxtend_prof.features.flops import FLOP_COLS  # each rank counts its model's FLOPs (`flops=True`)
    _, recs, _ = straggler
    assert [recs[r].get('fit_error') for r in (0, 1)] == [None, None]
    g0, g1 = recs[0]['gather'], recs[1]['gather']
    assert g0['is_main'] and not g1['is_main'] and g1['ranks'] is None and g1['merged'] is None
    assert (g0['failed'], g0['missing'], g0['warnings']) == ({}, [], [])
    ranks = g0['ranks']
    assert list(ranks.columns) == ['Rank', *RESULT_COLS, *FLOP_COLS]
    assert sorted(set(ranks.Rank)) == [0, 1]
    for r in (0, 1):  # each rank's rows are that rank's own results, unchanged
        own = recs[r]['own']
        mine = ranks[ranks.Rank == r].drop(columns='Rank').reset_index(drop=True)
        assert mine.equals(own.reset_index(drop=True)), f'rank {r} arrived changed'
    merged = g0['merged']
    assert list(merged.columns) == [*RESULT_COLS, *FLOP_COLS, *RANK_COLS]
    draw = row(merged, 'train', 'draw')
    assert draw['Number of Calls'] == sum(row(recs[r]['own'], 'train', 'draw')['Number of Calls'] for r in (0, 1))
    assert draw['Slowest Rank'] == SLOW_RANK
    assert draw['Rank Max'] == pytest.approx(row(recs[SLOW_RANK]['own'], 'train', 'draw')['Mean Duration'])
    assert draw['Rank Max'] - draw['Rank Min'] > 0.5*DRAW_SLEEP
    assert g1['s'] < 0.5, f"rank 1 spent {g1['s']:.2f} s in the gather: it should only send"
    assert g0['s'] < GATHER_TIMEOUT/2, f"rank 0 spent {g0['s']:.2f} s in the gather"

def test_report_names_the_slow_rank(straggler):
    "The straggler advice names rank 1 and `draw`; the merged report has the rank columns"
    _, recs, _ = straggler
    g0 = recs[0]['gather']
    adv = g0['advice']
    assert [(a.rule, a.evidence['rank'], a.evidence['step']) for a in adv] == [('straggler_rank', SLOW_RANK, 'draw')]
    assert f'Rank {SLOW_RANK} is a straggler' in str(adv[0]) and '`draw`' in str(adv[0])
    assert adv[0].evidence['step_excess_s'] > 0.5*DRAW_SLEEP
    assert 'Slowest Rank' in g0['report'] and 'Rank Max' in g0['report']

def test_rank_that_never_reports(straggler):
    "Rank 0 waits the timeout, no longer, warns which rank is missing and keeps its own results"
    _, recs, _ = straggler
    a = recs[0]['alone']
    assert a['missing'] == [1] and sorted(set(a['ranks'].Rank)) == [0]
    assert ALONE_TIMEOUT <= a['s'] < ALONE_TIMEOUT + 2
    assert len(a['warnings']) == 1 and 'rank 1 sent no profile within 1 s' in a['warnings'][0]
    assert a['note'] == '1 of 2 ranks: rank 1 missing'

def test_end_to_end_through_profile(straggler):
    "Through `learn.profile()` alone: rank 0 shows the merged report naming the slow rank and writes the CSV; rank 1 is silent"
    path, recs, _ = straggler
    r0, r1 = recs
    rank_results = recs[0]['rank_results']
    assert rank_results is not None and sorted(set(rank_results.Rank)) == [0, 1]
    assert 'Slowest Rank' in recs[0]['stdout'] and f'Rank {SLOW_RANK} is a straggler' in recs[0]['stdout']
    assert (path/'rank0'/'prof.csv').exists()
    assert recs[1]['stdout'] == '' and not (path/'rank1'/'prof.csv').exists()
    assert recs[1]['rank_results'] is None and recs[1]['own'] is not None  # every rank keeps its own results

def test_failing_rank_does_not_hang(failing):
    "Rank 1 raises mid-fit: it returns at once; rank 0's fit fails in DDP's all-reduce, and its warning names rank 1's error"
    _, recs, secs = failing
    r0, r1 = recs[0], recs[1]
    assert r1['fit_error'].startswith('ValueError') and f'rank {SLOW_RANK} broke on purpose' in r1['fit_error']
    g1 = r1['gather']
    assert not g1['is_main'] and g1['s'] < 1 and g1['warnings'] == []  # the failing rank never waits, says nothing
    assert r0['fit_error'] is not None  # torch's error: its peer left the all-reduce
    g0 = r0['gather']
    assert g0['failed'][1].startswith('ValueError: ') and g0['failed'][1].endswith(f'rank {SLOW_RANK} broke on purpose')
    assert g0['missing'] == []
    assert len(g0['warnings']) == 1 and g0['warnings'][0].startswith(f"Simple Profiler: rank 1's fit raised {g0['failed'][1]}")
    assert sorted(set(g0['ranks'].Rank)) == [0]  # the report covers rank 0's partial results
    assert g0['s'] < 1  # rank 0's fit raised too: it takes what is there without waiting
    assert r0['total_s'] < GATHER_TIMEOUT, f"rank 0 took {r0['total_s']:.1f} s after its fit started"
    assert secs < RUN_LIMIT

def test_failing_rank_end_to_end(failing):
    "Through `learn.profile()` alone: rank 0's partial report notes rank 1's failure; rank 1 prints nothing"
    path, recs, _ = failing
    assert 'rank 1 failed' in recs[0]['stdout']
    assert any("rank 1's fit raised ValueError" in w for w in recs[0]['fit_warnings'])
    assert recs[1]['stdout'] == '' and not (path/'rank1'/'prof.csv').exists()

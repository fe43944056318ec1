"""Helpers shared by the pytest files, the one home for them: `from conftest import row, BatchLog, MirrorTimer`.

pytest imports this file first and puts this folder on `sys.path`, so the test files (and the workers that
test_distributed spawns, which get the same path) import it by name like any module."""
import contextlib, functools, inspect, itertools, time
import pytest
from fastai.callback.core import Callback

# ------------------------------------------------------------------------------------------------------ test order
# The files that take longest, longest first (seconds of one test process in a loaded run of the whole suite, 3 test
# processes and 2 spinning ones on 2 cores): scripts/test.sh runs the files in several processes, each taking the next
# file in this order as it frees up, so the long ones start at once instead of holding the run up at its end. Every
# other file follows, in pytest's own order. Each file here but the fault injections' is marked `slow`: the quick loop
# (`bash scripts/test.sh --quick`, pytest's `-m "not slow"`) leaves them out, and runs the rest in a few minutes.
LONGEST_FIRST = ['test_install',  # one test: 94 s on a quiet machine (164 s before it resolved the install line with --dry-run)
                 'test_applications', 'test_cli', 'test_saved', 'test_observe_only', 'test_run',  # 504-225 s
                 'test_tune', 'test_arrivals', 'test_faults', 'test_compare', 'test_cache', 'test_export',  # 199-112 s
                 'test_page', 'test_stages', 'test_history', 'test_fastai_citizen', 'test_gpu_overhead_bench']  # 110-86 s
QUICK_TOO = {'test_faults'}  # long, but 708 small cases of what every change can break

@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by marker (`-m "not slow"`)
def pytest_collection_modifyitems(config, items):
    rank = {f'{name}.py': i for i, name in enumerate(LONGEST_FIRST)}
    slow = {f'{name}.py' for name in LONGEST_FIRST if name not in QUICK_TOO}
    for item in items:
        if item.path.name in slow: item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order

# ------------------------------------------------------------------------------------------------- results tables
def row(df, phase, step):
    "The one row of profile results `df` for (`phase`, `step`); fails unless there is exactly one"
    r = df[(df.Phase == phase) & (df.Step == step)]
    assert len(r) == 1, f'expected one ({phase}, {step}) row, got {len(r)}'
    return r.iloc[0]

def calls(df, phase, step):
    "The `Number of Calls` of (`phase`, `step`) in `df`, as an int"
    return int(row(df, phase, step)['Number of Calls'])

# -------------------------------------------------------------------------------------------------------- workloads
def busy(s):
    "Spin for `s` seconds of wall time: at least that, however loaded the machine (sleep would hand the core away and overshoot)"
    end = time.perf_counter() + s
    while time.perf_counter() < end: pass

class Spend:
    """Known waits of a workload, by name, and how they pass: spun on the real clock (`busy`), or added to `clock` when the
    test runs on a `ManualClock` (then nothing else takes any time, and each step holds exactly what the test put in it)"""
    def __init__(self, names): self.waits, self.clock = dict.fromkeys(names, 0.), None
    def __call__(self, name):
        s = self.waits[name]
        if self.clock is None: busy(s)
        else: self.clock.spend(s)

    @contextlib.contextmanager
    def using(self, waits, clock=None):
        "`waits` in force on `clock` (None: the real one) inside the block; every wait back to zero after it"
        self.waits.update(waits)
        self.clock = clock
        try: yield self
        finally: self.waits.update(dict.fromkeys(self.waits, 0.)); self.clock = None

# ---------------------------------------------------------------------------------------------------- test doubles
class MirrorTimer:
    "A device timer whose events are readings of the host `clock`: the whole `sync='events'` pipeline runs on a CPU"
    def __init__(self, clock=time.perf_counter): self.clock, self.queries = clock, 0
    def record(self): return self.clock()
    def elapsed(self, a, b): return b - a
    def ready(self, e): self.queries += 1; return True
    def synchronize(self): pass

class ManualClock:
    "A clock that returns `t`, which the test advances (`spend`): time passes only where the test says it does"
    t = 0.0
    def __call__(self): return self.t
    def spend(self, s): self.t += s

class Tick(Callback):
    "Callback work of known length, for a `ManualClock`: spends `amounts[event]` of `clock` in each of those events, at `order`"
    def __init__(self, clock, amounts, order=0):
        self.order = order
        for event, s in amounts.items(): setattr(self, event, functools.partial(clock.spend, s))

class LyingDL:
    "Wraps a loader: claims `claimed` batches, yields at most `n`"
    def __init__(self, dl, n, claimed): self.dl, self.n, self.claimed = dl, n, claimed
    def __len__(self): return self.claimed
    def __iter__(self): return itertools.islice(iter(self.dl), self.n)
    def __getattr__(self, k):
        if k.startswith('__'): raise AttributeError(k)
        return getattr(self.__dict__['dl'], k)

def cpu_learner(n=64):
    "A tiny Learner on the CPU, no progress bar: for what a feature says where there is no GPU"
    import torch
    from torch import nn
    from fastai.learner import Learner
    from fastai.data.core import DataLoaders
    from fastai.callback.progress import ProgressCallback
    x = torch.randn(n, 4)
    learn = Learner(DataLoaders.from_dsets(list(zip(x, x[:, :1])), list(zip(x, x[:, :1])), bs=8, device='cpu'), nn.Linear(4, 1), loss_func=nn.MSELoss())
    learn.remove_cb(ProgressCallback)
    return learn

# ----------------------------------------------------------------------------------------------- the recorder seam
@contextlib.contextmanager
def recorder_with(clock=time.perf_counter, mode='none', timer=None):
    """Inside the block the profiler's callbacks build their recorder through the `make_recorder` seam, reading `clock` and
    timed the `mode` way on this CPU machine: 'none' on the host clock, 'device' synchronising with a no-op that counts its
    calls, 'events' recording with `timer` (default a `MirrorTimer` of `clock`). Yields the list of syncs ('device'), the
    timer ('events') or None. For helpers that profile outside a test (module-scoped fixtures); a test uses `sync_mode`"""
    from fastxtend_prof.profiler import simpleprofiler
    from fastxtend_prof.core.recorder import make_recorder
    syncs, timer = [], timer or MirrorTimer(clock)
    kw = {'none': {}, 'device': dict(sync_fn=lambda: syncs.append(1)), 'events': dict(timer=timer)}[mode]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(simpleprofiler, 'make_recorder', functools.partial(make_recorder, clock=clock, **kw))
        yield {'none': None, 'device': syncs, 'events': timer}[mode]

@pytest.fixture
def sync_mode():
    "`sync_mode(clock, mode, timer)`: `recorder_with` in force for the rest of the test; returns what it yields"
    with contextlib.ExitStack() as stack:
        yield lambda *args, **kw: stack.enter_context(recorder_with(*args, **kw))

# ------------------------------------------------------------------------------------------------------- callbacks
BATCH_EVENTS = ('before_batch', 'after_pred', 'after_loss', 'before_backward', 'after_backward', 'before_step',
                'after_step', 'after_batch')
LOOP_EVENTS = ('before_epoch', 'before_train', 'after_train', 'before_validate', 'after_validate', 'after_epoch')
FIT_EVENTS = ('before_fit', 'after_fit')

def _in_real_fit():
    "True inside `Learner.fit` (fastai runs `before_fit` from `_with_events(_do_fit, 'fit', ...)`), False in validate/get_preds"
    f = inspect.currentframe()
    while f is not None:
        if f.f_code.co_name == '_with_events' and f.f_locals.get('event_type') == 'fit': return True
        f = f.f_back
    return False

class BatchLog(Callback):
    "Independent record of the batches fastai ran: per fit-like call in `fits`, and as `(epoch, iter)` in `train`/`valid` since the last `before_fit`"
    def __init__(self, order=-2000):
        self.order = order
        self.fits = []  # one dict per fit-like call (fit, validate, get_preds, lr_find): loops, epochs
    def before_fit(self):
        self.fits.append(dict(loops=[], epochs=0, real=_in_real_fit()))
        self.__dict__.update(train=[], valid=[])  # not `self.train = `: fastai would warn that it shadows `learn.train`
    def before_epoch(self): self.fits[-1]['epochs'] += 1
    def before_train(self): self.fits[-1]['loops'].append(['train', 0])
    def before_validate(self): self.fits[-1]['loops'].append(['valid', 0])
    def before_batch(self):
        self.fits[-1]['loops'][-1][1] += 1
        (self.train if self.training else self.valid).append((self.epoch, self.iter))

    def expected(self, fit, phase, warmup=1):
        "(steady batches, warmup batches, loops, loops without a batch) of `phase` in the `fit`-th fit"
        runs = [n for p, n in self.fits[fit]['loops'] if p == phase]
        warm = sum(min(n, warmup) for n in runs)
        return sum(runs) - warm, warm, len(runs), sum(n == 0 for n in runs)

class RaiseAt(Callback):
    "Raises `make()` once at `event`: of train batch `it` (valid batch 0 if `valid`) of epoch `epoch` (None: any), that epoch, or the fit"
    def __init__(self, event, make, it, epoch=None, order=0, valid=False):
        self.event, self.make, self.at_iter, self.at_epoch, self.order, self.valid, self.raised = event, make, it, epoch, order, valid, None
        setattr(self, event, self._maybe)
    def _maybe(self):
        in_epoch = self.at_epoch is None or self.epoch == self.at_epoch
        if self.event in BATCH_EVENTS:
            hit = in_epoch and self.training != self.valid and self.iter == (0 if self.valid else self.at_iter)
        elif self.event in LOOP_EVENTS: hit = in_epoch
        else: hit = True
        if hit and self.raised is None:
            self.raised = self.make()
            raise self.raised

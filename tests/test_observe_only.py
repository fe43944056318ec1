"""The profiler observes and never changes the run, on the cases where that is easiest to break: compiled models
(`torch.compile` of a helper, of `forward`, of the module, `Module.compile()`, with the 'aot_eager' and 'inductor'
backends), fastai's `ActivationStats` hooks, Dropout with BatchNorm, MixUp, a WGAN's alternating generator and critic
batches, and `GradientAccumulation` + `GradientClip` + `SaveModelCallback` + `EarlyStoppingCallback` together.

Each case is checked as `test_applications.assert_unchanged` does (seed, build, train unprofiled and profiled, compare
bit for bit), over more of what a run leaves behind: every weight and buffer and the epoch metrics (`state`), and here
also the optimizer's state and hyper-parameters (`learn.opt.state_dict()`: fastai's optimizers keep it in
`learn.opt.state`), the gradients left on the parameters, every train batch's smoothed loss and learning rate, which
parameters train and which modules are in train mode, the hooks left on the modules, the callbacks left on the Learner,
the random generators' states after the fit, and what each case records of its own (the activation statistics, the
saved best model). First two unprofiled runs must agree (else the case is not deterministic: skipped, or a failure
under `CI`); then each profiled run must agree with them. The unprofiled pair is run once per case and shared by its
profiling options.

Each case is profiled with the defaults (the features on by default) and with every feature and file that works on a
CPU at once: `flops=True`, `live=True` (with fastai's logger on, so the live columns are really written), `trace=True`
(torch.profiler over a few train batches), `stages=True` (the loader's stages timed), `idle=True` and `hardware=True` (on a
GPU: torch's sync debug mode on the train loops, NVML read on a thread; on a CPU each says it needs a GPU), `save_json`,
`save_csv` and `plot`; compiled models also with `flops=True`
alone, the FLOP counter that changed compiled runs before it counted on the side (issue 34). Their compile must stay in the warmup rows: no
train batch of the profiled run after the warmup may take more than 10x its step's median (and 50 ms more: a compile
takes 100 ms and more here, the pauses of a busy machine less), and the profiled run must compile its graphs in the
same batches as the unprofiled one (dynamo's count of graphs after each batch).

Nothing here asserts a timing of the profiler itself; the profiled runs' wall times are printed at the end (`-s`)."""
import functools, os, random, time
import numpy as np, pytest, torch
from torch import nn
from fastcore.foundation import L
from fastai.basics import Learner, DataLoaders, Callback, accuracy, CrossEntropyLossFlat
import fastai.callback.schedule  # noqa: F401  (adds Learner.fit_one_cycle)
import fastxtend_prof.all  # noqa: F401  (adds Learner.profile)
from test_applications import run, state, differences, one_thread, _vision  # noqa: F401  (one_thread: autouse, one torch thread)

pytestmark = pytest.mark.apps
BS, N_TRAIN, N_VALID, N_IN, N_OUT = 16, 8*16, 2*16, 16, 4  # 8 train and 2 valid batches an epoch, no partial batch

# ------------------------------------------------------------------------------------------------------ the check
def flat(obj, at='') -> dict:
    "`{path: leaf}` of a nested structure (dicts, lists, tuples, `L`): tensors detached and cloned to the CPU"
    out = {}
    def walk(x, at):
        if isinstance(x, torch.Tensor): out[at] = x.detach().cpu().clone()
        elif isinstance(x, np.ndarray): out[at] = torch.from_numpy(np.array(x))
        elif isinstance(x, dict): [walk(v, f'{at}.{k}' if at else str(k)) for k, v in x.items()]
        elif isinstance(x, (list, tuple, L)): [walk(v, f'{at}[{i}]') for i, v in enumerate(x)]
        else: out[at] = x
    walk(obj, at)
    return out

def _bits(t): return t.reshape(-1).contiguous().view(torch.uint8)

def same(a, b) -> bool:
    "Bit-identical leaves: tensors of the same dtype, shape and bytes; numbers equal (NaN equal to NaN), of the same type"
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(_bits(a), _bits(b)))
    if type(a) is not type(b): return False
    if isinstance(a, float) and a != a: return b != b
    try: return bool(a == b)
    except Exception: return a is b

def _say(k, a, b) -> str:
    "How leaf `k` differs, in a few words"
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype: return f'{k}: {a.dtype}{list(a.shape)} != {b.dtype}{list(b.shape)}'
        if a.is_floating_point(): return f'{k}: max |diff| {(a.double() - b.double()).abs().max().item():.3g}'
        return f'{k}: {(a != b).sum().item()} of {a.numel()} elements differ'
    return f'{k}: {a!r} != {b!r}'

def _hooks(model) -> dict:
    "The hooks on each module that has any, by kind"
    kinds = ('_forward_hooks', '_forward_pre_hooks', '_backward_hooks', '_backward_pre_hooks', '_state_dict_hooks', '_load_state_dict_pre_hooks')
    return {n or 'model': {k: len(getattr(m, k, {})) for k in kinds if getattr(m, k, None)} for n, m in model.named_modules()
            if any(getattr(m, k, None) for k in kinds)}

def rng_states() -> dict:
    "The states of the random generators a fit draws from: torch's CPU one, numpy's, Python's"
    np_state = np.random.get_state()
    return dict(torch=torch.get_rng_state(), numpy=np_state[1], numpy_pos=int(np_state[2]), python=hash(random.getstate()))

def observed(learn, extra=None) -> dict:
    """All that must be identical after the fit: `state` (weights, buffers, epoch metrics) and the rest, flattened to
    leaves: optimizer state and hypers, gradients, per-batch losses and lrs, trainable flags, train modes, hooks,
    callbacks, random generators' states, and `extra(learn)`"""
    r, m = learn.recorder, learn.model
    rest = dict(
        opt=None if learn.opt is None else learn.opt.state_dict(),  # fastai: `state` (one dict a param, from `opt.state`) and `hypers`
        grads={n: p.grad for n, p in m.named_parameters()},
        requires_grad={n: p.requires_grad for n, p in m.named_parameters()},
        training={n or 'model': mod.training for n, mod in m.named_modules()},
        hooks=_hooks(m),
        callbacks=sorted(type(cb).__name__ for cb in learn.cbs),
        losses=list(r.losses), lrs=list(map(float, r.lrs)), iters=list(r.iters),
        rng=rng_states(),
        extra=None if extra is None else extra(learn))
    return dict(core=state(learn), rest=flat(rest))

def all_differences(a, b) -> list:
    "What differs between two `observed`s, as readable lines (empty: bit-identical)"
    out = differences(a['core'], b['core'])
    ra, rb = a['rest'], b['rest']
    out += [f'{k}: only in the first run' for k in ra if k not in rb] + [f'{k}: only in the second run' for k in rb if k not in ra]
    out += [_say(k, ra[k], rb[k]) for k in ra if k in rb and not same(ra[k], rb[k])]
    return out

_PLAIN = {}  # case -> (its unprofiled run's `observed`, how a second unprofiled run differed from it)

def reference(case:str, build, train, extra=None) -> dict:
    "The unprofiled run of `case`, after checking that a second one agrees (else skip, or fail under CI: not deterministic)"
    if case not in _PLAIN:
        a = observed(run(build, train, False), extra)
        _PLAIN[case] = a, all_differences(a, observed(run(build, train, False), extra))
    plain, again = _PLAIN[case]
    if again:
        msg = (f'{case}: two unprofiled runs from the same seed differ, so the application is not deterministic and '
               'profiling cannot be judged: ' + '; '.join(again[:6]))
        if os.environ.get('CI'): pytest.fail(msg)
        pytest.skip(msg)
    return plain

WALL = {}  # (case, option) -> seconds of the profiled run, for the report at the end of the module

def profiled(case:str, build, train, extra=None, **profile_kw) -> tuple:
    "Two unprofiled runs of `case` agree (else skip or fail), then a profiled one (`profile_kw`): its Learner, and how it differs from them"
    plain = reference(case, build, train, extra)
    t0 = time.perf_counter()
    learn = run(build, train, True, **profile_kw)
    WALL[case, ','.join(f'{k}={v}' for k, v in profile_kw.items()) or 'defaults'] = time.perf_counter() - t0
    diff = all_differences(plain, observed(learn, extra))
    if not diff: return learn, ''
    return learn, (f'profiling ({profile_kw or "defaults"}) changed the run: ' + '; '.join(diff[:8]) +
                   (f' (and {len(diff) - 8} more)' if len(diff) > 8 else ''))

def assert_observes(case:str, build, train, extra=None, **profile_kw):
    "Two unprofiled runs of `case` agree, and a profiled one (`profile_kw`) agrees with them bit for bit; the profiled Learner"
    learn, changed = profiled(case, build, train, extra, **profile_kw)
    assert not changed, changed
    return learn

@pytest.fixture(scope='module', autouse=True)
def wall_times():
    "Print the profiled runs' wall times at the end of the module (shown with `-s`)"
    yield
    if WALL: print('\nprofiled runs (s):\n' + '\n'.join(f'  {c:<28} {o:<75} {s:6.2f}' for (c, o), s in WALL.items()))

# ------------------------------------------------------------------------------------------ profiling options
OPTIONS = {'defaults': {}, 'all': dict(flops=True, live=True, trace=True, stages=True, idle=True, hardware=True, save_json=True, save_csv=True, plot=True)}  # the default profile, and every feature and file (idle and hardware say they need a GPU on a CPU)

def check_options_ran(learn, kw):
    "The options asked for did their work: the files are there, the trace window ran, the live columns were logged"
    if kw.get('save_json'): assert (learn.path/'simple_profile.json').exists()
    if kw.get('save_csv'): assert (learn.path/'simple_profile.csv').exists()
    if kw.get('plot'): assert (learn.path/'simple_profile.png').exists()
    if kw.get('trace'): assert (learn.path/'profile_trace.json').exists()
    names = list(learn.recorder.metric_names)
    if kw.get('live'): assert any(len(r) > len(names) and list(r[:len(names)]) == names for r in learn.logged if isinstance(r, (list, L))), learn.logged[:2]

# ----------------------------------------------------------------------------------------------------- building
@pytest.fixture
def fresh_dir(tmp_path):
    "A new folder for each run's `learn.path` (saved models, profile files): the runs never share one"
    n = iter(range(1000))
    def make():
        d = tmp_path/f'run{next(n)}'
        d.mkdir()
        return d
    return make

def tensor_dls(n_in=N_IN, n_out=N_OUT, seed=0):
    "Random features and a class that depends on them: 8 train and 2 valid batches of `BS`"
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N_TRAIN + N_VALID, n_in, generator=g)
    y = (x[:, :n_out] + 0.5*torch.randn(len(x), n_out, generator=g)).argmax(1)
    ds = list(zip(x, y))
    return DataLoaders.from_dsets(ds[:N_TRAIN], ds[N_TRAIN:], bs=BS, num_workers=0)

def builder(make_model, fresh_dir, before=None, cbs=list):
    "A `build` for `run`: `before()`, then a Learner on `tensor_dls` with `make_model()` and new `cbs()`, in its own folder"
    def build():
        if before is not None: before()
        learn = Learner(tensor_dls(), make_model(), loss_func=CrossEntropyLossFlat(), metrics=accuracy, cbs=cbs())
        learn.path = fresh_dir()
        return learn
    return build

def logged(fit):
    "A `train` that runs `fit(learn)` with fastai's logger writing to `learn.logged` (so `live=True` has a table to add to)"
    def train(learn):
        learn.logged = []
        learn.logger = learn.logged.append  # inside `run`'s `learn.no_logging()`, which puts the logger back afterwards
        fit(learn)
    return train

def mlp(): return nn.Sequential(nn.Linear(N_IN, 32), nn.ReLU(), nn.Linear(32, N_OUT))

# ---------------------------------------------------------------------------------------------- compiled models
BACKENDS = ('aot_eager', 'inductor')

class HelperNet(nn.Module):
    "An MLP whose hidden layer (Linear, ReLU, Dropout) runs in a `torch.compile`d function (`helper`)"
    def __init__(self, helper):
        super().__init__()
        self.l1, self.l2, self.helper = nn.Linear(N_IN, 32), nn.Linear(32, N_OUT), helper
    def forward(self, x): return self.l2(self.helper(x, self.l1.weight, self.l1.bias, self.training))

def _hidden(x, w, b, training): return torch.nn.functional.dropout(torch.nn.functional.linear(x, w, b).relu(), 0.2, training)

@functools.cache
def helper(backend):
    "`_hidden` under `@torch.compile(backend=backend)`, made once per backend as a decorated module-level function is (not at import: that imports dynamo)"
    return torch.compile(_hidden, backend=backend)

class Net(nn.Module):
    "`body` behind a forward of the user's own: `Net(...).compile()` compiles it on torch 2.11 too, which leaves a bare `nn.Sequential`'s uncompiled (no graph; H100 run)"
    def __init__(self, body): super().__init__(); self.body = body
    def forward(self, x): return self.body(x)

def compiled(style, backend):
    """A model compiled the `style` way with `backend`. Each has Dropout, whose masks differ between inductor's code and
    eager torch: a batch that runs eagerly in one run and compiled in the other changes the weights"""
    def make():
        if style == 'helper': return HelperNet(helper(backend))
        m = Net(nn.Sequential(nn.Linear(N_IN, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, N_OUT)))
        if style == 'forward': m.forward = torch.compile(m.forward, backend=backend); return m
        if style == 'module': return torch.compile(m, backend=backend)
        if style == 'method': m.compile(backend=backend); return m
        raise ValueError(style)
    return make

TIMED_STEPS = ('forward', 'loss', 'backward', 'opt_step', 'zero_grad', 'batch')

def compile_outside_warmup(learn) -> list:
    """The train batches of the profiled fit after the warmup rows in which dynamo compiled a graph (its count of compiled
    graphs, `CompileLog`, grew), as readable lines: a compile outside the warmup, which the steady statistics would then
    hold. Held to the count, not to time: on a busy machine the OS pauses a step without bound (in loaded CI runs a
    steady backward took 84 ms against a 0.94 ms median, and the trace window's first batch, torch.profiler's start-up,
    109 ms against 8.8 ms). Each timed step must have steady times."""
    tl = learn.profile_timeline()
    train = tl[tl.phase == 'train'].reset_index(drop=True)
    later = train[~train.warmup.astype(bool)]
    steady = later[~later.trace.astype(bool)]
    assert len(steady) >= 8, f'only {len(steady)} steady train batches'
    for step in TIMED_STEPS: assert steady[step].notna().any(), f'no {step} times'
    counts = [n for k, n in learn.compile_log.graphs.items() if k.startswith('graphs compiled by train')]  # one per train batch, in order
    assert len(counts) == len(train), (len(counts), len(train))
    return [f"{counts[i] - counts[i - 1]} graph(s) compiled in epoch {r.epoch} batch {r.iter}{' (trace window)' if r.trace else ''}"
            for i, r in later.iterrows() if i and counts[i] > counts[i - 1]]

class CompileLog(Callback):
    "After each batch, dynamo's count of graphs compiled since the fit began, in `graphs` by batch: where each compile happened"
    def before_fit(self):
        from torch._dynamo.utils import counters
        self.counters, self.start, self.graphs = counters, counters['stats']['unique_graphs'], {}
    def after_batch(self):
        where = f"graphs compiled by {'train' if self.training else 'valid'} epoch {self.epoch} batch {self.iter}"
        self.graphs[where] = self.counters['stats']['unique_graphs'] - self.start

COMPILE_OPTIONS = {'flops': dict(flops=True), **OPTIONS}  # the FLOP counter alone: what broke compiled runs before issue 34
COMPILE_CASES = [(b, s, o) for b in BACKENDS for s in ('helper', 'forward', 'module', 'method') for o in COMPILE_OPTIONS
                 if not (b == 'inductor' and o == 'all')]  # every feature at once: with aot_eager (inductor's compile adds ~3 s a case, not coverage)

@pytest.mark.parametrize('backend,style,option', COMPILE_CASES)
def test_compiled(backend, style, option, fresh_dir):
    """A model compiled four ways, each backend: identical runs profiled or not, the compile in the warmup rows.
    `torch._dynamo.reset()` before each build: every run compiles afresh (inductor's cache on disk keeps that quick),
    none reuses or exhausts another's compiled code"""
    import torch._dynamo
    build = builder(compiled(style, backend), fresh_dir, before=torch._dynamo.reset, cbs=lambda: [CompileLog()])
    kw = COMPILE_OPTIONS[option]
    learn, changed = profiled(f'compiled-{style}-{backend}', build, logged(lambda l: l.fit(2, 1e-2)), extra=lambda l: l.compile_log.graphs, **kw)
    assert list(learn.compile_log.graphs.values())[-1] > 0, 'nothing was compiled'
    slow = compile_outside_warmup(learn)
    late = 'compiled after the warmup: ' + '; '.join(slow[:6])
    assert not changed and not slow, '\n'.join(([changed] if changed else []) + ([late] if slow else []))
    check_options_ran(learn, kw)

# ---------------------------------------------------------------------------------------------- ActivationStats
@pytest.mark.parametrize('option', list(OPTIONS))
def test_activation_stats(option, fresh_dir):
    "fastai's `ActivationStats` hooks (with histograms): their recorded statistics identical too, and their hooks gone after the fit"
    from fastai.callback.hook import ActivationStats
    def make(): return nn.Sequential(nn.Linear(N_IN, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, N_OUT))
    build = builder(make, fresh_dir, cbs=lambda: [ActivationStats(with_hist=True)])
    kw = OPTIONS[option]
    learn = assert_observes('activation_stats', build, logged(lambda l: l.fit_one_cycle(2, 1e-2)),
                            extra=lambda l: l.activation_stats.stats, **kw)
    assert len(learn.activation_stats.stats) == 2*N_TRAIN//BS
    check_options_ran(learn, kw)

# ------------------------------------------------------------------------------------------ Dropout, BatchNorm
@pytest.mark.parametrize('option', list(OPTIONS))
def test_dropout_batchnorm(option, fresh_dir):
    "Dropout draws its masks from the global generator and BatchNorm keeps running statistics (buffers): both identical"
    def make(): return nn.Sequential(nn.Linear(N_IN, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, N_OUT))
    kw = OPTIONS[option]
    learn = assert_observes('dropout_batchnorm', builder(make, fresh_dir), logged(lambda l: l.fit_one_cycle(2, 1e-2)), **kw)
    check_options_ran(learn, kw)

# ------------------------------------------------------------------------------------------------------- MixUp
@pytest.mark.parametrize('option', list(OPTIONS))
def test_mixup(option, fresh_dir):
    "fastai's `MixUp`: it draws the mixing weights and the shuffle from torch's generator, and swaps the loss during training"
    from fastai.callback.mixup import MixUp
    kw = OPTIONS[option]
    learn = assert_observes('mixup', builder(mlp, fresh_dir, cbs=lambda: [MixUp(0.4)]), logged(lambda l: l.fit_one_cycle(2, 1e-2)), **kw)
    assert isinstance(learn.loss_func, CrossEntropyLossFlat)  # MixUp's loss taken off again
    check_options_ran(learn, kw)

# -------------------------------------------------------------------------------------------------------- WGAN
GAN_BS, GAN_TRAIN, GAN_VALID, GAN_SIZE, NOISE = 8, 12*8, 2*8, 16, 32  # 12 train batches: two rounds of 5 critic, 1 generator

def gan_builder(fresh_dir):
    "A `GANLearner.wgan` of fastai's `basic_generator` and `basic_critic` on random 3x16x16 images in [-1, 1]"
    v = _vision()
    from fastai.vision.gan import GANLearner, basic_generator, basic_critic
    def build():
        g = torch.Generator().manual_seed(0)
        noise = torch.randn(GAN_TRAIN + GAN_VALID, NOISE, generator=g)
        images = torch.rand(GAN_TRAIN + GAN_VALID, 3, GAN_SIZE, GAN_SIZE, generator=g)*2 - 1
        ds = list(zip(noise, images))
        dls = DataLoaders.from_dsets(ds[:GAN_TRAIN], ds[GAN_TRAIN:], bs=GAN_BS, num_workers=0)
        learn = GANLearner.wgan(dls, basic_generator(GAN_SIZE, 3, in_sz=NOISE, n_features=16), basic_critic(GAN_SIZE, 3, n_features=16),
                                opt_func=v.partial(v.Adam, mom=0.), show_img=False)
        learn.path = fresh_dir()
        return learn
    return build

@pytest.mark.parametrize('option', list(OPTIONS))
def test_wgan(option, fresh_dir):
    "A WGAN: critic and generator batches alternate (5 to 1), the critic's weights clipped, one optimizer over both; the losses each kept"
    kw = OPTIONS[option]
    gan_losses = lambda l: dict(gen=list(l.gan_trainer.gen_losses), crit=list(l.gan_trainer.crit_losses), gen_mode=l.gan_trainer.gen_mode)
    learn = assert_observes('wgan', gan_builder(fresh_dir), logged(lambda l: l.fit(2, 2e-4)), extra=gan_losses, **kw)
    assert len(learn.gan_trainer.gen_losses) == 2*2 and len(learn.gan_trainer.crit_losses) == 2*10  # both kinds of batch ran
    check_options_ran(learn, kw)

# ------------------------------------------------- GradientAccumulation, GradientClip, SaveModel, EarlyStopping
def saved_best(learn):
    "The best model `SaveModelCallback` saved (model and optimizer), as it is on disk"
    p = learn.path/learn.model_dir/'best.pth'
    return torch.load(p, map_location='cpu', weights_only=False) if p.exists() else None

@pytest.mark.parametrize('option', list(OPTIONS))
def test_accumulate_clip_save_stop(option, fresh_dir):
    """Gradients accumulated over two batches (the step of every other batch cancelled), clipped; the best model and its
    optimizer saved and loaded back at the end; early stopping after the second epoch (min_delta no epoch can beat)"""
    from fastai.callback.training import GradientAccumulation, GradientClip
    from fastai.callback.tracker import SaveModelCallback, EarlyStoppingCallback
    cbs = lambda: [GradientAccumulation(n_acc=2*BS), GradientClip(max_norm=0.1), SaveModelCallback(fname='best', with_opt=True),
                   EarlyStoppingCallback(min_delta=10., patience=1)]
    build = builder(mlp, fresh_dir)
    def fit(learn): learn.fit(5, 1e-2, cbs=cbs())
    kw = OPTIONS[option]
    learn = assert_observes('accumulate_clip_save_stop', build, logged(fit), extra=saved_best, **kw)
    assert len(learn.recorder.values) == 2 and saved_best(learn) is not None  # stopped early; saved
    check_options_ran(learn, kw)

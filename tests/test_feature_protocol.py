"""The feature protocol and the profiler's public face (issue 34).

- A feature defined here, outside the package, plugs in with no change to the package: its observer sees the marks,
  its column joins the results, its line shows under the report, its rule fires, and `speed_find`'s trials run
  without it (they ask for no feature: `learn.profile(features=False)`).
- The composition root (`simpleprofiler`, `result`) names each built-in feature once at most: where it is registered.
- The public face, counted: `learn.profile`'s named options, `fastxtend_prof.all`'s names, the attributes the package
  adds to `Learner`, and no test double in a library module.
- An epoch's own work at its end (a `SaveModelCallback` checkpoint) is inside the epoch, on an injected clock."""
import inspect, re, subprocess, sys, tokenize
from pathlib import Path
import numpy as np, pytest, torch
from torch import nn
from fastai.basics import Learner, DataLoaders, MSELossFlat
from fastai.callback.progress import ProgressCallback
from fastai.callback.tracker import SaveModelCallback
import fastxtend_prof.all  # noqa: F401
from fastxtend_prof.core.features import FEATURES, Feature, register_feature
from fastxtend_prof.core.recorder import Phase, Relay
from fastxtend_prof.verdicts.advice import Advice
from conftest import ManualClock, Tick, recorder_with, row

PKG = Path(fastxtend_prof.all.__file__).parent

def learner(n=24, bs=8, path=None, cbs=()):
    "A small regression Learner on fixed random data, no progress bar"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g); y = x.sum(1, keepdim=True)
    dls = DataLoaders.from_dsets(list(zip(x, y)), list(zip(x[:bs], y[:bs])), bs=bs, num_workers=0)
    learn = Learner(dls, nn.Linear(4, 1), loss_func=MSELossFlat(), cbs=list(cbs), path=path or '.')
    learn.remove_cb(ProgressCallback)
    return learn

# ----------------------------------------------------------------------------------------------- a feature of our own
class BatchCounter(Relay):
    "Counts the train batches it sees start"
    def __init__(self, to):
        super().__init__(to)
        self.n = 0
    def start_batch(self, samples=float('nan')):
        if self.rec.phase is Phase.TRAIN: self.n += 1
        self.to.start_batch(samples)

def too_many_batches(result, ctx):
    "A rule of the feature's own: it fires when the feature counted any batch"
    n = getattr(result, 'counted', None)
    return [Advice('too_many_batches', 'info', dict(n=n), 'fewer batches', f'{n} batches seen')] if n else []
too_many_batches.covers = ()

class Counted(Feature):
    "A feature defined outside the package, on by default: an observer, a column, a report line, a rule"
    name, default, order, columns, rules = 'counted', True, 500, {'Batches Seen': 'batches_seen'}, (too_many_batches,)
    made = 0  # observers made, over every profile: the tuner's trials must make none
    def relay(self, to, learn):
        Counted.made += 1
        return BatchCounter(to)
    def finish(self, learn, relay): return relay.n
    def add_columns(self, results, n, result):
        at = (results.Phase == 'train') & (results.Step == 'iteration')
        return results.assign(**{'Batches Seen': np.where(at, float(n), np.nan)})
    def text(self, n, result): return f'Counted: {n} train batches.'

@pytest.fixture
def counted():
    "`Counted` registered for the test, taken out after it"
    register_feature(Counted)
    Counted.made = 0
    try: yield Counted
    finally: FEATURES.pop('counted', None)

def test_a_feature_of_our_own_plugs_in(counted, capsys):
    learn = learner()
    learn.profile(plain=True)  # shown: the line must reach the printed report
    with learn.no_logging(): learn.fit(2)
    out = capsys.readouterr().out
    r = learn.profile_result
    assert r.counted == 6 and counted.made == 1                     # its observer saw every train batch of the fit
    assert row(r.results, 'train', 'iteration')['Batches Seen'] == 6  # its column
    assert 'Counted: 6 train batches.' in out                         # its line under the report
    assert 'too_many_batches' in [a.rule for a in r.advice] and '[info] too_many_batches: 6 batches seen' in out  # its rule
    from fastxtend_prof.features.loggers import summary_values
    assert summary_values(r.results)['profile/train/iteration_batches_seen'] == 6   # the loggers carry its column

def test_a_feature_of_our_own_can_be_switched_off_or_left_out(counted):
    learn = learner()
    learn.profile(show_report=False, counted=False)
    with learn.no_logging(): learn.fit(1)
    assert learn.profile_result.counted is None and 'Batches Seen' not in learn.simple_profile_results
    learn.profile(show_report=False, features=False)
    with learn.no_logging(): learn.fit(1)
    assert learn.profile_result.features == () and counted.made == 0

def test_speed_find_trials_run_without_any_feature(counted):
    "The tuner's trials ask for no feature: one registered on by default is never made, whatever it is"
    learn = learner(n=8*12)
    res = learn.speed_find(max_time=30, batches=4, warmup=1, show=False)
    assert len(res.trials) >= 1 and counted.made == 0

# --------------------------------------------------------------------------------------------- the composition root
BUILT_IN = {'memory': ('Memory', 'MemoryTap'), 'flops': ('Flops', 'FlopCounter', 'FlopProfile'), 'trace': ('Trace', 'TraceObserver', 'TraceWindow'),
            'arrivals': ('Arrivals', 'ArrivalWatch'), 'stages': ('Stages', 'StageWatch'), 'live': ('Live', 'LiveColumns')}

def names_in(path) -> list:
    "The identifiers of a module's code (not its strings or comments)"
    with open(path) as f: return [t.string for t in tokenize.generate_tokens(f.readline) if t.type == tokenize.NAME]

@pytest.mark.parametrize('module', ['simpleprofiler', 'result'])
def test_the_composition_root_names_each_feature_once_at_most(module):
    names = names_in(PKG/'profiler'/f'{module}.py')
    for feature, classes in BUILT_IN.items():
        n = sum(names.count(x) for x in (feature, *classes))
        assert n <= 1, f'{module}.py names the {feature} feature {n} times'

# ------------------------------------------------------------------------------------------------------ public face
def test_profile_takes_at_most_17_named_options():
    "Features are keywords, not options: 17 named (the 17th, a run's `label` for a history)"
    from fastai.learner import Learner
    named = [p for p in inspect.signature(Learner.profile).parameters.values() if p.name != 'self' and p.kind != p.VAR_KEYWORD]
    assert len(named) <= 17, [p.name for p in named]

def test_all_exports_at_most_31_names():
    "A small public face: 31 names (the 31st, `load_speed`, reads back what `speed_find(save=...)` wrote, as the docs use it)"
    assert len(fastxtend_prof.all.__all__) <= 31 and 'load_speed' in fastxtend_prof.all.__all__
    assert not {'LearnerState', 'amdahl', 'recorder_results'} & set(fastxtend_prof.all.__all__)

def test_at_most_14_public_attributes_added_to_learner():
    "What importing the package adds to `Learner` (every module, fastai's callbacks imported first so their additions don't count)"
    probe = ('import fastai.basics, fastai.callback.all; from fastai.learner import Learner; before = set(dir(Learner)); '
             'import fastxtend_prof.all, fastxtend_prof.tune.search, fastxtend_prof.verdicts.plots, fastxtend_prof.cli, fastxtend_prof.digits; '
             'print(sorted(a for a in set(dir(Learner)) - before if not a.startswith("_")))')
    out = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True, check=True).stdout
    added = eval(out.strip().splitlines()[-1])
    assert len(added) <= 14, added
    assert {'profile', 'profile_result', 'simple_profile_results', 'simple_profile_report', 'profile_results', 'profile_report'} <= set(added)

def test_no_test_double_in_a_library_module():
    found = []
    for p in PKG.rglob('*.py'):
        if p.name in ('testing.py', '_modidx.py'): continue
        src = p.read_text()
        found += [f'{p.name}: {m}' for m in re.findall(r'^(?:class|def) (Fake\w*|fake_\w*|synthetic_run|_?ManualClock)\b', src, re.M)]
    assert not found, found

# ------------------------------------------------------------------------------------------- the epoch and its work
class TimedSave(SaveModelCallback):
    "fastai's `SaveModelCallback`, saving every epoch; each save also spends `s` seconds of the manual clock"
    def __init__(self, clock, s, **kw): super().__init__(every_epoch=True, **kw); self.clock, self.s = clock, s
    def _save(self, name):
        super()._save(name)
        self.clock.spend(self.s)

def test_a_checkpoint_is_inside_its_epoch(tmp_path):
    "The checkpoint `SaveModelCallback` writes at each epoch's end (after fastai's Recorder) is the epoch's own work, not the fit's"
    clock = ManualClock()
    learn = learner(path=tmp_path, cbs=[TimedSave(clock, 1.0), Tick(clock, dict(before_batch=1e-3))])
    with recorder_with(clock):
        learn.profile(show_report=False)
        with learn.no_logging(): learn.fit(2)
    res = learn.simple_profile_results
    epochs, loops = row(res, 'fit', 'epoch')['Total Time'], row(res, 'fit', 'train')['Total Time'] + row(res, 'fit', 'valid')['Total Time']
    assert epochs - loops == pytest.approx(2.0, abs=1e-9)                                   # both saves, in their epochs
    assert row(res, 'fit', 'fit')['Total Time'] - epochs == pytest.approx(0., abs=1e-9)     # nothing left between the epochs
    assert (tmp_path/'models'/'model_1.pth').exists()

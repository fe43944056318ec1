"""`learn.noise_find()` and the noise record on real Learners: it reads a level that moves between trials (an injected
clock, which load cannot move: each trial's level added to it), leaves the training that follows bit-identical, and a
comparison of one run a side that reads the record stops calling a moved level a change; the command line's `noise`
and `compare --noise`.

The clock is this thread's CPU time plus what `Level` adds, as in `test_compare.py`: what the steps computed, which a
loaded machine's scheduler cannot lengthen, and the level each trial or run is given."""
import json, math, subprocess, sys, time
import numpy as np, torch
from torch import nn
from fastai.basics import Learner, DataLoaders, Callback, CrossEntropyLossFlat
from fastai.callback.schedule import fit_one_cycle  # noqa: F401  (adds Learner.fit_one_cycle)
import fastxtend_prof.all  # noqa: F401  (adds Learner.profile and Learner.noise_find)
from fastxtend_prof.verdicts.compare import compare_profiles
from fastxtend_prof.verdicts.noise import Noise, load_noise
from fastxtend_prof.core.saved import profile_of, save_profile
from conftest import recorder_with
from test_applications import state, differences, run, one_thread  # noqa: F401  (one_thread: a fixture)

class JumpClock:
    "The recorders' clock: this thread's CPU time plus the seconds `Level` added"
    ahead = 0.0
    def __call__(self): return time.thread_time() + self.ahead

CLOCK = JumpClock()
TRIAL_LEVELS = (8e-3, 12e-3, 9e-3, 14e-3, 10e-3, 7e-3)  # s each trial's every train batch adds: the level moving by up to 2x

class Level(Callback):
    "Adds the level of the fit it is in to the recorders' clock in every train batch (`levels`, one a fit, in turn): the machine's speed for a whole trial or run"
    def __init__(self, levels): self.levels, self.fits = levels, 0
    def before_fit(self): self.fits += 1
    def before_batch(self):
        if self.training: CLOCK.ahead += self.levels[(self.fits - 1) % len(self.levels)]

def mlp(cbs=(), n=30, bs=16):
    "A small MLP on random data that is the same for every call"
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n*bs, 16, generator=g), torch.randint(0, 4, (n*bs,), generator=g)
    dls = DataLoaders.from_dsets(list(zip(x, y)), list(zip(x[:2*bs], y[:2*bs])), bs=bs, num_workers=0)
    return Learner(dls, nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), loss_func=CrossEntropyLossFlat(), cbs=list(cbs))

def test_noise_find_reads_the_level_that_moves_between_trials(tmp_path):
    "Six trials, each at its own level: the between-trial spread is the levels', the within-trial error small, the record saved and read back"
    learn = mlp([Level(TRIAL_LEVELS)])
    with recorder_with(CLOCK): n = learn.noise_find(trials=6, batches=20, warmup=1, save=tmp_path/'noise.json', show=False)
    it = np.array(n.levels)
    true = np.std(np.log(np.array(TRIAL_LEVELS) + np.median(it - np.array(TRIAL_LEVELS))), ddof=1)  # the levels over each trial's own work
    assert n.trials == 6 and n.within < 0.05 and 0.7*true < n.between < 1.3*true, (n.levels, n.between, true)
    assert load_noise(tmp_path/'noise.json') == n
    assert n.smallest(1) > n.smallest(5) and (n.runs_for(10) or 99) > 5

def test_noise_find_leaves_the_training_that_follows_bit_identical():
    "Seed, build, fit_one_cycle, (noise_find), fit_one_cycle: the weights and metrics bit-identical with and without it"
    train = lambda find: lambda l: (l.fit_one_cycle(1, 1e-2), find(l), l.fit_one_cycle(1, 1e-2))
    plain = state(run(mlp, train(lambda l: None), False))
    found = state(run(mlp, train(lambda l: l.noise_find(trials=2, batches=5, warmup=1, show=False)), False))
    assert not differences(plain, found), differences(plain, found)[:5]

RUN_LEVELS = (10e-3, 16e-3)  # two runs of the same code, the second at a level 50% higher (as two fits under a changing load)

def test_one_run_a_side_with_the_record_counts_the_machine_between_runs(tmp_path):
    """Two runs of the same code at levels 50% apart: alone, compare does not judge them, and judged within the runs it
    calls the second slower; with a record of trials
    that moved as much, it does not, and says what it counted. A real slowdown many times the record's spread is still
    found through it"""
    def fit(levels, cbs=()):
        learn = mlp([Level(levels), *cbs]).profile(show_report=False)
        with learn.no_logging(), recorder_with(CLOCK): learn.fit(1)
        return profile_of(learn)
    a, b = fit(RUN_LEVELS[:1]), fit(RUN_LEVELS[1:])
    assert compare_profiles(a, b).set_index(['Phase', 'Step']).loc[('train', 'iteration'), 'Result'] == 'not judged'
    assert compare_profiles(a, b, within_run=True).set_index(['Phase', 'Step']).loc[('train', 'iteration'), 'Result'] == 'slower'
    learn = mlp([Level(TRIAL_LEVELS)])
    with recorder_with(CLOCK): n = learn.noise_find(trials=6, batches=20, warmup=1, show=False)
    with_record = compare_profiles(a, b, noise=n)
    it = with_record.set_index(['Phase', 'Step']).loc[('train', 'iteration')]
    assert it.Result == 'no significant change' and 'with the noise record of 6 trials' in with_record.attrs['verdict'], with_record.attrs['verdict']
    much = fit((RUN_LEVELS[0]*20,))   # 20 times the level: far past what the record's spread allows
    assert compare_profiles(a, much, noise=n).set_index(['Phase', 'Step']).loc[('train', 'iteration'), 'Result'] == 'slower'
    save_profile(a, tmp_path/'a.json'); save_profile(b, tmp_path/'b.json')
    from fastxtend_prof.verdicts.noise import save_noise
    save_noise(n, tmp_path/'noise.json')
    cli = lambda *args: subprocess.run([sys.executable, '-m', 'fastxtend_prof', 'compare', *map(str, args)], capture_output=True, text=True, timeout=300)
    plain, counted = cli(tmp_path/'a.json', tmp_path/'b.json', '--fail-on-regression', 10), cli(tmp_path/'a.json', tmp_path/'b.json', '--noise', tmp_path/'noise.json', '--fail-on-regression', 10)
    within = cli(tmp_path/'a.json', tmp_path/'b.json', '--within-run', '--fail-on-regression', 10)
    said = ' '.join(counted.stdout.split())   # the text is wrapped to the terminal's width (CI's: 80 columns)
    assert (plain.returncode, within.returncode, counted.returncode) == (3, 1, 0) and 'noise record' in said, (plain.stdout, within.stdout, counted.stdout + counted.stderr)
    (tmp_path/'bad.json').write_text(json.dumps({'format': 'fastxtend_prof.noise/1', 'levels': [1.0]}))
    bad = cli(tmp_path/'a.json', tmp_path/'b.json', '--noise', tmp_path/'bad.json')
    assert bad.returncode == 2 and bad.stderr.startswith('fastxtend-prof compare: error: `--noise`: ') and len(bad.stderr.splitlines()) == 1, bad.stderr

def test_noise_command_on_the_demo(tmp_path):
    "`fastxtend-prof noise -o PATH`: the trials, the record printed and written; a bad option one line and exit 2"
    p = subprocess.run([sys.executable, '-m', 'fastxtend_prof', 'noise', '--trials', '2', '--batches', '4', '--warmup', '1',
                        '--device', 'cpu', '-o', tmp_path/'n.json'], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and 'between trials' in p.stdout and 'Saved: noise record' in p.stdout, p.stdout + p.stderr
    assert load_noise(tmp_path/'n.json').trials == 2
    bad = subprocess.run([sys.executable, '-m', 'fastxtend_prof', 'noise', '--trials', '1'], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr

def test_a_record_states_what_its_spread_lets_a_comparison_see():
    "The record's figures from its trials alone: a larger spread asks for more runs and sees only larger changes"
    calm, busy = Noise((5e-3, 5.1e-3, 4.9e-3, 5.05e-3), (0.01,)*4, 40), Noise((5e-3, 7e-3, 4e-3, 6e-3), (0.01,)*4, 40)
    assert busy.between > calm.between and busy.smallest(3) > calm.smallest(3) and busy.runs_for(20) > calm.runs_for(20)
    assert math.isnan(Noise((5e-3, 50e-3), (0.01, 0.01), 40).smallest(1)) or Noise((5e-3, 50e-3), (0.01, 0.01), 40).smallest(1) > 100

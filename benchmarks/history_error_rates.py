"""How often `fastxtend-prof history` raises a false alarm, and how often it finds a real slowdown, on real profiled fits.

Series of `--runs` profiled fits, each of a new Learner (the same seed, so the same model and data) and each a run
saved as its JSON file would be, then `history` on the series. A new Learner each run, as each run of a team's history
is a new process: one Learner's fits in a row draw slower and slower (the collate's lower quartile from 297 to 366 us
over five fits on a quiet machine), which a history rightly reports. Two workloads (`--work`):

- `sleep` (the default): each step's work is a known wait (forward 6 ms, backward 8 ms, the optimizer step 4 ms, the
  draw 3 ms a batch, as the test suite emulates work), around fastai's own loop and a linear model's real compute;
- `compute`: a small MLP whose steps are all real compute on the CPU (the loader collates real batches), whose steps
  vary from run to run on a shared machine by more than a sleep does.

In each:

- A/A: `--series` series of identical fits. An alarm is any change point: the share of series with one is the
  false-alarm rate.
- A slowdown: `--series` series in which one step (forward, backward, opt_step or the draw, in turn) takes 10% longer
  from a run drawn at random on (from the third to the third-last): the step's mean time a batch in the series' first
  run, times `--slowdown`, is added to it by a sleep (in the model's forward, in an autograd function's backward, in a
  callback before the optimizer step, in the loader's collate; spinning on the clock, which lasts what it is asked to where a
short sleep overshoots). Found: a change point within one run of the injection
  that names that step (for the draw, its part `wait`, where the loader's collate runs, is named too).

Each series is judged with the history's default `--min-shift` and, on the same runs, with each other value of
`--min-shift` given. Each rate comes with its 95% Clopper-Pearson interval. Then each step's spread between runs (a run
against the one before, the median over the A/A series) as timed and as the history tests it (the iteration's mean
with the run's wait for a core taken out, each part by its lower quartile). `--judge OUT --keep DIR` judges the
series of an earlier run again, with this version's history, without running a fit (its Otava results kept).

Beside it, on the same runs:

- **Apache Otava** (`--otava PYTHON`: a Python with `apache-otava` installed, in an environment of its own, as it pins
  its own numpy and scipy: `python -m venv /tmp/otava && /tmp/otava/bin/pip install apache-otava==0.8.0`), fed each
  step's mean time a batch per run, as its users feed it a benchmark's metric per commit, with its default options
  (e-divisive means, `max_pvalue` 0.001, `window_len` 50). An alarm is any change point in any step; found, one within a
  run of the slowdown in the slowed step's series.
- **`compare`** on the A/A series' consecutive runs (9 pairs a series of 10): how often it says the train iteration
  got slower (its `Result`, thresholds included), against its level `alpha`; and how often its test alone does
  (p under `alpha`, slower). Series of both kinds alternate, so a slow drift of the machine
falls on both. Usage (about 10 minutes on a quiet 2-core machine with the defaults; the `compute` series of 10 runs
about 2 minutes, of 15 about 4, under CI's load: `../shared/tools/under-load -n 2` on 2 cores, or with other jobs
coming and going, `../shared/tools/under-varying-load -n 4`, before `python`):

    python benchmarks/history_error_rates.py --series 30 --runs 10 --work sleep
    python benchmarks/history_error_rates.py --series 20 --runs 15 --work compute --otava /tmp/otava/bin/python --keep K --out K.json
    python benchmarks/history_error_rates.py --judge K.json --keep K
"""
import argparse, json, os, subprocess, tempfile, time
from pathlib import Path
os.environ.setdefault('OMP_NUM_THREADS', '1')
import numpy as np, pandas as pd, torch
from torch import nn
from scipy import stats as sps
from fastai.basics import Learner, DataLoaders, CrossEntropyLossFlat
from fastai.callback.core import Callback
import fastxtend_prof.all  # noqa: F401  (adds `learn.profile`)
from fastxtend_prof.verdicts.history import MIN_SHIFT, change_text, history, series_of
from fastxtend_prof.core.saved import load_profiles
from fastxtend_prof.verdicts.compare import compare_profiles
from fastxtend_prof.core.defaults import ALPHA
from fastxtend_prof.core.saved import save_profile

STEPS = ('forward', 'backward', 'opt_step', 'draw')  # the step a series slows down, in turn
NAMED = {'draw': ('draw', 'wait')}  # the draw's slowdown is in the collate, inside its part `wait` (the loader's work), which the history names

SLEEPS = dict(forward=6e-3, backward=8e-3, opt_step=4e-3, draw=3e-3)  # the `sleep` workload's work a batch, by step

class Extra:
    "The seconds each step waits where it runs: the workload's own (`base`), and the slowdown's on one `step` (0 until it starts)"
    def __init__(self, base:dict|None=None): self.base, self.step, self.seconds = dict(base or {}), None, 0.
    def wait(self, step):
        if self.base.get(step): time.sleep(self.base[step])
        if self.step == step:  # the slowdown spins: a sleep of a fraction of a millisecond overshoots by tens of microseconds, a spin doesn't
            end = time.perf_counter() + self.seconds
            while time.perf_counter() < end: pass

class SleepyBackward(torch.autograd.Function):
    "The identity, whose backward waits `extra`'s seconds when the slowdown is in the backward pass"
    @staticmethod
    def forward(ctx, x, extra): ctx.extra = extra; return x.view_as(x)
    @staticmethod
    def backward(ctx, g): ctx.extra.wait('backward'); return g, None

class Model(nn.Module):
    "A small MLP whose forward and backward each wait `extra`'s seconds when the slowdown is there"
    def __init__(self, extra, width=512):
        super().__init__()
        self.extra = extra
        self.net = nn.Linear(64, 10) if extra.base else nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    def forward(self, x):
        self.extra.wait('forward')
        return SleepyBackward.apply(self.net(x), self.extra)  # on the output: the input needs no gradient, so a function there would never run backward

class WaitBeforeStep(Callback):
    "Waits `extra`'s seconds before the optimizer step (in `opt_step`) when the slowdown is there"
    def __init__(self, extra): self.extra = extra
    def before_step(self): self.extra.wait('opt_step')

def learner(extra, n:int, bs:int=128, seed:int=0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n*bs, 64, generator=g), torch.randint(0, 10, (n*bs,), generator=g)
    def collate(items):
        extra.wait('draw')
        return torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])
    dls = DataLoaders.from_dsets(list(zip(x, y)), list(zip(x[:2*bs], y[:2*bs])), bs=bs, num_workers=0, create_batch=collate)
    return Learner(dls, Model(extra), loss_func=CrossEntropyLossFlat(), cbs=WaitBeforeStep(extra))

def judged(saved:list, step:str|None, at:int|None, min_shift:float) -> dict:
    "The history of `saved` with `min_shift`: any change point (an alarm), and one within a run of `at` naming `step` (found)"
    h = history(saved, min_shift=min_shift)
    found = [c for c in h.changes if step is not None and abs(c.at - at) <= 1 and c.step in NAMED.get(step, (step,))]
    return dict(alarm=bool(h.changes), found=bool(found), changes=[(c.at, c.step, c.p) for c in h.changes], words=[change_text(h, c) for c in h.changes],
                tables=[json.loads(c.table[['Change %', 'p-value', 'Significant']].round(4).to_json(orient='index')) for c in h.changes])

def one_series(runs:int, batches:int, step:str|None, at:int|None, slowdown:float, seed:int, work:str='sleep', min_shifts=(MIN_SHIFT,), keep:Path|None=None) -> dict:
    "`runs` profiled fits of one Learner, each a saved run; from run `at` on, `step` slowed by `slowdown` of its first-run mean; judged at each of `min_shifts` (the first the default)"
    extra = Extra(SLEEPS if work == 'sleep' else None)
    saved, first = [], {}
    for i in range(runs):
        if step is not None and i == at: extra.step, extra.seconds = step, slowdown*first[step]
        # a new Learner each run, as each run of a team's history is a new process: one Learner's fits in a row draw
        # slower and slower (its collate's lower quartile 297 -> 366 us over five fits on a quiet machine)
        learn = learner(extra, batches, seed=seed)
        learn.profile(show_report=False, logger_callback=None, label=f'run{i + 1}')
        with learn.no_logging(): learn.fit(1)
        run = learn.profile_result.saved(learn, full=False)
        saved.append(run)
        if keep: save_profile(run, keep/f'run{i + 1:02d}.json')
        if i == 0: first = {s: float(np.mean(run.distributions[('train', s)])) for s in STEPS}
    return dict(**judge_runs(saved, step, at, min_shifts), **otava_and_compare(saved, step))

def judge_runs(saved:list, step:str|None, at:int|None, min_shifts) -> dict:
    "The history's verdicts on the runs `saved` of one series at each of `min_shifts` (the first the default), and its steps' spreads between runs"
    by = {m: judged(saved, step, at, m) for m in min_shifts}
    spread = {k: {st: float(v) for st, v in col.items()} for k, col in series_of(saved).spread().items()}  # a run against the one before
    return dict(step=step, at=at, **by[min_shifts[0]], spread=spread, by_min_shift={str(m): {k: r[k] for k in ('alarm', 'found')} for m, r in by.items()})

def otava_and_compare(saved:list, step:str|None) -> dict:
    "What Otava is fed (each step's mean a batch, a value a run) and `compare` on consecutive runs of an A/A series"
    names = [k[1] for k in saved[0].distributions if k[0] == 'train']
    means = {st: [float(np.mean(r.distributions[('train', st)])) for r in saved] for st in names}  # what Otava is fed: a metric per step, a value per run
    pairs = [] if step is not None else [compare_profiles(a, b, within_run=True).set_index(['Phase', 'Step']).loc[('train', 'iteration')] for a, b in zip(saved, saved[1:])]
    return dict(means=means, compare=[dict(result=str(c['Result']), p=float(c['p-value']), change=float(c['Change %'])) for c in pairs])

OTAVA = '''
import json, sys
from otava.series import AnalysisOptions, Metric, Series
out = []
for means in json.load(open(sys.argv[1])):
    n = len(next(iter(means.values())))
    s = Series('history', None, list(range(n)), {k: Metric(1, 1.) for k in means}, means, {})
    cps = s.analyze(AnalysisOptions()).change_points
    out.append([(int(cp.index), k) for k, v in cps.items() for cp in v])
print(json.dumps(out))
'''

def otava(python:str, series:list) -> list:
    "Apache Otava's change points `[(index, step)]` of each of `series` (each `{step: [mean a batch, per run]}`), run by `python`, which has it"
    with tempfile.NamedTemporaryFile('w', suffix='.json', delete=False) as f: json.dump(series, f)
    try: r = subprocess.run([python, '-c', OTAVA, f.name], capture_output=True, text=True, timeout=3600)
    finally: os.unlink(f.name)
    if r.returncode: raise RuntimeError(f'otava failed: {r.stderr[-2000:]}')
    return [[tuple(c) for c in cps] for cps in json.loads(r.stdout.strip().splitlines()[-1])]

def rate(k:int, n:int) -> str:
    "`k` of `n` as a percentage with its 95% Clopper-Pearson interval"
    ci = sps.binomtest(k, n).proportion_ci(0.95, method='exact')
    return f'{k}/{n} = {100*k/n:.1f}% (95% CI {100*ci.low:.1f}% to {100*ci.high:.1f}%)'

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--series', type=int, default=30, help='series of each kind (default: 30)')
    p.add_argument('--runs', type=int, default=10, help='profiled fits a series (default: 10)')
    p.add_argument('--batches', type=int, default=30, help='train batches a fit (default: 30)')
    p.add_argument('--slowdown', type=float, default=0.10, help="the slowdown, a share of the step's time (default: 0.10)")
    p.add_argument('--work', choices=('sleep', 'compute'), default='sleep', help="each step's work: a known wait, or an MLP's real compute (default: sleep)")
    p.add_argument('--min-shift', type=float, nargs='+', default=[MIN_SHIFT, 8., 3., 0.],
                   help=f'the history\'s --min-shift: the first judges the series, each is reported on the same runs (default: {MIN_SHIFT:g} 8 3 0)')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', help='write every series as JSON here')
    p.add_argument('--keep', help="save every run's file in this folder (a folder a series: aa-07/, slowdown-07/), to judge the series again with `fastxtend-prof history`")
    p.add_argument('--judge', metavar='OUT', help="judge again, with this version's history, the series of an earlier run: its --out JSON, with its --keep folder given as --keep (no fits run; its Otava results kept)")
    p.add_argument('--otava', metavar='PYTHON', help='a Python with apache-otava installed: judge the same runs with Apache Otava too')
    a = p.parse_args()
    torch.set_num_threads(1)
    rng, t0, aa, ab = np.random.default_rng(a.seed), time.time(), [], []
    if a.judge:
        if not a.keep: p.error('--judge needs the earlier run\'s --keep folder')
        old = json.loads(Path(a.judge).read_text())
        for k in ('series', 'runs', 'batches', 'slowdown', 'work'): setattr(a, k, old['args'][k])
        for kind, rows, into in (('aa', old['aa'], aa), ('slowdown', old['slowdown'], ab)):
            for i, r in enumerate(rows):
                saved = load_profiles(sorted(str(f) for f in Path(a.keep, f'{kind}-{i + 1:02d}').glob('run*.json')))
                into.append({**r, **judge_runs(saved, r['step'], r['at'], a.min_shift)})
        a.otava = None
    else: learner(Extra(SLEEPS if a.work == 'sleep' else None), 4).fit(1)  # the process's first fit pays one-off costs
    for i in range(0 if a.judge else a.series):
        keep = lambda kind: Path(a.keep, f'{kind}-{i + 1:02d}') if a.keep else None
        aa.append(one_series(a.runs, a.batches, None, None, a.slowdown, i, a.work, a.min_shift, keep('aa')))
        step, at = STEPS[i % len(STEPS)], int(rng.integers(2, a.runs - 2))
        ab.append(one_series(a.runs, a.batches, step, at, a.slowdown, i, a.work, a.min_shift, keep('slowdown')))
        print(f'series {i + 1}/{a.series}: A/A {"ALARM " + str(aa[-1]["changes"]) if aa[-1]["alarm"] else "quiet"}; '
              f'{step} +{a.slowdown:.0%} from run {at + 1}: {"found" if ab[-1]["found"] else "MISSED " + str(ab[-1]["changes"])} ({time.time() - t0:.0f} s)', flush=True)
    print(f'\n{a.work} workload: {a.series} series of {a.runs} fits ({a.batches} train batches each) of each kind, {time.time() - t0:.0f} s, torch {torch.__version__}')
    print(f'With --min-shift {a.min_shift[0]:g} (the default):')
    print(f'A/A false alarms (any change point): {rate(sum(r["alarm"] for r in aa), len(aa))}')
    print(f'{a.slowdown:.0%} slowdown of one step found within one run and named: {rate(sum(r["found"] for r in ab), len(ab))}')
    for s in STEPS:
        rs = [r for r in ab if r['step'] == s]
        if not rs: continue
        moved = [t[n]['Change %'] for r in rs for c, t in zip(r['changes'], r['tables']) if r['found'] for n in NAMED.get(s, (s,))[-1:] if c[1] in NAMED.get(s, (s,))]
        print(f'  {s}: {rate(sum(r["found"] for r in rs), len(rs))}' + (f'; measured {np.median(moved):+.1f}% (median of its own time\'s change)' if moved else ''))
    for m in a.min_shift[1:]:
        k = str(m)
        print(f'With --min-shift {m:g}: A/A false alarms {rate(sum(r["by_min_shift"][k]["alarm"] for r in aa), len(aa))}; '
              f'found {rate(sum(r["by_min_shift"][k]["found"] for r in ab), len(ab))}')
    timed, tested = (pd.DataFrame([r['spread'][k] for r in aa]).median() for k in ('Timed %', 'Level %'))
    print("Spread between runs (a run against the one before, log scale; median over the A/A series), as timed -> as the history reads it "
          "(the iteration's wait for a core taken out, each part by its lower quartile):")
    print('  ' + ', '.join(f'{st} {timed[st]:.1f}% -> {tested[st]:.1f}%' for st in tested.index))
    cmp = [c for r in aa for c in r['compare']]
    slower, test = sum(c['result'] == 'slower' for c in cmp), sum(c['p'] < ALPHA and c['change'] > 0 for c in cmp)
    print(f'compare on consecutive A/A runs (level {ALPHA:g}): says slower {rate(slower, len(cmp))}; its test alone, slower {rate(test, len(cmp))}')
    if any('otava' in r for r in aa + ab) and not a.otava:
        hit = lambda r: any(abs(i - r['at']) <= 1 and st in NAMED.get(r['step'], (r['step'],)) for i, st in r['otava'])
        print(f"Apache Otava 0.8.0 (the earlier run's) on the same runs: A/A false alarms {rate(sum(bool(r['otava']) for r in aa), len(aa))}; "
              f"found and in the slowed step's series {rate(sum(hit(r) for r in ab), len(ab))}")
    if a.otava:
        cps = otava(a.otava, [r['means'] for r in aa + ab])
        for r, c in zip(aa + ab, cps): r['otava'] = c
        hit = lambda r: any(abs(i - r['at']) <= 1 and st in NAMED.get(r['step'], (r['step'],)) for i, st in r['otava'])
        print(f"Apache Otava 0.8.0 (defaults: max_pvalue 0.001, window 50) on the same runs: A/A false alarms {rate(sum(bool(r['otava']) for r in aa), len(aa))}; "
              f"found and in the slowed step's series {rate(sum(hit(r) for r in ab), len(ab))}")
    if a.out: Path(a.out).write_text(json.dumps(dict(args=vars(a), aa=aa, slowdown=ab), indent=1))

if __name__ == '__main__': main()

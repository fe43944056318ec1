"""How often `compare_profiles` calls a change where there is none, and how often it finds one that is there.

Each trial profiles two Learners of identical code fitting in turn (the way `tests/test_compare.py` does), optionally
with a known busy delay before each optimizer step of the second, and compares them three ways: with the defaults
(`alpha` 0.01, `min_change` 5%, `min_share` 2%, judged within the runs), with the test alone (both thresholds at zero), and with `min_change`
alone. It prints, per setting, in how many trials the train iteration was called significant and how many of the
train step rows were.

    python benchmarks/compare_false_positives.py --trials 20            # identical runs: the false-positive rate
    python benchmarks/compare_false_positives.py --trials 10 --delay 4  # 4 ms in opt_step: the detection rate
"""
import argparse, pathlib, sys, time
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]/'tests'))
import pandas as pd, torch
from test_compare import interleaved, SpinInStep   # the same Learners and alternation as the acceptance test
from fastxtend_prof.verdicts.compare import compare_profiles

# one run a side: judged on the noise inside the runs (`within_run`), which is what this measures; alone it is not judged
SETTINGS = {'defaults': dict(within_run=True), 'min_change only': dict(min_share=0, within_run=True),
            'test only': dict(min_change=0, min_share=0, within_run=True)}
STEPS = ['draw', 'forward', 'loss', 'backward', 'opt_step', 'zero_grad', 'other']

def trial(delay_s:float) -> dict:
    a, b = interleaved(b_cbs=[SpinInStep(delay_s)] if delay_s else [])
    out = {}
    for name, kw in SETTINGS.items():
        t = compare_profiles(a, b, **kw)
        t = t[t.Phase == 'train'].set_index('Step')
        out[name] = dict(iteration=bool(t.loc['iteration', 'Significant']),
                         steps=[s for s in STEPS if t.loc[s, 'Significant']],
                         change=float(t.loc['iteration', 'Change %']))
    return out

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--trials', type=int, default=20)
    ap.add_argument('--delay', type=float, default=0., help='ms spun before each optimizer step of the second Learner (0: identical runs)')
    a = ap.parse_args()
    torch.set_num_threads(1)
    t0, rows = time.time(), []
    for i in range(a.trials):
        r = trial(a.delay/1e3)
        rows.append(r)
        print(f"trial {i+1:2}: iteration {r['defaults']['change']:+6.1f}%  " +
              '  '.join(f"{n}: {'it ' if v['iteration'] else ''}{','.join(v['steps']) or '-'}" for n, v in r.items()), flush=True)
    n = len(rows)
    summary = pd.DataFrame({name: {'iteration significant': f"{sum(r[name]['iteration'] for r in rows)}/{n}",
                                   'step rows significant': f"{sum(len(r[name]['steps']) for r in rows)}/{n*len(STEPS)}",
                                   'opt_step significant': f"{sum('opt_step' in r[name]['steps'] for r in rows)}/{n}",
                                   'other steps significant': f"{sum(len(set(r[name]['steps']) - {'opt_step'}) for r in rows)}/{n*(len(STEPS) - 1)}"}
                            for name in SETTINGS})
    print(f"\n{n} trials, delay {a.delay:g} ms in opt_step, {time.time() - t0:.0f} s\n")
    print('| | ' + ' | '.join(summary.columns) + ' |\n|---|' + '---:|'*len(summary.columns))
    for k, r in summary.iterrows(): print(f'| {k} | ' + ' | '.join(r) + ' |')

if __name__ == '__main__': main()

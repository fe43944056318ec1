"""How long `fastxtend-prof history` takes on a long history: `--runs` saved runs of `--batches` train batches each (made
up: a typical train step's parts, each batch 5% apart, each run's machine 2% apart, the forward 30% slower from the
middle run on), written to a folder, then the command as a CI job runs it, interpreter start included:
`fastxtend-prof history FOLDER --fail-on-regression 10`, timed (wall clock), with how long reading the files and
finding the change points took in-process beside it.

    python benchmarks/history_scale.py                        # 1,000 runs of 2,000 batches
    python benchmarks/history_scale.py --runs 300 --batches 500
"""
import argparse, os, subprocess, sys, tempfile, time
from dataclasses import replace
from pathlib import Path
import numpy as np
from fastxtend_prof.core.saved import load_profile, load_profiles, save_profile
from fastxtend_prof.verdicts.history import gate, history

MS = dict(draw=1.0, forward=4.0, loss=0.3, backward=5.0, opt_step=1.0, zero_grad=0.2, other=0.5)  # milliseconds a batch

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--runs', type=int, default=1000)
    p.add_argument('--batches', type=int, default=2000)
    p.add_argument('--seed', type=int, default=0)
    a = p.parse_args()
    base = load_profile(Path(__file__).parents[1]/'tests'/'data'/'v2_stages.json')
    rng = np.random.default_rng(a.seed)
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        for i in range(a.runs):
            m, slow = rng.lognormal(0, 0.02), 1.3 if i >= a.runs//2 else 1.
            dist = {('train', s): ms*1e-3*m*(slow if s == 'forward' else 1.)*rng.lognormal(0, 0.05, a.batches) for s, ms in MS.items()}
            dist[('train', 'iteration')] = sum(dist[('train', s)] for s in MS)
            meta = {**base.metadata, 'label': f'r{i + 1:05d}', 'timestamp': '2026-01-01T00:00:00+00:00'}
            save_profile(replace(base, distributions=dist, metadata=meta), Path(d)/f'r{i + 1:05d}.json')
        size = sum(f.stat().st_size for f in Path(d).iterdir())/1e6
        print(f'{a.runs:,} runs of {a.batches:,} batches written ({size:,.0f} MB) in {time.perf_counter() - t:.1f} s')
        t = time.perf_counter()
        cmd = subprocess.run([sys.executable, '-m', 'fastxtend_prof', 'history', d, '--fail-on-regression', '10'], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONWARNINGS='ignore'))
        wall = time.perf_counter() - t
        gate_line = next((l for l in cmd.stdout.splitlines() if l.startswith('gate:')), cmd.stderr.strip()[-300:])
        print(f'fastxtend-prof history {a.runs:,} runs --fail-on-regression 10: {wall:.1f} s, exit {cmd.returncode}\n  {gate_line[:200]}')
        t = time.perf_counter(); runs = load_profiles([d]); read = time.perf_counter() - t
        t = time.perf_counter(); h = history(runs); search = time.perf_counter() - t
        print(f'in-process: reading the files {read:.1f} s, the change points and the latest run {search:.1f} s '
              f'({len(h.changes)} change point(s): ' + ', '.join(f'before run {c.at + 1}, {c.step}' for c in h.changes) + f'); gate: {gate(h, 10).kind}')

if __name__ == '__main__': main()

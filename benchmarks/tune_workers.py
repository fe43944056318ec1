"""How good `speed_find`'s worker prediction is: measured means of the train iteration against the prediction.

The run of the issue and of `tests/test_tune.py`: items that busy-wait `--item` seconds each, batches of `--bs`, a model
whose forward busy-waits `--compute` seconds. For each worker count it runs `--repeats` profiled trials (the tuner's own
`run_trial`, workers set in place, interleaved so a busy spell hits every count alike) and prints the median over the
repeats of each trial's mean train iteration (the batch over it is the samples/s), next to what `predict_workers` says from the 0-worker trial. Then it
runs `learn.speed_find()` once and prints its table.

    python benchmarks/tune_workers.py                      # 0..3 workers, 5 repeats
"""
import argparse, math, sys, warnings
from pathlib import Path
import numpy as np, torch
sys.path.insert(0, str(Path(__file__).parents[1]/'tests'))
warnings.simplefilter('ignore')

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--item', type=float, default=1.5e-3, help='seconds of CPU per item (default: 1.5e-3)')
    p.add_argument('--bs', type=int, default=8)
    p.add_argument('--compute', type=float, default=1e-3, help="seconds of the model's forward (default: 1e-3)")
    p.add_argument('--workers', type=int, default=3, help='largest worker count measured (default: 3)')
    p.add_argument('--repeats', type=int, default=5)
    a = p.parse_args()
    import fastxtend_prof.all  # noqa: F401
    from fastxtend_prof.tune.search import run_trial, steady_times, predict_workers, set_num_workers, cores, LearnerState, set_aside, _measured, probe_handoff
    from fastxtend_prof.core.recorder import Step
    import test_tune as t
    t.BS = a.bs
    torch.set_num_threads(1)
    learn = t.busy_learner(item=a.item, compute=a.compute)
    state, medians = LearnerState(learn), {k: [] for k in range(a.workers + 1)}
    with learn.removed_cbs(set_aside(learn)):
        for _ in range(a.repeats):
            for k in medians:
                undo = set_num_workers(learn, k)
                prof = run_trial(learn, 40, 3, math.inf)
                undo()
                medians[k].append((steady_times(prof.results), _measured(prof)['Mean']))
    state.restore()
    handoff, receive = probe_handoff(learn)  # this machine's hand-over of this loader's batch, as speed_find measures it
    it = np.median([m[Step.ITERATION] for m, _ in medians[0]])
    wait = np.median([m[Step.WAIT] for m, _ in medians[0]])
    print(f'items {a.item*1e3:g} ms, bs {a.bs}, compute {a.compute*1e3:g} ms, {cores()} cores, {a.repeats} repeats (medians of each trial\'s mean); '
          f'a hand-over costs a worker {handoff*1e3:.2f} ms and the loop {receive*1e3:.2f} ms (probe_handoff)')
    print(f"{'workers':>8} {'measured':>10} {'predicted':>10} {'error':>7}")
    for k, ms in medians.items():
        meas = np.median([mean for _, mean in ms])
        pred = predict_workers(wait, it, 0, k, cores(), handoff=handoff, receive=receive)
        print(f'{k:>8} {meas*1e3:>8.2f}ms {pred*1e3:>8.2f}ms {100*(meas/pred - 1):>+6.0f}%')
    print()
    learn.speed_find(max_time=60)

if __name__ == '__main__': main()

"""What timing the ranks' arrivals costs a data-parallel fit: the all-reduce hook, the offsets, the analysis.

Runs `--world` gloo ranks on the CPU (one process group), each a balanced fastai `Learner` (the model of
`ddp_straggler.py`, wrapped in `DistributedDataParallel`), and alternates profiled fits with the arrivals timed
and with them switched off (`learn.profile(arrivals=False)`: no hook on the model, DDP's built-in all-reduce),
`--repeats` of each. It prints, per setting, the
median over the repeats of rank 0's mean train iteration, the ratio of the two, and what the fit's end (packing,
sending and analysing the arrivals) took on rank 0.

    python benchmarks/arrival_cost.py                 # 2 ranks, 200 batches, 5 repeats
"""
import argparse, os, pickle, sys, tempfile, time, traceback
from datetime import timedelta
from pathlib import Path
import numpy as np, torch
import torch.distributed as dist
import torch.multiprocessing as mp
sys.path.insert(0, str(Path(__file__).parent))
import ddp_straggler as bench  # noqa: E402

def worker(rank, world, port, out, a):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    rec = {'on': [], 'off': [], 'end_on': [], 'end_off': []}
    try:
        import fastxtend_prof.all  # noqa: F401  (Learner.profile)
        from fastxtend_prof.profiler.simpleprofiler import SimpleProfilerCallback
        dist.init_process_group('gloo', rank=rank, world_size=world, timeout=timedelta(seconds=120))
        for i in range(2*a.repeats):
            mode = ('on', 'off')[i % 2]
            learn = bench.learner(rank, 'none', a)
            learn.profile(show_report=False, arrivals=mode == 'on')
            t = {}
            report = SimpleProfilerCallback._report
            def timed(self, learn, exc=None):
                t0 = time.perf_counter()
                report(self, learn, exc)
                t['end'] = time.perf_counter() - t0
            SimpleProfilerCallback._report = timed
            try: learn.fit(1)
            finally: SimpleProfilerCallback._report = report
            res = learn.simple_profile_results
            it = res[(res.Phase == 'train') & (res.Step == 'iteration')]['Mean Duration'].iloc[0]
            rec[mode].append(float(it)); rec['end_' + mode].append(t['end'])
    except BaseException: rec['error'] = traceback.format_exc()
    finally:
        if dist.is_initialized(): dist.destroy_process_group()
        Path(out, f'rank{rank}.pkl').write_bytes(pickle.dumps(rec))

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--world', type=int, default=2)
    p.add_argument('--batches', type=int, default=200)
    p.add_argument('--bs', type=int, default=8)
    p.add_argument('--repeats', type=int, default=5)
    a = p.parse_args()
    a.delay = 0.
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(worker, args=(a.world, bench.free_port(), d, a), nprocs=a.world, start_method='spawn')
        recs = [pickle.loads(Path(d, f'rank{r}.pkl').read_bytes()) for r in range(a.world)]
    for r, rec in enumerate(recs):
        if 'error' in rec: print(f'rank {r} failed:\n{rec["error"]}'); return 1
    r0 = recs[0]
    on, off = np.median(r0['on']), np.median(r0['off'])
    print(f'{a.world} gloo ranks, {a.batches} train batches of {a.bs}, {a.repeats} repeats (rank 0, medians)')
    print('| arrivals | train iteration | fit end (report) |\n|---|---|---|')
    print(f"| off | {off*1e3:.3f} ms | {np.median(r0['end_off'])*1e3:.1f} ms |")
    print(f"| on  | {on*1e3:.3f} ms | {np.median(r0['end_on'])*1e3:.1f} ms |")
    print(f'ratio on/off: {on/off:.3f}x (per-repeat on: {", ".join(f"{x*1e3:.3f}" for x in r0["on"])}; off: {", ".join(f"{x*1e3:.3f}" for x in r0["off"])} ms)')
    return 0

if __name__ == '__main__': sys.exit(main())

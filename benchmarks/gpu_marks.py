"""What the device-event path costs on a CUDA GPU, call by call: one event's first record (which creates it) and a
later one, the calls the recorder makes (through `torch.cuda.Event`'s Python methods and through the C methods they
wrap), an allocator reading, and a batch of the recorder's marks (11 events a train batch, then read), for this
checkout and, with `--base`, another one, each in a process of its own.

    python benchmarks/gpu_marks.py
    python benchmarks/gpu_marks.py --base /tmp/base       # a checkout of the version before (git worktree add /tmp/base HEAD~1)
"""
import argparse, os, subprocess, sys, time, timeit

MARKS = r'''
import time, torch
from fastxtend_prof.core.recorder import *
def batch(r):
    r.draw(); r.draw_mark(AFTER_LOAD); r.draw_mark(BEFORE_TFMS); r.draw_mark(AFTER_TFMS); r.start_batch(64)
    for x in (AFTER_PRED, AFTER_LOSS, BEFORE_BACKWARD, BEFORE_STEP, AFTER_STEP, PRE_AFTER_BATCH): r.mark(x)
    r.end_batch()
out = []
for fit in range(3):  # three fits in one process: the first makes its events, later ones may reuse them
    r = EventRecorder(TorchEventTimer('cuda')); r.start(Step.FIT); r.begin_phase(Phase.TRAIN)
    n = 1000; t = time.perf_counter()
    for _ in range(n): batch(r)
    dt = time.perf_counter() - t
    r.end_phase(); r.stop(Step.FIT)
    out.append(f'{1e6*dt/n:.1f}')
print(', '.join(out))
'''

def us(stmt, g, n=2000): return 1e6*min(timeit.repeat(stmt, number=n, repeat=5, globals=g))/n

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--base', help='another checkout of this repository, measured the same way')
    a = p.parse_args()
    import torch
    if not torch.cuda.is_available(): return print('no CUDA device: gpu_marks.py measures the device-event path on a GPU')
    torch.cuda.init(); s = torch.cuda.current_stream()
    C = torch._C._CudaEventBase
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2000)]
    t = time.perf_counter()
    for e in ev[:1000]: C.record(e, s)
    first = (time.perf_counter() - t)/1000
    t = time.perf_counter()
    for e in ev[:1000]: C.record(e, s)
    again = (time.perf_counter() - t)/1000
    torch.cuda.synchronize()
    g = dict(torch=torch, s=s, e=ev[0], f=ev[1], C=C)
    rows = [('an event\'s first record (creates it)', first*1e6), ('a record of an existing event', again*1e6),
            ('Event.record(stream)', us('e.record(s)', g)), ('the C method (_CudaEventBase.record)', us('C.record(e, s)', g)),
            ('Event.record() without a stream', us('e.record()', g)), ('Event.elapsed_time', us('e.elapsed_time(f)', g)),
            ('the C method (elapsed_time)', us('C.elapsed_time(e, f)', g)), ('the C method (query)', us('C.query(e)', g)),
            ('torch._C._cuda_memoryStats', us('torch._C._cuda_memoryStats(0)', g, 500)),
            ('torch.cuda.memory_allocated', us('torch.cuda.memory_allocated(0)', g, 500))]
    print(torch.cuda.get_device_name(), 'torch', torch.__version__)
    for what, v in rows: print(f'{what:<42} {v:8.2f} µs')
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name, path in [('this checkout', here)] + ([('base', a.base)] if a.base else []):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(path), os.environ.get('PYTHONPATH', '')]))
        r = subprocess.run([sys.executable, '-c', MARKS], env=env, capture_output=True, text=True)
        print(f'a batch of marks, {name}: ' + (r.stdout.strip() + ' µs (fits 1, 2, 3)' if r.returncode == 0 else 'failed: ' + r.stderr[-400:]))

if __name__ == '__main__': main()

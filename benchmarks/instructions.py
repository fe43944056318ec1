"""What importing and using the package costs a fit, in CPU instructions a batch: deterministic whatever the machine's load.

Wall time on a shared 2-core machine moves by more than the costs this measures (tens of thousands of instructions a
batch, 1% of a tiny fit's), so this counts instructions instead, with valgrind's callgrind: each configuration runs in a
process of its own under valgrind, fits fastai's `synth_learner` (40 train and 4 valid batches of 16, two epochs, one
torch thread, no progress bar, no logging) once to warm up, then once more, counting the instructions of fastai's epoch
loop (`Learner._do_fit`: every batch and epoch event, not `before_fit` or `after_fit`) and nothing else: a small C helper,
compiled here, turns callgrind's instrumentation on and off around it. `PYTHONHASHSEED` is fixed, so a configuration
counts nearly the same on every run (two runs of one configuration: 6,700 instructions a batch apart, 0.12%). That
spread is where memory lands: with address space randomization off (`--no-aslr`, `setarch -R`) a configuration counts
the same to 80-1,000 instructions a batch run to run, but two checkouts that differ in nothing the counted loop runs
differed by 7,800 (0.14%): one fixed layout, not the code. CPython's method cache, for one, is indexed by the
attribute name's address. So the import's cost is the median of several counts with randomization on (`--repeats`). The garbage collector is switched off while
counting (after a full collection): whether one of its full collections fell inside the counted loop or not swung a
configuration by 1.4 million instructions a batch (26% of fastai's own), from one run to the next with nothing of the
loop changed. What importing costs the collector instead is the objects it tracks, the last column: each full
collection visits them all.

- `fastai`: fastai alone, the package not imported;
- `imported`: after `import fastxtend_prof.all`, a fit nothing profiles: what the package costs a user who imported it
  and is not profiling (the promise: nothing measurable; the bar: 0.3% of fastai's own instructions a batch);
- `unpatched`: after the import, with every change the package made to fastai undone (`events.uninstall()`): the
  import's footprint alone (more objects, types and names in the interpreter's caches), none of its patches, which
  `imported` less `unpatched` is;
- `floor`: after the import, the cheapest honest profiler of this kind: the loop that emits `before_draw` plus two bare
  callbacks appending `perf_counter()` at every per-batch event (as in `overhead.py` and `hot_path.py`);
- `profiled`: after the import, `learn.profile()` with its defaults (no report printed, no logger).

The table gives each configuration's instructions a batch, what it adds to `fastai`, that as a share of `fastai`'s,
and `profiled`'s added cost over the floor's (the bar: 0.80).

    python benchmarks/instructions.py                       # needs valgrind and a C compiler (valgrind's callgrind.h)
    git worktree add /tmp/before HEAD~1 && python benchmarks/instructions.py --base /tmp/before   # before/after
    python benchmarks/instructions.py --json instructions.json
    python benchmarks/instructions.py --configs imported --repeats 3   # the import's cost, each count thrice: medians

With `--base`, each configuration that imports the package also runs with that checkout's package (`base:imported`,
...), and the table shows both.
"""
import argparse, json, math, os, platform, re, shutil, subprocess, sys, tempfile
import numpy as np
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
N_TRN, N_VAL, EPOCHS = 40, 4, 2
CONFIGS = ('fastai', 'imported', 'unpatched', 'floor', 'profiled')

HELPER = r'''
#include <valgrind/callgrind.h>
void fxp_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void fxp_stop(void) { CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
'''

CHILD = r'''
import ctypes, gc, sys
import torch
torch.set_num_threads(1)
config, helper, n_trn, n_val, epochs = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
cg = ctypes.CDLL(helper)
if config != 'fastai': import fastxtend_prof.all  # noqa: F401
if config == 'unpatched':
    try: from fastxtend_prof.core import events
    except ImportError: from fastxtend_prof import events  # a --base checkout from before the folders
    events.uninstall()
    assert not events.patched()
from fastai.test_utils import synth_learner
from fastai.callback.progress import ProgressCallback

sys.path.insert(0, sys.argv[6])
from overhead import floor_callbacks  # the floor's two callbacks, as overhead.py times them

learn = synth_learner(n_trn=n_trn, n_val=n_val)
learn.remove_cb(ProgressCallback)

def fit(counted):
    if config == 'floor': learn.add_cbs(floor := floor_callbacks())
    if config == 'profiled': learn.profile(show_report=False, logger_callback=None)
    do_fit = learn._do_fit
    def loop():
        if counted:  # the collector off while counting: a full collection landing in the window or not would swing it by 1.4M a batch
            gc.collect(); gc.disable()
            print('tracked', len(gc.get_objects()), file=sys.stderr)
            cg.fxp_start()
        try: do_fit()
        finally:
            if counted: cg.fxp_stop(); gc.enable()
    learn._do_fit = loop
    try:
        with learn.no_logging(): learn.fit(epochs)
    finally:
        del learn._do_fit
        if config == 'floor': learn.remove_cbs(floor)

fit(False)  # warm up every path: the first fit pays one-off costs (allocator, lazy imports)
fit(True)
'''

def build_helper(where:Path) -> Path:
    "The C helper that switches callgrind's instrumentation on and off, compiled into `where`"
    cc = shutil.which(os.environ.get('CC', 'cc')) or shutil.which('gcc')
    if shutil.which('valgrind') is None or cc is None: sys.exit('this benchmark needs valgrind and a C compiler (apt-get install valgrind gcc)')
    (where/'helper.c').write_text(HELPER)
    out = where/'libfxp_callgrind.so'
    p = subprocess.run([cc, '-shared', '-fPIC', '-O0', '-o', str(out), str(where/'helper.c')], capture_output=True, text=True)
    if p.returncode: sys.exit(f"could not compile the callgrind helper (valgrind's headers: valgrind/callgrind.h):\n{p.stderr}")
    return out

def count(config:str, package:Path, helper:Path, where:Path, repeat:int=0) -> float:
    "Instructions a batch of fastai's epoch loop in `config`, with the package at `package` (a checkout's root); `repeat`: which count of several"
    tag = f'{config}-{abs(hash(str(package)))}-{repeat}'
    out = where/f'callgrind.{tag}'
    env = dict(os.environ, PYTHONHASHSEED='0', OMP_NUM_THREADS='1', PYTHONPATH=str(package), PYTHONWARNINGS='ignore')
    # `--no-aslr`: address space randomization off (`setarch -R`)
    aslr = ['setarch', platform.machine(), '-R'] if NO_ASLR else []
    cmd = [*aslr, 'valgrind', '--tool=callgrind', '--instr-atstart=no', f'--callgrind-out-file={out}.%p',
           sys.executable, '-c', CHILD, config, str(helper), str(N_TRN), str(N_VAL), str(EPOCHS), str(ROOT/'benchmarks')]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=where, env=env)
    if p.returncode: sys.exit(f'{config} failed under valgrind:\n{p.stderr[-3000:]}')
    dumps = [f for f in where.glob(f'callgrind.{tag}.*') if re.search(r'\.\d+\.\d+$', f.name)]  # the counted loop's dump
    if len(dumps) != 1: sys.exit(f'{config}: expected one callgrind dump, found {[f.name for f in dumps]}')
    total = int(re.search(r'^summary:\s*(\d+)', dumps[0].read_text(), re.M).group(1))
    TRACKED[(config, str(package))] = int(re.search(r'^tracked (\d+)$', p.stderr, re.M).group(1))
    return total/(EPOCHS*(N_TRN + N_VAL))

NO_ASLR = False  # `--no-aslr`
TRACKED = {}  # (config, package) -> objects the garbage collector tracks as the counted loop starts

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--base', type=Path, help="another checkout's root: its package is counted beside this one's")
    ap.add_argument('--json', type=Path, help='also write the counts here')
    ap.add_argument('--configs', nargs='+', choices=CONFIGS, default=[c for c in CONFIGS if c != 'unpatched'], help="which to count (`fastai` always: the others are read against it)")
    ap.add_argument('--repeats', type=int, default=1, help='count each configuration this many times: the table gives the median, and the spread (max - min) where more than one')
    ap.add_argument('--no-aslr', action='store_true', help="address space randomization off (setarch -R): each count reproducible, but one layout's")
    a = ap.parse_args()
    global NO_ASLR
    NO_ASLR = a.no_aslr
    if a.no_aslr and shutil.which('setarch') is None: ap.error('--no-aslr needs setarch (util-linux)')
    if a.repeats < 1: ap.error('--repeats must be at least 1')
    configs = ['fastai', *(c for c in CONFIGS if c in a.configs and c != 'fastai')]
    runs = [(c, ROOT) for c in configs] + ([(f'base:{c}', a.base.resolve()) for c in configs[1:]] if a.base else [])
    jobs = [(n, p, i) for n, p in runs for i in range(a.repeats)]
    with tempfile.TemporaryDirectory() as d:
        where = Path(d)
        helper = build_helper(where)
        with ThreadPoolExecutor(os.cpu_count() or 2) as ex:  # instruction counts do not depend on what runs beside
            counts = list(ex.map(lambda j: count(j[0].removeprefix('base:'), j[1], helper, where, j[2]), jobs))
    every = {n: [v for (m, _, _), v in zip(jobs, counts) if m == n] for n, _ in runs}
    got = {n: float(np.median(v)) for n, v in every.items()}
    plain = got['fastai']
    print(f'Instructions a batch of fastai\'s epoch loop (synth_learner, {N_TRN}+{N_VAL} batches of 16, {EPOCHS} epochs)'
          + (f', the median of {a.repeats} counts each:' if a.repeats > 1 else ':'))
    print(f'{"configuration":<18}{"instructions":>14}{"added":>12}{"of fastai":>11}{"× floor":>9}{"gc objects":>12}'
          + (f'{"spread":>10}' if a.repeats > 1 else ''))
    for name, v in got.items():
        added = v - plain
        floor = got.get('base:floor' if name.startswith('base:') else 'floor', math.nan) - plain
        ratio = f'{added/floor:.2f}' if name.endswith('profiled') and floor == floor else ''
        tracked = TRACKED[(name.removeprefix('base:'), str(a.base.resolve() if name.startswith('base:') else ROOT))]
        spread = f'{max(every[name]) - min(every[name]):>10,.0f}' if a.repeats > 1 else ''
        print(f'{name:<18}{v:>14,.0f}{added:>+12,.0f}{added/plain:>+10.2%}{ratio:>9}{tracked:>12,}{spread}')
    if a.json: a.json.write_text(json.dumps(dict(per_batch=got, every=every, batches=EPOCHS*(N_TRN + N_VAL)), indent=1))

if __name__ == '__main__': main()

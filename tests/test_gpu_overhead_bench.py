"benchmarks/gpu_overhead.py on a CPU machine: the no-CUDA message, and the --smoke run of the whole harness"
import subprocess, sys
from pathlib import Path
import pytest, torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ['benchmarks/gpu_overhead.py']
CONFIGS = ['none', 'host', 'events', 'device']

def run(*args, timeout=120):
    return subprocess.run([sys.executable, *BENCH, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)

@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the message given where there is no CUDA device')
def test_no_cuda_says_so_and_exits_0():
    r = run(timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and 'CUDA' in lines[0], r.stdout
    assert 'Traceback' not in r.stderr, r.stderr

# The smoke run asserts nothing about time: its timeout only stops a harness that hangs (a worker that never answers). It
# costs about 50 s of CPU (8 workers importing torch and fastai side by side, 2 warm-up fits each), which a loaded machine
# spreads over as long as its load decides: 150 s ran out at a load of about 13 on 2 cores after both rounds had finished.
# The guard is set far from that, against a hang, not a slow machine
HANG = 600

def test_smoke_runs_both_workloads_every_config():
    # fastxtend left out: two more workers would add ~10 s; one round is enough to exercise the harness
    r = run('--smoke', '--rounds', '1', '--configs', *CONFIGS, timeout=HANG)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.splitlines()
    assert any('CPU SMOKE RUN' in l for l in out), r.stdout
    assert any(l.split() == CONFIGS for l in out), r.stdout  # the table header: one column per configuration
    for w in ('mlp', 'cnn'): assert len(next(l for l in out if l.startswith(f'{w} loop spread')).split()) == 3 + len(CONFIGS), r.stdout
    for w in ('mlp', 'cnn'):
        ms = next(l for l in out if l.startswith(f'{w} ms/batch')).split()[2:]
        for what in ('loop', 'fit'):
            ratio = next(l for l in out if l.startswith(f'{w} {what} × none')).split()[4:]
            assert len(ms) == len(ratio) == len(CONFIGS), r.stdout
            assert all(float(x) > 0 for x in ms + ratio), r.stdout
            assert float(ratio[0]) == 1.0, r.stdout  # none over itself
    assert 'round 1/1' in r.stderr and 'failed' not in r.stderr, r.stderr[-3000:]

@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the message given where there is no CUDA device')
def test_gpu_marks_without_cuda_says_so_and_exits_0():
    r = subprocess.run([sys.executable, 'benchmarks/gpu_marks.py'], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().startswith('no CUDA device') and 'Traceback' not in r.stderr, (r.stdout, r.stderr)

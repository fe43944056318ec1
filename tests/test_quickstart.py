"The README's quick start, run as a plain `python` script in a fresh process: it prints the report with the contract's rows."
import subprocess, sys, textwrap, os
import pandas as pd

SCRIPT = textwrap.dedent('''
    import torch
    from torch import nn
    from fastai.basics import *
    from fastai.callback.schedule import *
    from fastxtend_prof.all import *

    x = torch.randn(512, 4); y = (x.sum(1) > 0).long()
    dls = DataLoaders.from_dsets(list(zip(x[:384], y[:384])), list(zip(x[384:], y[384:])), bs=32, num_workers=0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    learn = Learner(dls, model, loss_func=CrossEntropyLossFlat()).profile()
    learn.fit_one_cycle(2, 1e-3)        # prints the report after fit
    learn.simple_profile_results.to_csv(OUT, index=False)
    print(type(learn.simple_profile_report).__name__)
''')

def test_quick_start_script(tmp_path):
    out = tmp_path/'res.csv'
    script = tmp_path/'quickstart.py'
    script.write_text(f'OUT = {str(out)!r}\n' + SCRIPT)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=dict(os.environ, PYTHONWARNINGS='ignore'))
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('Simple Profiler report'))
    table = lines[start+1:]
    assert table[0].split()[:3] == ['Phase', 'Action', 'Step']
    words = ' '.join(table)
    for step in ('fit', 'epoch', 'train', 'valid', 'draw', 'batch', 'forward', 'loss', 'backward', 'opt_step', 'zero_grad', 'other', 'warmup', 'predict'):
        assert f' {step} ' in f' {words} ', step
    assert lines[-1] == 'DataFrame'
    res = pd.read_csv(out)
    assert len(res) == 19 and list(res.columns[:3]) == ['Phase', 'Action', 'Step']

"The README's quick start, read from the README and run as written as a plain `python` script in a fresh process: it prints the report with the contract's rows."
import subprocess, sys, textwrap, os
from pathlib import Path
import pandas as pd

README = Path(__file__).resolve().parent.parent/'README.md'

def quick_start() -> str:
    "The README's Quick start code block, exactly as written there"
    text = README.read_text()
    section = text[text.index('## Quick start'):]
    return section.split('```python\n', 1)[1].split('```', 1)[0]

SCRIPT = quick_start() + textwrap.dedent('''
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

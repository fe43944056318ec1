"The README's quick start, read from the README and run as written as a plain `python` script in a fresh process (cwd a temporary folder, no display): it prints the report with the contract's rows."
import subprocess, sys, textwrap, os, re
from pathlib import Path
import pandas as pd

README = Path(__file__).resolve().parent.parent/'README.md'

def quick_start() -> str:
    "The README's Quick start code blocks, exactly as written there, one after the other"
    text = README.read_text()
    section = text[text.index('\n## Quick start\n'):]
    section = section[:section.find('\n## ', 1)]
    blocks = re.findall(r'^```python\n(.*?)^```$', section, re.M | re.S)
    assert blocks, 'no python code in the Quick start'
    return ''.join(blocks)

SCRIPT = quick_start() + textwrap.dedent('''
    learn.simple_profile_results.to_csv(OUT, index=False)
    print(isinstance(learn.simple_profile_report, pd.DataFrame))
''')

def test_quick_start_script(tmp_path):
    out = tmp_path/'res.csv'
    script = tmp_path/'quickstart.py'
    script.write_text(f'OUT = {str(out)!r}\n' + SCRIPT)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={k: v for k, v in dict(os.environ, PYTHONWARNINGS='ignore', MPLBACKEND='Agg').items() if k != 'COLUMNS'})
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('Simple Profiler report'))
    table = lines[start+1:]
    assert table[0].split()[:3] == ['Phase', 'Action', 'Step']
    words = ' '.join(table)
    for step in ('fit', 'epoch', 'train', 'valid', 'draw', 'batch', 'forward', 'loss', 'backward', 'opt_step', 'zero_grad', 'other', 'warmup', 'predict', 'iteration'):
        assert f' {step} ' in f' {words} ', step
    assert max(len(l) for l in table) <= 120   # no terminal: the report fits 120 columns
    assert lines[-1] == 'True'
    res = pd.read_csv(out)
    assert len(res) == 27 and list(res.columns[:3]) == ['Phase', 'Action', 'Step']   # 21, and the draw's 3 parts in train and valid

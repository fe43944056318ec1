"The command line, end to end in a subprocess: files written, exit codes."
import os, subprocess, sys
import pandas as pd

def run(*args, cwd):
    return subprocess.run([sys.executable, '-m', 'fastxtend_prof', *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=dict(os.environ, PYTHONWARNINGS='ignore', MPLBACKEND='Agg'))

def test_demo_writes_csv_and_chart(tmp_path):
    p = run('demo', '--epochs', '1', '--num-workers', '0', '--no-progress', '--csv', 'out/res.csv', '--plot', 'out/chart.png', cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert 'Simple Profiler report' in p.stdout
    res = pd.read_csv(tmp_path/'out'/'res.csv')
    assert {'draw', 'forward', 'backward', 'opt_step'} <= set(res.Step)
    png = (tmp_path/'out'/'chart.png').read_bytes()
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 5000

def test_bad_option_exits_2(tmp_path):
    for args in (['demo', '--epochs', '0'], ['demo', '--sync', 'gpu'], ['demo', '--bs', 'many'], ['demo', '--no-such-option']):
        p = run(*args, cwd=tmp_path)
        assert p.returncode == 2, (args, p.returncode)
        assert p.stderr.strip().splitlines()[-1].startswith('fastxtend-prof'), p.stderr
        assert 'Traceback' not in p.stderr

def test_help_lists_every_option(tmp_path):
    p = run('demo', '--help', cwd=tmp_path)
    assert p.returncode == 0
    for opt in ('--epochs', '--bs', '--num-workers', '--slow-data', '--warmup', '--sync', '--csv', '--plot', '--trace', '--no-progress'):
        assert opt in p.stdout, opt

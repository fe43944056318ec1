"""The README's install, as a user runs it: a wheel built from the checkout, installed with the README's line into a
fresh virtual environment that already holds a torch (the CPU build of torch 2.13), then the command and the Quick
start run outside the clone.

What it guards: the line keeps the user's torch (fastai's unbounded torchvision would otherwise pull the newest torch,
a 6 GB CUDA build); the wheel carries everything the package imports (a module or data file left out of the wheel
fails here, not in the clone, where the source folder hides it); `fastxtend-prof` is installed as a command."""
import os, re, shutil, subprocess, sys
from pathlib import Path
import pytest
from test_quickstart import quick_start

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT/'README.md').read_text()
TORCH = '2.13.0'  # the CPU build pip finds on these machines' disk; a CUDA build would be several GB

def install_lines():
    "The README's install block: its `pip` lines, as written"
    text = README[README.index('\n## Install\n'):]
    block = re.search(r'^```sh\n(.*?)^```$', text, re.M | re.S).group(1)
    return [l.split('#')[0].strip() for l in block.splitlines() if l.startswith('pip ')]

def test_the_readme_names_one_install_line_that_pins_torch():
    lines = install_lines()
    assert len(lines) == 1 and lines[0].startswith('pip install . ') and '"torch==$(python -c' in lines[0], lines
    words = ' '.join(README.split())  # the text, however its lines are wrapped
    assert '`pip wheel --no-deps -w dist .`' in words and '`dist/fastxtend_prof-*.whl` in place of `.`' in words

def run(cmd, env, cwd, timeout=900):
    p = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout,
                       executable='/bin/bash' if isinstance(cmd, str) else None)
    assert p.returncode == 0, f'{cmd}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}'
    return p.stdout

@pytest.mark.slow
def test_wheel_installs_beside_an_existing_torch_and_runs_outside_the_clone(tmp_path):
    src, venv, elsewhere = tmp_path/'fastxtend_prof', tmp_path/'venv', tmp_path/'elsewhere'
    # A copy of the checkout without its environments and build leftovers (a stale build/ could hide a missing file)
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns('.venv*', '.git', 'build', 'dist', '*.egg-info', '__pycache__',
                                                             '.base', '.diag', '.whl', '.hypothesis', 'wandb', 'runs', '_proc'))
    elsewhere.mkdir()
    subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'VIRTUAL_ENV', 'PYTHONHOME')}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv/'bin'}:{env.get('PATH', '')}", PIP_NO_COMPILE='1', MPLBACKEND='Agg',
               PIP_DISABLE_PIP_VERSION_CHECK='1', PYTHONWARNINGS='ignore')
    p = subprocess.run(['pip', 'install', '-q', f'torch=={TORCH}'], capture_output=True, text=True, env=env, timeout=900)
    if p.returncode: pytest.skip(f'torch {TORCH} cannot be installed here: {p.stderr.strip().splitlines()[-1:]}')
    torch_version = lambda: run(['python', '-c', 'import torch; print(torch.__version__)'], env, elsewhere).strip()
    before = torch_version()
    run('pip wheel -q --no-deps -w dist .', env, src)                       # the README's wheel line
    wheel, = (src/'dist').glob('fastxtend_prof-*.whl')
    line = install_lines()[0].replace('pip install . ', 'pip install -q dist/fastxtend_prof-*.whl ', 1)
    run(line, env, src)
    assert torch_version() == before, 'the install line changed torch'
    where = run(['python', '-c', 'import fastxtend_prof, os; print(fastxtend_prof.__file__)'], env, elsewhere)
    assert str(venv) in where and str(src) not in where, where
    assert 'usage: fastxtend-prof' in run(['fastxtend-prof', '--help'], env, elsewhere)
    (elsewhere/'quick_start.py').write_text(quick_start())
    out = run(['python', 'quick_start.py'], env, elsewhere, timeout=300)
    assert 'Simple Profiler report' in out and 'Advice' in out, out[-2000:]
    schema = run(['python', '-c', 'import json; from fastxtend_prof.saved import SCHEMA; json.loads(SCHEMA.read_text()); print(SCHEMA)'], env, elsewhere)
    assert str(venv) in schema, schema   # the saved run's JSON Schema ships in the wheel

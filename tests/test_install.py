"""The README's install, as a user runs it: a wheel built from the checkout, and the README's line resolved by pip in a
fresh virtual environment that already holds a torch (torch 2.13's metadata and module: `installed_torch`); then the wheel's own files, with
the command it installs, run the Quick start outside the clone.

What it guards: the line keeps the user's torch (fastai's unbounded torchvision would otherwise pull the newest torch,
a 6 GB CUDA build); the wheel carries everything the package imports (a module or data file left out of the wheel
fails here, not in the clone, where the source folder hides it); `fastxtend-prof` is installed as a command.

How, and why so: pip resolves the line with `--dry-run --report` (what pip would install, decided by the very resolver
that installs it, without unpacking the ~80 packages: under CI's load the full install took 12 minutes of a test
process); the wheel is then installed without its dependencies into a folder of its own (`--target`), which the
Quick start imports ahead of everything else, its dependencies taken from the test environment."""
import json, os, re, shutil, subprocess, sys
from pathlib import Path
import pytest
from test_quickstart import quick_start

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT/'README.md').read_text()
TORCH = '2.13.0'  # the user's torch: an older release than fastai's newest torchvision wants

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

def installed_torch(venv):
    """What pip and the README's line see of a user's installed torch: its distribution's metadata (name and version) and
    a `torch` module with its `__version__`. pip's resolver reads no more of an installed package than that, so the plan
    is the one a real install would get: the same 82 packages and torchvision 0.28.0 but for torch's own dependencies,
    which a real torch brings (measured). The CPU wheel took 52 s to install on a quiet 2-core machine, 39 of them CPU"""
    site = Path(subprocess.run([str(venv/'bin'/'python'), '-c', "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site/'torch').mkdir()
    (site/'torch'/'__init__.py').write_text(f'__version__ = {TORCH!r}\n')
    info = site/f'torch-{TORCH}.dist-info'
    info.mkdir()
    (info/'METADATA').write_text(f'Metadata-Version: 2.1\nName: torch\nVersion: {TORCH}\n')
    (info/'INSTALLER').write_text('pip\n')
    (info/'RECORD').write_text('')

def run(cmd, env, cwd, timeout=900):
    p = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout,
                       executable='/bin/bash' if isinstance(cmd, str) else None)
    assert p.returncode == 0, f'{cmd}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}'
    return p.stdout

@pytest.mark.slow
def test_wheel_installs_beside_an_existing_torch_and_runs_outside_the_clone(tmp_path):
    src, venv, elsewhere, target = tmp_path/'fastxtend_prof', tmp_path/'venv', tmp_path/'elsewhere', tmp_path/'wheel'
    # A copy of the checkout without its environments and build leftovers (a stale build/ could hide a missing file)
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns('.venv*', '.git', 'build', 'dist', '*.egg-info', '__pycache__',
                                                             '.base', '.diag', '.whl', '.hypothesis', 'wandb', 'runs', '_proc'))
    elsewhere.mkdir()
    subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'VIRTUAL_ENV', 'PYTHONHOME')}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv/'bin'}:{env.get('PATH', '')}", PIP_NO_COMPILE='1', MPLBACKEND='Agg',
               PIP_DISABLE_PIP_VERSION_CHECK='1', PYTHONWARNINGS='ignore')
    installed_torch(venv)
    run('pip wheel -q --no-deps -w dist .', env, src)                       # the README's wheel line
    wheel, = (src/'dist').glob('fastxtend_prof-*.whl')
    line = install_lines()[0].replace('pip install . ', f'pip install -q --dry-run --report {tmp_path}/plan.json dist/fastxtend_prof-*.whl ', 1)
    run(line, env, src)
    plan = {i['metadata']['name'].lower(): i['metadata']['version'] for i in json.loads((tmp_path/'plan.json').read_text())['install']}
    assert 'torch' not in plan, f"the install line would replace torch {TORCH} with {plan.get('torch')}"
    assert plan.get('fastxtend-prof') and plan.get('fastai'), plan   # the package and what it needs, resolved beside that torch
    # The wheel's files alone, with the command it installs: imported ahead of the checkout and of any install
    out = env | {'PYTHONPATH': str(target)}
    out.update(PATH=f"{target/'bin'}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    out.pop('VIRTUAL_ENV')
    run([sys.executable, '-m', 'pip', 'install', '-q', '--no-deps', '--target', str(target), str(wheel)], out, elsewhere)
    where = run([sys.executable, '-c', 'import fastxtend_prof, os; print(fastxtend_prof.__file__)'], out, elsewhere)
    assert str(target) in where and str(src) not in where and str(ROOT) not in where, where
    assert 'usage: fastxtend-prof' in run(['fastxtend-prof', '--help'], out, elsewhere)
    (elsewhere/'quick_start.py').write_text(quick_start())
    res = run([sys.executable, 'quick_start.py'], out, elsewhere, timeout=300)
    assert 'Simple Profiler report' in res and 'Advice' in res, res[-2000:]
    schema = run([sys.executable, '-c', 'import json; from fastxtend_prof.core.saved import SCHEMA; json.loads(SCHEMA.read_text()); print(SCHEMA)'], out, elsewhere)
    assert str(target) in schema, schema   # the saved run's JSON Schema ships in the wheel

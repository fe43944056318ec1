"scripts/_venv.sh runs pip (or uv) only when something the install depends on changed. A stand-in pip (and uv) logs its calls instead of installing."
import os, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

def fake_venv(tmp_path):
    "A `$VENV` whose python is this test's python, except `python -m pip`, which only appends its arguments to pip.log"
    py = tmp_path/'venv'/'bin'/'python'
    py.parent.mkdir(parents=True)
    py.write_text(f'#!/usr/bin/env bash\nif [ "$1 $2" = "-m pip" ]; then echo "$*" >> {tmp_path}/pip.log; exit 0; fi\nexec {sys.executable} "$@"\n')
    py.chmod(0o755)
    return py.parent.parent

def set_up(venv, extras='demo', **env):
    "Source _venv.sh as scripts/demo.sh does; the pip calls it made"
    log = venv.parent/'pip.log'
    log.unlink(missing_ok=True)
    p = subprocess.run(['bash', '-c', f'EXTRAS={extras}; source "{ROOT}/scripts/_venv.sh"'], capture_output=True, text=True,
                       timeout=300, env={**os.environ, 'VENV': str(venv), **env})
    assert p.returncode == 0, p.stderr
    return log.read_text().splitlines() if log.exists() else []

def test_pip_runs_once_then_only_when_the_torch_spec_or_extras_change(tmp_path):
    "An install is two pip calls: the torch spec first (pip does nothing when it is met), then the project under it"
    venv = fake_venv(tmp_path)
    first = set_up(venv)
    assert len(first) == 2 and first[0].endswith('install torch==2.13.0') and first[1].endswith(f'-e {ROOT}[demo]'), first
    assert set_up(venv) == []                                                   # nothing changed: no pip at all
    two = set_up(venv, TORCH_SPEC='torch==2.14.1 torchvision==0.29.1')         # scripts/test.sh's spec: two packages
    assert len(two) == 2 and two[0].endswith('install torch==2.14.1 torchvision==0.29.1'), two
    assert (venv/'torch-constraint.txt').read_text().splitlines() == ['torch==2.14.1', 'torchvision==0.29.1']
    assert len(set_up(venv)) == 2                                               # back to the default spec
    assert len(set_up(venv, extras='dev')) == 2 and set_up(venv, extras='dev') == []
    assert set_up(venv) == []                                                   # each set of extras keeps its own stamp

def test_a_stamp_that_does_not_match_reinstalls(tmp_path):
    venv = fake_venv(tmp_path)
    set_up(venv)
    (venv/'.fastxtend_prof-install-demo').write_text('an install from another checkout\n')
    assert len(set_up(venv)) == 2
    assert set_up(venv) == []

def fake_uv(venv, works=True):
    "A stand-in `$VENV/bin/uv` that appends its arguments to uv.log, and fails each install where not `works`"
    uv = venv/'bin'/'uv'
    uv.write_text(f'#!/usr/bin/env bash\necho "$*" >> {venv.parent}/uv.log\nexit {0 if works else 1}\n')
    uv.chmod(0o755)
    return venv.parent/'uv.log'

def test_uv_installs_where_asked_and_pip_where_uv_cannot(tmp_path):
    "INSTALLER=uv (scripts/test.sh's): the same two installs by uv, into the venv's python; pip does them where uv fails"
    venv = fake_venv(tmp_path)
    log = fake_uv(venv)
    assert set_up(venv, INSTALLER='uv') == []   # uv was there: pip not even called to install it
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and calls[0] == f"pip install -q --compile-bytecode --python {venv}/bin/python torch==2.13.0", calls
    assert calls[1].endswith(f'-c {venv}/torch-constraint.txt -e {ROOT}[demo]'), calls
    assert set_up(venv, INSTALLER='uv') == [] and len(log.read_text().splitlines()) == 2   # up to date: neither runs
    fake_uv(venv, works=False)
    pip = set_up(venv, extras='dev', INSTALLER='uv')   # uv fails: pip does both
    assert len(pip) == 2 and pip[0].endswith('install torch==2.13.0') and pip[1].endswith(f'-e {ROOT}[dev]'), pip

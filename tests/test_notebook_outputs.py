"""The docs' stored outputs name no machine: no absolute path of the machine that ran the notebooks (a virtual
environment's `site-packages`, a worktree, a temporary folder, an IPython kernel's cell file, a home folder). The
notebooks are the documentation, and a stored warning such as torch's `torch.jit.script` FutureWarning carried the
build machine's paths into 23 of them. Run a notebook with `PYTHONWARNINGS=ignore::FutureWarning` (or drop such an
output) and give the paths a reader would type: relative ones, in a folder the cell moves to."""
import json, re, tempfile
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT/'nbs').glob('*.ipynb'))
MACHINE = re.compile('|'.join([
    r'(?<![\w.])/(?:tmp|work|home|root|Users|var/folders|private|opt|usr|mnt|srv)/',  # an absolute POSIX folder
    r'site-packages', r'ipykernel_\d+', r'\b[A-Za-z]:\\\\', r'\.venv',
    *(re.escape(str(p)) for p in {ROOT, Path(tempfile.gettempdir()), Path.home()} if len(str(p)) > 1),
]))

def stored_text(output:dict) -> str:
    "What an output shows as text: a stream's text, an error's traceback, a display's plain text, HTML and markdown"
    if 'text' in output: return ''.join(output['text'])
    if output.get('output_type') == 'error': return '\n'.join(output.get('traceback', []))
    data = output.get('data', {})
    return '\n'.join(''.join(data[k]) for k in ('text/plain', 'text/html', 'text/markdown') if k in data)

def machine_paths(nb_path:Path) -> list:
    "`(cell, line)` of each stored output line that names a path of a machine"
    found = []
    for i, cell in enumerate(json.loads(nb_path.read_text())['cells']):
        for o in cell.get('outputs', []):
            found += [(i, line.strip()[:160]) for line in stored_text(o).splitlines() if MACHINE.search(line)]
    return found

def test_the_check_finds_what_it_is_for(tmp_path):
    "What it must catch (the outputs this check was written for) and what it must let through"
    caught = ['/work/main/.venv-test/lib/python3.11/site-packages/torch/jit/_script.py:1491: FutureWarning: ...',
              '/tmp/ipykernel_20843/4051562787.py:26: UserWarning: logger_callback...',
              'Saved: results to /tmp/tmplauu6cgk/prof_runs/fit1.csv', 'export PYTHONPATH=/work/wt-run/fastxtend_prof/_autorun_site',
              r'C:\\Users\\me\\fit.json', f'{ROOT}/nbs']
    passed = ['Saved: results to prof_runs/fit1.csv', 'a/b/c', '2.5 ms/batch', 'https://ui.perfetto.dev/#!/viewer', '12/30 runs',
              'export PYTHONPATH=…/fastxtend_prof/_autorun_site']
    nb = {'cells': [{'cell_type': 'code', 'outputs': [{'output_type': 'stream', 'name': 'stderr', 'text': [s + '\n' for s in caught + passed]}]}]}
    (tmp_path/'x.ipynb').write_text(json.dumps(nb))
    assert [line for _, line in machine_paths(tmp_path/'x.ipynb')] == caught

@pytest.mark.parametrize('nb', NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_machine_path_in_stored_outputs(nb):
    found = machine_paths(nb)
    assert not found, f'{nb.name}: stored outputs name a machine path (cell, line): {found[:5]}'

"""The front page and the install page say what the project does.

README.md is the rendering of nbs/index.ipynb (scripts/readme.py), so the two can't drift. The install page
(nbs/20_install.ipynb) says what pyproject.toml does: the extras and what each installs, that it installs from a
clone (there is no public address, and no file may name one), and floors that are the oldest versions it reports
passing."""
import re, importlib.util
from pathlib import Path
import pytest
tomllib = pytest.importorskip('tomllib')  # Python 3.11+
nbformat = pytest.importorskip('nbformat')

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT/'README.md').read_text()
INSTALL = '\n\n'.join(c.source for c in nbformat.read(ROOT/'nbs'/'20_install.ipynb', as_version=4).cells
                      if c.cell_type == 'markdown')
PROJECT = tomllib.loads((ROOT/'pyproject.toml').read_text())['project']

def readme_script():
    spec = importlib.util.spec_from_file_location('readme', ROOT/'scripts'/'readme.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

def section(title, text=INSTALL):
    "`text` from the heading `title` (any level) to the next heading of level 2"
    start = re.search(rf'^#+ {re.escape(title)}\n', text, re.M).end()
    end = text.find('\n## ', start)
    return text[start:end if end >= 0 else None]

def table(text):
    "The first markdown table in `text` as a list of dicts keyed by its header"
    lines = [l for l in text.splitlines() if l.startswith('|')]
    cells = lambda l: [c.strip() for c in l.strip('|').split(' | ')]
    head = cells(lines[0])
    return [dict(zip(head, cells(l))) for l in lines[2:]]

def name(req): return re.split(r'[<>=!~ \[;]', req, maxsplit=1)[0]
def floor(pkg): return next(r.split('>=')[1] for r in PROJECT['dependencies'] if name(r) == pkg)
def version(s):
    "`s`'s leading release number as a tuple without trailing zeros, so that 2.6 == 2.6.0"
    v = [int(p) for p in re.match(r'[\d.]+', s).group(0).rstrip('.').split('.')]
    while len(v) > 1 and v[-1] == 0: v.pop()
    return tuple(v)

def test_readme_is_the_rendered_index():
    mod = readme_script()
    assert README == mod.render(nbformat.read(ROOT/'nbs'/'index.ipynb', as_version=4)), \
        'README.md differs from nbs/index.ipynb: run `python scripts/readme.py`'

def test_readme_is_short():
    assert len(README.splitlines()) <= 150

def test_render_skips_hidden_cells_and_directives():
    mod = readme_script()
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell('See [Reading](13_reading.ipynb) and [fastai](https://docs.fast.ai).'),
        nbformat.v4.new_code_cell('#| hide\nsecret = 1'),
        nbformat.v4.new_code_cell('#| echo: false\nprint(2)', outputs=[nbformat.v4.new_output('stream', name='stdout', text='2\n')]),
        nbformat.v4.new_code_cell('x = 3\nx', outputs=[
            nbformat.v4.new_output('stream', name='stderr', text='a warning\n'),
            nbformat.v4.new_output('display_data', data={'text/plain': '<IPython.core.display.HTML object>'}),
            nbformat.v4.new_output('execute_result', data={'text/plain': '3'}, execution_count=1)])])
    text = mod.render(nb)
    assert '](nbs/13_reading.ipynb)' in text and '](https://docs.fast.ai)' in text
    assert 'secret' not in text and '#|' not in text and 'print(2)' not in text and 'warning' not in text
    assert '```\n2\n```' in text and '```python\nx = 3\nx\n```\n\n```\n3\n```' in text and 'IPython' not in text

def test_every_extra_is_listed_with_what_it_installs():
    rows = {r['extra'].strip('`'): r['adds'] for r in table(section('Install')) if r['extra'].startswith('`')}
    extras = PROJECT['optional-dependencies']
    assert set(rows) == set(extras)
    for extra, reqs in extras.items():
        assert {a.split()[0] for a in rows[extra].split(', ')} == {name(r) for r in reqs}, extra

def test_the_base_row_lists_the_dependencies():
    base = next(r for r in table(section('Install')) if r['extra'] == '(none)')
    assert set(base['adds'].split(', ')) == {name(r) for r in PROJECT['dependencies']}

def test_no_address_that_does_not_exist():
    "The project has no public repository or docs site: no file may send a user to one (install lines, docstrings, settings)"
    made_up = ('github.com/' + 'fastxtend-prof', 'fastxtend-prof' + '.github.io')
    files = [f for f in ROOT.rglob('*') if f.is_file() and f.suffix in ('.py', '.ipynb', '.md', '.toml', '.yml', '.sh', '.txt', '')
             and not any(p.startswith(('.venv', '.git', 'build', 'dist', '_proc', '_docs', '.base', '.diag')) or p.endswith('.egg-info')
                         for p in f.relative_to(ROOT).parts)]
    assert len(files) > 50
    bad = [f'{f.relative_to(ROOT)}: {u}' for f in files for u in made_up if u in f.read_text(errors='ignore')]
    assert not bad, bad
    assert 'urls' not in PROJECT
    assert 'has no public address' in section('Install', README) and 'has no public address' in section('Install')

def test_the_license_pyproject_names_is_there():
    assert PROJECT['license'] == 'Apache-2.0' and PROJECT['license-files'] == ['LICENSE']
    text = (ROOT/'LICENSE').read_text()
    assert 'Apache License' in text and 'Version 2.0, January 2004' in text and 'END OF TERMS AND CONDITIONS' in text

def test_floors_are_stated_and_are_the_oldest_passing_row():
    text = section('Tested with')
    for req in PROJECT['dependencies']: assert f'`{req}`' in text, req
    passing = [r for r in table(text) if r['result'].startswith('pass')]
    assert passing
    for pkg in ('fastai', 'fastcore', 'torch'):
        assert min(version(r[pkg]) for r in passing) == version(floor(pkg)), pkg
    pandas_numpy = [r['pandas, numpy'].split(', ') for r in passing]
    # pandas and numpy floors name a minor release; the row names the patch release that ran
    assert min(version(p) for p, n in pandas_numpy)[:2] == version(floor('pandas'))[:2]
    assert min(version(n) for p, n in pandas_numpy)[:2] == version(floor('numpy'))[:2]

def test_requires_python_is_stated():
    py = PROJECT['requires-python'].replace('>=', '≥ ')
    assert f"Python {py} is required" in section('Tested with')
    assert f"Python {py}" in section('Install', README)
    for pkg in ('fastai', 'torch'): assert f'{pkg} ≥ {floor(pkg)}' in section('Install', README), pkg

def test_what_the_readmes_examples_write_is_ignored_by_git():
    """Each file the README's commands write in the clone (`--plot demo_profile.png`, `-o page.html`, `--html
    page.html`, `--save-json`, `--csv`) is one git ignores, so trying the README leaves `git status` clean (`page.html`
    was not ignored)"""
    import shutil, subprocess
    if not shutil.which('git') or not (ROOT/'.git').exists(): pytest.skip('not a git checkout')
    written = set(re.findall(r'(?:--plot|--html|-o|--save-json|--csv|--trace) ([\w./-]+\.(?:png|html|json|csv))', README))
    assert {'demo_profile.png', 'page.html'} <= written, written
    p = subprocess.run(['git', 'check-ignore', '--no-index', *sorted(written)], cwd=ROOT, capture_output=True, text=True)
    assert set(p.stdout.split()) == written, f'not ignored: {sorted(written - set(p.stdout.split()))}'

def test_the_readmes_commands_parse():
    """Each command the README shows in a code span (`fastxtend-prof ...`) parses with the command's own parser, and no
    option that takes a value is shown bare (the README offered "`--save-json` to try `compare`", and the option needs
    a path: `error: argument --save-json: expected one argument`)"""
    import shlex
    from fastxtend_prof.cli import parser
    spans = [s for s in re.findall(r'`(fastxtend-prof [^`]+)`', README) if '...' not in s and '[' not in s and '$' not in s]
    assert any('--save-json' in s for s in spans), spans
    for s in spans:
        words = shlex.split(s)[1:]
        if len(words) < 2 or words[0] in ('run', 'guide'): continue  # a command named, not run; `run` hands its arguments to the script
        a, extra = parser().parse_known_args(words)
        assert not extra, (s, extra)
    assert not re.search(r'`--(save-json|html|csv|plot)`', README), re.findall(r'.{60}`--(?:save-json|html|csv|plot)`.{20}', README)

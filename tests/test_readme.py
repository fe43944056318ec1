"The README's Install section says what pyproject.toml does: the extras and what each installs, the repository to install from, and floors that are the oldest versions it reports passing."
import re
from pathlib import Path
import pytest
tomllib = pytest.importorskip('tomllib')  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT/'README.md').read_text()
PROJECT = tomllib.loads((ROOT/'pyproject.toml').read_text())['project']

def section(title):
    "The README's text from the heading `title` (any level) to the next heading of level 2"
    start = re.search(rf'^#+ {re.escape(title)}\n', README, re.M).end()
    end = README.find('\n## ', start)
    return README[start:end if end >= 0 else None]

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

def test_every_extra_is_listed_with_what_it_installs():
    rows = {r['extra'].strip('`'): r['adds'] for r in table(section('Install')) if r['extra'].startswith('`')}
    extras = PROJECT['optional-dependencies']
    assert set(rows) == set(extras)
    for extra, reqs in extras.items():
        assert {a.split()[0] for a in rows[extra].split(', ')} == {name(r) for r in reqs}, extra

def test_the_base_row_lists_the_dependencies():
    base = next(r for r in table(section('Install')) if r['extra'] == '(none)')
    assert set(base['adds'].split(', ')) == {name(r) for r in PROJECT['dependencies']}

def test_git_urls_are_the_repository():
    urls = re.findall(r'git\+(https://[^"\s]+)"', section('Install'))
    assert urls and set(urls) == {PROJECT['urls']['Repository']}
    assert f"git clone {PROJECT['urls']['Repository']} " in section('Install')

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
    assert f"Python {PROJECT['requires-python'].replace('>=', '≥ ')} is required" in section('Tested with')

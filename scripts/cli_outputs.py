"""The CLI's outputs on the tests' saved runs, to show a refactor changed none of them.

    python scripts/cli_outputs.py OUT            # write every output (stdout, stderr, exit code, files) under OUT
    python scripts/cli_outputs.py OUT --against BEFORE   # ... then compare with an earlier OUT: exit 1 on a difference

No training: only the commands that read saved runs (compare, report, history, guide, each --help, bad input)."""
import argparse, filecmp, os, re, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
D = ROOT/'tests'/'data'
MLP = sorted(str(p) for p in (D/'wide_mlp').glob('r*.json'))
LOADED = sorted(str(p) for p in (D/'wide_mlp_loaded').glob('r*.json'))
V1, V2 = str(D/'v1_run.json'), str(D/'v2_stages.json')

def cases() -> dict:
    "name -> its arguments (`{out}`: the output folder)"
    c = {'help': ['--help'], 'guide': ['guide'], 'no-such': ['nosuch'], 'bad-file': ['report', __file__, '--format', 'text']}
    for cmd in ('demo', 'compare', 'tune', 'noise', 'report', 'history'): c[f'help-{cmd}'] = [cmd, '--help']
    for f in ('text', 'md', 'json', 'bmf'): c[f'report-{f}'] = ['report', V2, '--format', f]
    for f in ('text', 'md', 'json'):
        c[f'compare-{f}'] = ['compare', MLP[0], MLP[1], '--format', f, '--noise', str(D/'wide_mlp'/'noise.json')]
    c['compare-within'] = ['compare', MLP[0], MLP[4], '--within-run', '--fail-on-regression', '5']
    c['compare-one-a-side'] = ['compare', MLP[0], MLP[1], '--fail-on-regression', '5']
    c['compare-sides'] = ['compare', *MLP[3:], '--baseline', *MLP[:3]]
    c['compare-v1v2'] = ['compare', V1, V2, '--within-run']
    for f in ('text', 'md', 'json', 'bmf'):
        c[f'history-busy-{f}'] = ['history', str(D/'busy_backward'), '--format', f, '--fail-on-regression', '10']
        c[f'history-mlp-{f}'] = ['history', *MLP, '--format', f, '--fail-on-regression', '10']
    c['history-loaded'] = ['history', *LOADED, '--fail-on-regression', '10', '--step', 'train/draw']
    c['history-short'] = ['history', *MLP[:2], '--fail-on-regression', '10']
    c['history-accept'] = ['history', *MLP, '--fail-on-regression', '10', '--accept', 'r5']
    c['history-noise'] = ['history', *MLP[:4], '--noise', str(D/'wide_mlp'/'noise.json'), '--fail-on-regression', '5']
    c['history-bad-accept'] = ['history', *MLP, '--accept', 'nosuch']
    # the pages, written under OUT and compared byte for byte too
    c['report-html'] = ['report', V2, '--baseline', V1, '--within-run', '-o', '{out}/report.html']
    c['history-html'] = ['history', *MLP, '--html', '{out}/history.html']
    return c

def run(out:Path):
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, 'COLUMNS': '120', 'PYTHONHASHSEED': '0', 'MPLBACKEND': 'Agg'}
    for name, args in cases().items():
        args = [x.replace('{out}', str(out)) for x in args]
        r = subprocess.run([sys.executable, '-m', 'fastxtend_prof', *args], capture_output=True, text=True, env=env,
                           cwd=ROOT)
        # paths differ between clones, and the time a page took to write between runs
        clean = lambda s: re.sub(r'in [0-9.]+ s\)', 'in <T> s)', s.replace(str(out), '<OUT>').replace(str(ROOT), '<ROOT>'))
        (out/f'{name}.out').write_text(f'exit {r.returncode}\n--- stdout\n{clean(r.stdout)}--- stderr\n{clean(r.stderr)}')

def compare(out:Path, before:Path) -> int:
    a, b = (sorted(p.name for p in d.iterdir() if p.is_file()) for d in (before, out))
    differ = [n for n in a if n in b and not filecmp.cmp(before/n, out/n, shallow=False)]
    missing = sorted(set(a) ^ set(b))
    for n in differ: print(f'differs: {n}')
    for n in missing: print(f'only in one: {n}')
    print(f'{len(a) - len(differ)} of {len(a)} outputs identical')
    return 1 if differ or missing else 0

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('out', type=Path)
    p.add_argument('--against', type=Path, help='an earlier OUT to compare with')
    a = p.parse_args()
    run(a.out)
    sys.exit(compare(a.out, a.against) if a.against else 0)

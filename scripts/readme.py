#!/usr/bin/env python3
"""Write README.md from nbs/index.ipynb, the docs' front page, so that the two say the same.

nbdev's own `nbdev-readme` needs quarto; this needs only nbformat. The rendering:
- markdown cells as they are, with links into the notebooks folder (`13_reading.ipynb`, `images/x.png`) made relative
  to the repository root (`nbs/13_reading.ipynb`);
- code cells as ```python blocks, without nbdev's `#|` directives; a cell with `#| hide` is left out, one with
  `#| echo: false` shows only its output, one with `#| output: false` only its code;
- a code cell's text output (printed text, and the plain-text form of what it displays) as one plain ``` block after
  it; stderr (warnings), placeholders such as `<IPython.core.display.HTML object>`, HTML (fastai's progress bar and epoch table) and
  images are left out.

`python scripts/readme.py` writes README.md; `python scripts/readme.py --check` exits 1 when README.md differs from
the rendering of nbs/index.ipynb. tests/test_readme.py runs the same check.
"""
import re, sys
from pathlib import Path
import nbformat

ROOT = Path(__file__).resolve().parent.parent
INDEX, README = ROOT/'nbs'/'index.ipynb', ROOT/'README.md'
HEADER = '<!-- Generated from nbs/index.ipynb by scripts/readme.py: edit the notebook, then run the script. -->\n'
PLACEHOLDER = re.compile(r'^<.*>$', re.S)  # `<IPython.core.display.HTML object>`, or markup (fastprogress's table)
LINK = re.compile(r'\]\((?![a-z]+:|/|#)([^)\s]+)\)')  # relative links and images

def directives(source: str) -> tuple[set, str]:
    "nbdev's `#|` directives of a code cell (`hide`, `echo: false`, ...), and the code without them"
    lines = source.splitlines()
    found = {l[2:].strip().replace(' ', '') for l in lines if l.startswith('#|')}
    return found, '\n'.join(l for l in lines if not l.startswith('#|')).strip('\n')

def output_text(out) -> str:
    "The text an output shows a reader of the README: stdout, or the plain-text form of a displayed value"
    if out.output_type == 'stream': return out.text if out.name == 'stdout' else ''
    text = out.get('data', {}).get('text/plain', '')
    return '' if PLACEHOLDER.match(text.strip()) else text + '\n'

def markdown(source: str) -> str: return LINK.sub(lambda m: f'](nbs/{m.group(1)})', source.strip('\n'))

def render(nb) -> str:
    "README.md's text for the notebook `nb`"
    parts = []
    for cell in nb.cells:
        if cell.cell_type == 'markdown': parts.append(markdown(cell.source))
        if cell.cell_type != 'code': continue
        flags, code = directives(cell.source)
        if 'hide' in flags: continue
        if code and 'echo:false' not in flags: parts.append(f'```python\n{code}\n```')
        text = '' if 'output:false' in flags else ''.join(output_text(o) for o in cell.get('outputs', []))
        text = '\n'.join(l.rstrip() for l in text.strip('\n').splitlines())
        if text: parts.append(f'```\n{text}\n```')
    return HEADER + '\n' + '\n\n'.join(p for p in parts if p) + '\n'

def main(argv):
    text = render(nbformat.read(INDEX, as_version=4))
    if '--check' in argv:
        if README.read_text() == text: return 0
        print('README.md differs from nbs/index.ipynb: run `python scripts/readme.py`', file=sys.stderr)
        return 1
    README.write_text(text)
    print(f'wrote {README.relative_to(ROOT)}: {len(text.splitlines())} lines')
    return 0

if __name__ == '__main__': sys.exit(main(sys.argv[1:]))

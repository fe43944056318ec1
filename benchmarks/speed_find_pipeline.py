"""`speed_find` on a vision pipeline that decodes again every epoch, against a manual sweep of workers × caching.

Two pipelines (`--pipeline`), each a fastai `DataBlock` on the CPU with batches of 16, a small CNN, from `num_workers=0`:

- `png`, the decode-bound case: 256-pixel PNG files (`--images`, digits upscaled with noise, written once to `--root`),
  `Resize(32)` as its item transform, `aug_transforms()` as batch transforms;
- `jpeg`, imagenette-shaped: photograph-like JPEG files of mixed sizes (smooth colour fields with grain, 375 to 500
  pixels a side), `RandomResizedCrop(64)` as its item transform (it draws: only the decoding can be cached),
  `aug_transforms()` on the batch. Its memory budget (`--budget`, default a third of the decoded items) holds a part of
  them, as 1 GiB holds a part of a real dataset: the rest is made anew, or kept on disk.

Each repeat runs

- the sweep: a fresh Learner for every configuration of `num_workers` 0..`--max-workers` × the item cache (none, in
  memory up to the budget, in memory and on disk past it: `fastxtend_prof.tune.cache.cache_loaders`, its filling counted in
  the configuration's time) × for `png` where the resize runs (on each item, `Resize(32)`, or on the batch,
  `aug_transforms(size=32)` with no item resize: another interpolation, so not a change speed_find makes unasked),
  measured by the tuner's own `run_trial` (40 steady train batches after 3 of warmup, without the callbacks a trial sets
  aside); the sweep's time is the sum of its configurations';
- `learn.speed_find()` from the start configuration: its own wall time, and the configuration it kept;
- once (the first repeat): a seeded one-epoch fit with what speed_find kept applied against one without it, with the
  workers it kept: the weights must be bit-identical.

Then the reference: the 40-batch sweep is too noisy to say which configuration is best (on the 2-core VM the JPEG
pipeline's cached loader with 1, 2 and 3 workers took turns as the best of the sweep's medians over seven runs, 5-10%
apart, and the largest of twelve noisy medians is biased upwards), so the candidates (each configuration whose sweep
median is within `--ref-within` of the best's, and each speed_find kept) are measured again: `--ref-passes` passes over
them, each in a shuffled order, `--ref-batches` steady batches a trial (several epochs, each one's first 3 batches left
out as in every trial), pooled (the batch over the mean).

It prints each configuration's samples/s (medians over the repeats), speed_find's choice, its speed-up over the start,
the share of the sweep's best throughput that choice reaches (its own sweep median), and speed_find's time against the
sweep's; then the reference's throughput of each candidate and the share of its best each choice reaches, with a 90%
interval (a bootstrap over the passes, the best chosen again in each draw). The issue's bar: at least 2× the start, 90%
of the best, a third of the sweep's time.

    python benchmarks/speed_find_pipeline.py                      # png: 640 images, 0..3 workers, 3 repeats (about 7 minutes)
    python benchmarks/speed_find_pipeline.py --pipeline jpeg      # jpeg: 640 images, the memory for a third of them (about 7 minutes)
"""
import argparse, os, time, warnings
from pathlib import Path
os.environ.setdefault('OMP_NUM_THREADS', '1')
warnings.simplefilter('ignore')
import numpy as np
BS = 16  # samples a batch, both pipelines

def make_images(root:Path, n:int):
    "`n` 256-pixel RGB PNG files of digits, upscaled with noise, a folder per class (kept between runs)"
    if len(list(root.glob('*/*.png'))) >= n: return
    from PIL import Image
    from sklearn.datasets import load_digits
    d, rng = load_digits(), np.random.default_rng(0)
    for i in range(n):
        img = np.kron(d.images[i % len(d.images)]/16, np.ones((32, 32)))*200
        img = np.clip(img[..., None] + rng.normal(0, 20, (256, 256, 3)), 0, 255).astype(np.uint8)
        p = root/str(d.target[i % len(d.images)]); p.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(p/f'{i}.png')

def make_jpegs(root:Path, n:int):
    "`n` photograph-like JPEG files of mixed sizes (smooth colour fields with grain, 375 to 500 pixels a side, as imagenette's), a folder per class (kept between runs)"
    if len(list(root.glob('*/*.jpg'))) >= n: return
    from PIL import Image
    rng = np.random.default_rng(0)
    for i in range(n):
        w, h = (int(v) for v in rng.integers(375, 501, 2))
        field = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
        img = np.clip(np.asarray(field, dtype=np.float32) + rng.normal(0, 30, (h, w, 3)), 0, 255).astype(np.uint8)
        p = root/str(i % 10); p.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(p/f'{i}.jpg', quality=92)  # about 2 ms to decode here, as a photograph of that size

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--pipeline', choices=('png', 'jpeg'), default='png')
    p.add_argument('--root', default=None, help='where the image files are written once (default /tmp/fxp_png256 or /tmp/fxp_jpeg)')
    p.add_argument('--images', type=int, default=640)
    p.add_argument('--max-workers', type=int, default=3)
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--show', action='store_true', help="print each speed_find's table")
    p.add_argument('--budget', type=float, default=None, help="the item cache's memory budget in MiB (default: 1 GiB for png, a third of the decoded items for jpeg)")
    p.add_argument('--ref-passes', type=int, default=4, help='passes of the reference over the candidates, after the repeats (default: 4; 0: none)')
    p.add_argument('--ref-batches', type=int, default=160, help='steady batches of a reference trial (default: 160)')
    p.add_argument('--ref-within', type=float, default=0.8, help="a candidate for the reference: a sweep median at least this share of the sweep's best (default: 0.8)")
    a = p.parse_args()
    jpeg = a.pipeline == 'jpeg'
    root = Path(a.root or ('/tmp/fxp_jpeg' if jpeg else '/tmp/fxp_png256'))
    (make_jpegs if jpeg else make_images)(root, a.images)
    from fastai.vision.all import (DataBlock, ImageBlock, CategoryBlock, get_image_files, parent_label, RandomSplitter, Resize,
                                   RandomResizedCrop, aug_transforms, Learner, nn, set_seed, accuracy)
    import torch
    import fastxtend_prof.all  # noqa: F401
    import fastxtend_prof.tune.cache as fc
    from fastxtend_prof.tune.cache import cache_loaders
    from fastxtend_prof.tune.search import run_trial, set_aside, _measured, _KEY
    files = get_image_files(root)[:a.images]
    def learner(nw, where='item'):
        set_seed(0)
        item = RandomResizedCrop(64, min_scale=0.35) if jpeg else Resize(32) if where == 'item' else None
        db = DataBlock(blocks=(ImageBlock, CategoryBlock), get_items=lambda _: files, splitter=RandomSplitter(0.2, seed=0), get_y=parent_label,
                       item_tfms=item, batch_tfms=aug_transforms(size=None if where == 'item' else 32))
        model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
        return Learner(db.dataloaders(root, bs=BS, num_workers=nw, device='cpu'), model, metrics=accuracy)
    if a.budget is not None: fc.BUDGET = int(a.budget*2**20)
    elif jpeg:
        undo, caches, _ = cache_loaders(learner(0), budget=2**40, loaders=None)
        fc.BUDGET = caches[0].bytes//3  # the train loader's decoded items, a third of them in memory
        undo()
    print(f'{a.pipeline}: {len(files)} images; the memory budget {fc.BUDGET/2**20:,.1f} MiB', flush=True)
    wheres = ('item',) if jpeg else ('item', 'batch')
    configs = [(w, c, where) for where in wheres for c in ('none', 'memory', 'disk') for w in range(a.max_workers + 1)]
    rates, sweep_s, find_s, chosen, find_rate = {c: [] for c in configs}, [], [], [], []
    def trial(config, batches:int):
        "A fresh Learner of `config` (its cache filled), measured for `batches` steady batches: its profile"
        w, c, where = config
        learn = learner(w, where)
        undo = cache_loaders(learn, fc.BUDGET, loaders=[learn.dls.train], disk=c == 'disk')[0] if c != 'none' else (lambda: None)
        try:
            with learn.removed_cbs(set_aside(learn)): return run_trial(learn, batches, 3, time.monotonic() + 1200)
        finally: undo()
    for r in range(a.repeats):
        total = 0.
        for config in configs:
            t0 = time.perf_counter()
            prof = trial(config, 40)
            total += time.perf_counter() - t0
            rates[config].append(_measured(prof)['Samples/s'])
        sweep_s.append(total)
        learn = learner(0)
        t0 = time.perf_counter()
        res = learn.speed_find(max_time=300, show=False)
        find_s.append(time.perf_counter() - t0)
        if a.show: print(res.text(), flush=True)
        kept = {f.kind: f.value for f in res.fixes}
        cache = 'none' if 'cache_items' not in kept else 'disk' if kept['cache_items'] == 'disk' else 'memory'
        chosen.append((kept.get('num_workers', 0), cache, 'item'))
        if r == 0:  # a seeded epoch with what it kept, and one without, with the workers it kept: bit-identical
            def fit(apply:bool):
                l = learner(kept.get('num_workers', 0))
                if apply: res.apply(l, show=False)
                set_seed(1)
                with l.no_bar(), l.no_logging(): l.fit(1)
                return l.model.state_dict()
            x, y = fit(False), fit(True)
            same = all(torch.equal(x[k], y[k]) for k in x)
            print(f'a seeded epoch with {", ".join(f.name for f in res.fixes) or "nothing"} applied and without: '
                  f'{"bit-identical" if same else "DIFFERENT"}', flush=True)
        find_rate.append(res.trials['Samples/s'][res.trials.Accepted].iloc[-1] if res.trials.Accepted.any() else res.trials['Samples/s'][0])
        print(f'repeat {r + 1}: sweep {total:.1f} s, speed_find {find_s[-1]:.1f} s, kept {res.fixes and ", ".join(f.name for f in res.fixes) or "nothing"}', flush=True)
    med = {c: float(np.median(v)) for c, v in rates.items()}
    name = lambda c: f'num_workers={c[0]}' + {'none': '', 'memory': ', item cache', 'disk': ', item cache and disk'}[c[1]] + ('' if c[2] == 'item' else ', resize on the batch')
    print('\nconfiguration                                        samples/s (median of repeats)')
    for c in configs: print(f'  {name(c):<50} {med[c]:8,.0f}')
    best, start = max(med, key=med.get), med[(0, 'none', 'item')]
    for i, c in enumerate(chosen):
        if c not in med:
            print(f'repeat {i + 1}: speed_find chose {name(c)}, outside the sweep (raise --max-workers); its own trial {find_rate[i]:,.0f} samples/s, '
                  f'{find_rate[i]/start:.2f}x the start, {find_rate[i]/med[best]:.0%} of the sweep\'s best ({name(best)})')
            continue
        print(f'repeat {i + 1}: speed_find chose {name(c)}: {med[c]/start:.2f}x the start, {med[c]/med[best]:.0%} of the sweep\'s best '
              f'({name(best)}), its own trial {find_rate[i]:,.0f} samples/s; {find_s[i]:.1f} s against the sweep\'s {sweep_s[i]:.1f} s '
              f'({find_s[i]/sweep_s[i]:.0%})')
    if not a.ref_passes: return
    kept = [c for c in dict.fromkeys(chosen) if c in med]
    cands = [c for c in configs if med[c] >= a.ref_within*med[best] or c in kept]
    ref, rng = {c: [] for c in cands}, np.random.default_rng(0)
    for _ in range(a.ref_passes):
        for i in rng.permutation(len(cands)):
            ref[cands[i]].append(np.asarray(trial(cands[i], a.ref_batches).distributions[_KEY], dtype=float))
    def throughput(passes): return {c: BS/float(np.concatenate([ref[c][p] for p in passes]).mean()) for c in cands}
    tp = throughput(range(a.ref_passes))
    top = max(tp, key=tp.get)
    boot = [throughput(rng.integers(0, a.ref_passes, a.ref_passes)) for _ in range(1000)]
    print(f'\nthe reference: {a.ref_passes} passes of {a.ref_batches} batches over the candidates (a sweep median within '
          f"{a.ref_within:.0%} of the sweep's best, or kept), shuffled")
    for c in cands: print(f'  {name(c):<50} {tp[c]:8,.0f}' + ('  (the best)' if c == top else ''))
    for c in kept:
        lo, hi = np.percentile([b[c]/max(b.values()) for b in boot], [5, 95])
        print(f'speed_find chose {name(c)} in {chosen.count(c)} of {len(chosen)}: {tp[c]/tp[top]:.0%} of the reference\'s best '
              f'(90% interval {lo:.0%}-{hi:.0%})')
    print(f"it meets the bar in every repeat: {all(c in tp and tp[c]/tp[top] >= 0.9 and med[c]/start >= 2 for c in chosen) and all(f <= s/3 for f, s in zip(find_s, sweep_s))} "
          "(at least 90% of the reference's best, 2x the start in the sweep, a third of the sweep's time)")

if __name__ == '__main__': main()

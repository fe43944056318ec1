"""What timing the loader's stages (`learn.profile(stages=True)`) costs per item and per batch, in this process (no
workers: a worker runs the same code), iterating whole epochs plain and watched, interleaved, medians of the rounds:

- a fastai DataLoader of small images read from memory (`Resize` and `ToTensor` on each item, the default collation,
  `IntToFloatTensor` on each batch), so the loader's own Python is most of its time (`stages.watch_stages`);
- a plain PyTorch DataLoader over tensors in memory (`stages.watch_torch_stages`), where each item is a tensor index.

    python benchmarks/stages_cost.py                 # 2,048 items, batches of 64, 7 rounds
    python benchmarks/stages_cost.py --bs 8          # more batches for the same items
"""
import argparse, statistics, time
import numpy as np, torch
from fastai.vision.all import DataBlock, ImageBlock, CategoryBlock, PILImageBW, Resize
from fastxtend_prof.features.stages import watch_stages, watch_torch_stages

def fastai_loader(n:int, bs:int):
    from sklearn.datasets import load_digits
    d = load_digits()
    images = [(d.images[i % len(d.images)]*16).astype(np.uint8) for i in range(n)]
    dblock = DataBlock(blocks=(ImageBlock(PILImageBW), CategoryBlock), get_x=lambda i: PILImageBW.create(images[i]),
                       get_y=lambda i: d.target[i % len(d.target)], item_tfms=Resize(8), splitter=lambda items: (list(items), []))
    return dblock.dataloaders(list(range(n)), bs=bs, num_workers=0, device='cpu', shuffle=False, drop_last=False).train

def torch_loader(n:int, bs:int):
    from torch.utils.data import DataLoader, TensorDataset
    return DataLoader(TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,))), batch_size=bs)

def epoch(dl, watch) -> float:
    "Seconds to iterate `dl` once, with its stages timed by `watch` (None: not timed)"
    if watch is None:
        t = time.perf_counter()
        for _ in dl: pass
        return time.perf_counter() - t
    got = []
    with watch(dl, lambda w, st: got.append(st)) as taken:
        t = time.perf_counter()
        for _ in dl: taken()
        t = time.perf_counter() - t
    assert len(got) == len(dl)
    return t

def measure(name, dl, watch, n_items, rounds):
    epoch(dl, None); epoch(dl, watch)  # first-call costs
    times = {False: [], True: []}
    for _ in range(rounds):  # interleaved, so a slow moment of the machine falls on both
        times[False].append(epoch(dl, None)); times[True].append(epoch(dl, watch))
    plain, watched = statistics.median(times[False]), statistics.median(times[True])
    added = [w - p for p, w in zip(times[False], times[True])]
    print(f'{name}: {n_items:,} items in {len(dl)} batches, {rounds} interleaved rounds, medians')
    print(f'  plain    {plain*1e3:9.2f} ms an epoch  {plain/n_items*1e6:8.2f} µs an item')
    print(f'  watched  {watched*1e3:9.2f} ms an epoch  {watched/n_items*1e6:8.2f} µs an item  (x{watched/plain:.3f})')
    print(f'  added    {statistics.median(added)/n_items*1e6:8.2f} µs an item, {statistics.median(added)/len(dl)*1e6:8.1f} µs a batch '
          f'(round by round: {", ".join(f"{x/n_items*1e6:.2f}" for x in added)} µs an item)')

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--items', type=int, default=2048)
    ap.add_argument('--bs', type=int, default=64)
    ap.add_argument('--rounds', type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(1)
    measure('fastai DataLoader', fastai_loader(a.items, a.bs), watch_stages, a.items, a.rounds)
    measure('PyTorch DataLoader', torch_loader(a.items, a.bs), watch_torch_stages, a.items, a.rounds)

if __name__ == '__main__': main()

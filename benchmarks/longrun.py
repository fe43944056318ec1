"""Long run: 1,000,000 synthetic batches through the recorder, with `keep_raw=True` (a row of 12 float64 per batch)
and `keep_raw=False` (rows folded into constant-size summaries every `chunk` rows).

Each batch makes the calls a profiled fastai train batch makes: draw, start_batch, six marks (pred, loss, backward,
step, stepped, zeroed), end_batch; the batches are split into `--epochs` train loops. Each configuration runs in its
own process, twice: once plain, for the time of recording and of `summarize` and the peak resident memory
(`ru_maxrss`, above the process's size before recording), and once under `tracemalloc` for the peak of Python
allocations (tracemalloc slows everything down, so its run is not timed).

    python benchmarks/longrun.py                      # 1,000,000 batches, 10 epochs
    python benchmarks/longrun.py --batches 200000 --epochs 4
"""
import argparse, json, resource, subprocess, sys, time, tracemalloc

def _maxrss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss*1024  # Linux reports KiB

def worker(keep_raw, batches, epochs, trace):
    from fastxtend_prof.core.recorder import TimingRecorder, summarize, Phase, Step, AFTER_PRED, AFTER_LOSS, BEFORE_BACKWARD, BEFORE_STEP, AFTER_STEP, PRE_AFTER_BATCH
    rec = TimingRecorder(warmup=1, keep_raw=keep_raw)
    per_epoch = [batches//epochs + (i < batches % epochs) for i in range(epochs)]
    base = _maxrss()
    if trace: tracemalloc.start()
    draw, start, mark, end = rec.draw, rec.start_batch, rec.mark, rec.end_batch
    t0 = time.perf_counter()
    rec.start(Step.FIT)
    for n in per_epoch:
        rec.start(Step.EPOCH)
        rec.begin_phase(Phase.TRAIN)
        for _ in range(n):
            draw(); start(16.)
            mark(AFTER_PRED); mark(AFTER_LOSS); mark(BEFORE_BACKWARD); mark(BEFORE_STEP); mark(AFTER_STEP); mark(PRE_AFTER_BATCH)
            end()
        draw()
        rec.end_phase()
        rec.stop(Step.EPOCH)
    rec.stop(Step.FIT)
    t_record = time.perf_counter() - t0
    held = rec.nbytes()
    rss_record = _maxrss() - base
    if trace: peak_record = tracemalloc.get_traced_memory()[1]; tracemalloc.reset_peak()
    t0 = time.perf_counter()
    rows = summarize(rec)
    t_summarize = time.perf_counter() - t0
    counted = next(st['Number of Calls'] for p, _, s, st in rows if p is Phase.TRAIN and s is Step.BATCH)
    warm = next(st['Number of Calls'] for p, _, s, st in rows if p is Phase.TRAIN and s is Step.WARMUP)
    assert counted + warm == batches, (counted, warm, batches)
    out = dict(t_record=t_record, t_summarize=t_summarize, held=held, rss_record=rss_record, rss_total=_maxrss() - base)
    if trace: out.update(peak_record=peak_record, peak_summarize=tracemalloc.get_traced_memory()[1])
    return out

def run(keep_raw, batches, epochs, trace):
    cmd = [sys.executable, __file__, '--worker', str(int(keep_raw)), '--batches', str(batches), '--epochs', str(epochs)]
    if trace: cmd.append('--trace')
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])

def mb(b): return f'{b/2**20:,.1f} MiB'

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--batches', type=int, default=1_000_000)
    ap.add_argument('--epochs', type=int, default=10)
    ap.add_argument('--worker', type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument('--trace', action='store_true', help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker is not None: return print(json.dumps(worker(bool(a.worker), a.batches, a.epochs, a.trace)))
    print(f'{a.batches:,} batches in {a.epochs} epochs, 9 recorder calls per batch; one process per run')
    head = ('keep_raw', 'record', 'per batch', 'summarize', 'held after', 'held B/batch', 'peak alloc (record)',
            'peak alloc (summarize)', 'peak B/batch', 'max RSS growth')
    table = []
    for keep_raw in (True, False):
        r, t = run(keep_raw, a.batches, a.epochs, False), run(keep_raw, a.batches, a.epochs, True)
        peak = max(t['peak_record'], t['peak_summarize'])
        table.append((str(keep_raw), f"{r['t_record']:.2f} s", f"{1e6*r['t_record']/a.batches:.2f} µs",
                      f"{r['t_summarize']*1e3:,.0f} ms", mb(r['held']), f"{r['held']/a.batches:.1f}",
                      mb(t['peak_record']), mb(t['peak_summarize']), f'{peak/a.batches:.1f}', mb(r['rss_total'])))
    w = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(head)]
    print('  '.join(h.rjust(n) for h, n in zip(head, w)))
    for row in table: print('  '.join(v.rjust(n) for v, n in zip(row, w)))

if __name__ == '__main__': main()

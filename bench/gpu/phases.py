"""Per-run phases of `knn graph` from its KNN_PROFILE output (stderr), one line per run:
when the concurrent parts before the rounds ended, the graph step, the rounds and the total.
Usage: python3 bench/gpu/phases.py PROFILE.txt [TIMING.json]"""
import json
import re
import sys

runs, cur = [], {}
for line in open(sys.argv[1]):
    m = re.match(r"pipeline: (.+?) ended at ([\d.]+) ms", line)
    if m:
        cur[m.group(1) + "@"] = float(m.group(2))
        continue
    m = re.match(r"pipeline: (.+?): ([\d.]+) ms", line)
    if m:
        what, ms = m.group(1), float(m.group(2))
        if what.startswith("candidates"):
            continue
        cur[what] = ms
        if what.startswith("prepared data"):
            runs.append(cur)
            cur = {}
times = json.load(open(sys.argv[2]))["times_ms"] if len(sys.argv) > 2 else [None] * len(runs)
print("run | checks@ prep@ fetch@ out@ shown@ | until rounds | graph step | out wait | rounds | check | total (timed)")
for i, (r, t) in enumerate(zip(runs, times)):
    g = lambda k: r.get(k, float("nan"))
    graph = g("engine (symmetric, all rows)")
    print(f"{i:3} | {g('value checks@'):6.1f} {g('prepare@'):5.1f} {g('prefetch@'):6.1f} {g('output pages@'):5.1f} {g('output shown to the engine@'):6.1f} |"
          f" {g('prepare'):6.1f} | {graph:6.1f} | {g('output joined') - graph:5.1f} | {g('rounds done'):6.1f} |"
          f" {g('output checked'):4.1f} | {t if t is None else round(t, 1)}")

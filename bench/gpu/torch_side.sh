# ours while a PyTorch process that ran the same graph stays alive (as in hellinger_table.py)
d=$(mktemp -d)
python3 - "$d" <<'PY' &
import sys, time, numpy as np, torch
d = sys.argv[1]
x = np.random.default_rng(80000).random((80000, 256), dtype=np.float32)
np.save(f"{d}/x.npy", x)
r = torch.from_numpy(x).cuda().sqrt(); rn = (r*r).sum(1)
for s in range(0, 80000, 10000):
    dist = torch.addmm(rn[s:s+10000, None] + rn[None, :], r[s:s+10000], r.t(), beta=1.0, alpha=-2.0)
    v = torch.topk(dist, 100, dim=1, largest=False)
torch.cuda.synchronize()
open(f"{d}/ready", "w").write("1")
time.sleep(60)
PY
while [ ! -f $d/ready ]; do sleep 0.5; done
for b in knn knn-4k knn knn-4k; do .gpu/$b graph -p $d/x.npy -k 100 -m hellinger --device cuda --repeat 5 --timing-json $d/t.json -o $d/g.npy --force --quiet; echo "$b (torch alive) $(python3 -c "import json; print(json.load(open('$d/t.json'))['median_ms'])") ms"; done
KNN_PROFILE=1 .gpu/knn graph -p $d/x.npy -k 100 -m hellinger --device cuda --repeat 3 -o $d/g.npy --force --quiet 2>&1 | grep -v "candidates and"
kill %1

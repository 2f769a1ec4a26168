"""Writes the HDF5 test files of knn-io and knn-cli (run from this folder, with h5py and numpy:
`pip install h5py numpy`, then `python3 make_hdf5.py`). Same output on every run.

- ann.hdf5: the ann-benchmarks layout (as its datasets.py writes it): datasets train (300 x 8
  float32), test (25 x 8 float32), neighbors (25 x 10 int32), distances (25 x 10 float32), file
  attribute distance = "euclidean" (a variable-length string, as h5py writes a str). The values
  are whole numbers 0..255, so every format (bvecs too) holds the same data. neighbors are
  the true 10 nearest by (distance, id).
- angular.hdf5: what other writers do: chunked, deflate- and shuffle-compressed float64 train,
  chunked float32 test, int64 neighbors, distance = b"angular" (a fixed-length string), a
  dataset in a group (grp/ids, int16 big-endian), and datasets knn cannot read as points:
  cube (3-D), names (strings), half (float16, readable).
- latest.hdf5: libver="latest" (newest superblock and layout messages), train and test only,
  no distance attribute.
"""

import h5py
import numpy as np


def knn(train, test, k, metric):
    if metric == "euclidean":
        d = np.sqrt(((test[:, None, :] - train[None, :, :]) ** 2).sum(-1))
    else:
        tn = test / np.linalg.norm(test, axis=1, keepdims=True)
        bn = train / np.linalg.norm(train, axis=1, keepdims=True)
        d = 1.0 - tn @ bn.T
    ids = np.argsort(d, axis=1, kind="stable")[:, :k]
    return ids, np.take_along_axis(d, ids, axis=1)


rng = np.random.default_rng(24)
train = rng.integers(0, 256, size=(300, 8)).astype(np.float64)
test = rng.integers(0, 256, size=(25, 8)).astype(np.float64)

ids, dist = knn(train, test, 10, "euclidean")
with h5py.File("ann.hdf5", "w") as f:
    f.attrs["type"] = "dense"
    f.attrs["distance"] = "euclidean"
    f.attrs["dimension"] = 8
    f.attrs["point_type"] = "float"
    f.create_dataset("train", data=train.astype(np.float32))
    f.create_dataset("test", data=test.astype(np.float32))
    f.create_dataset("neighbors", data=ids.astype(np.int32))
    f.create_dataset("distances", data=dist.astype(np.float32))

gtrain = rng.standard_normal((120, 6))
gtest = rng.standard_normal((9, 6))
ids, dist = knn(gtrain, gtest, 5, "angular")
with h5py.File("angular.hdf5", "w") as f:
    f.attrs["distance"] = np.bytes_(b"angular")
    f.create_dataset("train", data=gtrain, chunks=(16, 6), compression="gzip", shuffle=True)
    f.create_dataset("test", data=gtest.astype(np.float32), chunks=(4, 3))
    f.create_dataset("neighbors", data=ids.astype(np.int64), compression="gzip")
    f.create_dataset("distances", data=dist.astype(np.float32))
    f.create_dataset("grp/ids", data=np.arange(12, dtype=">i2").reshape(3, 4))
    f.create_dataset("cube", data=np.zeros((2, 2, 2), dtype=np.float32))
    f.create_dataset("names", data=np.array([b"a", b"b"]))
    f.create_dataset("half", data=np.array([[0.5, 1.5], [2.0, -3.0]], dtype=np.float16))

with h5py.File("latest.hdf5", "w", libver="latest") as f:
    f.create_dataset("train", data=gtrain.astype(np.float32), chunks=(32, 6), compression="gzip")
    f.create_dataset("test", data=gtest.astype(np.float32))

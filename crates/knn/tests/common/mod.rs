//! What the `knn` crate's test files share: the devices, uniform data, adversarial data sets.
#![allow(dead_code)] // each test file uses its own part

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use knn::synth::{generate, Distribution};
use knn::{Device, DeviceResults, Index, Knn, Neighbors, Options};
use knn_testkit::all_metrics;
use knn_testkit::gpu_available_or_skip;
use std::sync::Arc;

pub fn cpu() -> Options {
    Options {
        device: Device::Cpu,
        ..Options::default()
    }
}

/// GPU 0's options, or `None` (the test says it skipped) when no GPU is usable.
pub fn gpu(test: &str) -> Option<Options> {
    let opts = Options {
        device: Device::Cuda(0),
        ..Options::default()
    };
    let usable = Knn::new(&opts).is_ok();
    gpu_available_or_skip(usable, test).then_some(opts)
}

pub fn uniform(n: usize, d: usize, seed: u64) -> Vec<f32> {
    generate(Distribution::Uniform { lo: 0.0, hi: 1.0 }, n, d, seed)
}

/// Data sets: (name, base, queries): uniform, far from the origin (centred by the engines),
/// tiny values (scaled), duplicates (ties everywhere).
pub fn data_sets(d: usize) -> Vec<(&'static str, Vec<f32>, Vec<f32>)> {
    let mut far = uniform(700, d, 3);
    far.iter_mut().for_each(|v| *v += 4.0e6);
    let mut far_q = uniform(90, d, 4);
    far_q.iter_mut().for_each(|v| *v += 4.0e6);
    let tiny: Vec<f32> = uniform(600, d, 5).iter().map(|v| v * 1e-30).collect();
    let tiny_q: Vec<f32> = uniform(60, d, 6).iter().map(|v| v * 1e-30).collect();
    let protos = uniform(5, d, 7);
    let dup: Vec<f32> = (0..400)
        .flat_map(|i| protos[(i * 7 % 5) * d..(i * 7 % 5 + 1) * d].to_vec())
        .collect();
    vec![
        ("uniform", uniform(1100, d, 1), uniform(130, d, 2)),
        ("far from the origin", far, far_q),
        ("tiny values", tiny, tiny_q),
        ("duplicates", dup.clone(), dup[..50 * d].to_vec()),
    ]
}

/// `rows × k` results a device call wrote into `ids` (i64 when `ids_i64`, else u32 in the
/// buffer's first half) and `dists`, read back.
pub fn read_results(
    stream: &Arc<CudaStream>,
    (ids, dists): (&CudaSlice<i64>, &CudaSlice<f32>),
    (rows, k): (usize, usize),
    ids_i64: bool,
) -> Neighbors {
    let wide = stream.clone_dtoh(ids).unwrap();
    let mut ids: Vec<u32> = match ids_i64 {
        true => wide
            .iter()
            .map(|&i| u32::try_from(i).expect("an i64 id fits a u32"))
            .collect(),
        false => wide
            .iter()
            .flat_map(|&w| {
                let b = w.to_le_bytes();
                [
                    u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                    u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
                ]
            })
            .collect(),
    };
    let mut distances = stream.clone_dtoh(dists).unwrap();
    ids.truncate(rows * k);
    distances.truncate(rows * k);
    Neighbors { k, ids, distances }
}

/// `rows × k` results that `write` puts in GPU memory (given their room on `stream`: i64 ids
/// when `ids_i64`, else u32 ids in the first half; NaN distances, so that a row left
/// unwritten shows), read back.
pub fn results_on_device(
    stream: &Arc<CudaStream>,
    (rows, k): (usize, usize),
    ids_i64: bool,
    write: impl FnOnce(DeviceResults) -> knn::Result<()>,
) -> knn::Result<Neighbors> {
    let ids = stream.alloc_zeros::<i64>((rows * k).max(1)).unwrap();
    let dists = stream
        .clone_htod(&vec![f32::NAN; (rows * k).max(1)])
        .unwrap();
    {
        let (ip, _i) = ids.device_ptr(stream);
        let (dp, _d) = dists.device_ptr(stream);
        write(DeviceResults {
            ids: ip,
            ids_i64,
            distances: dp,
        })?;
    }
    Ok(read_results(stream, (&ids, &dists), (rows, k), ids_i64))
}

/// Every metric but the expressions (they take the host's path as cosine does, and each
/// compiles a module) on every data set of `sets`, each base an index on `opts` (a base an
/// index refuses is skipped: refused alike on the host, tests/index.rs): what `case(index,
/// queries, k)` finds wrong for each of `ks`, named by metric, data set and k.
pub fn failures_on_every_metric(
    opts: &Options,
    d: usize,
    sets: Vec<(&'static str, Vec<f32>, Vec<f32>)>,
    ks: &[usize],
    mut case: impl FnMut(&Index, &[f32], usize) -> Option<String>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for metric in all_metrics(d).into_iter().filter(|m| !m.is_expr()) {
        for (name, base, queries) in &sets {
            let Ok(index) = Index::new(base.clone(), d, metric.clone(), opts) else {
                continue;
            };
            for &k in ks {
                if let Some(e) = case(&index, queries, k) {
                    failures.push(format!("{metric} {name} k={k}: {e}"));
                }
            }
        }
    }
    failures
}

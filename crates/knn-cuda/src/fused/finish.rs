//! Rows finished on the device: the `k` best of each row's candidates by exact f64 key, as
//! distances ([`Finish`], [`Finished`]), and the exact keys themselves (`exact_keys`).

use crate::device::{dev_err, Gpu, Queued, Readback};
use crate::floor::InputAbs;
use crate::DeviceQueries;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use knn_core::{Kernel, OutputRows, Result};

/// Rows to finish on the device (see `knn_core::Engine::finish_rows`): the `k` best of each
/// row's candidates by exact key, as distances of `mode` (see `finish_lists` in
/// `common.cuh`), written into `host` (`nq × k` ids and distances, asked for only once the
/// rows' launches are queued), or with `device`, read from and written to device memory
/// (`host` then unused).
pub(crate) struct Finish<'a> {
    pub k: usize,
    pub mode: i32,
    pub host: &'a mut dyn OutputRows,
    pub device: Option<DeviceIo>,
    /// How the device proves rows whose query norms its kernels measure (queries uploaded or
    /// read from device memory; rows of the resident base go to the host's floors).
    pub proof: Option<ProofPlan>,
}

/// The constants of `prove_rows` (see `common.cuh`): the floors of `crate::floor::floors`
/// for rows whose query norms the kernels measured, and the verdict `kth · key_scale < floor`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProofPlan {
    pub kernel: Kernel,
    pub d: usize,
    /// Upper bound on the (centred) base rows' norms.
    pub bn_max: f32,
    /// The kernel's units: of the accumulation, and of the inputs' relative rounding.
    pub units: (f64, f64),
    /// The inputs' absolute rounding per coordinate (see `GraphLists::input_abs`).
    pub eta: f64,
    pub key_scale: f64,
    /// The lists hold every base point: every row is final.
    pub complete: bool,
}

/// Rows the device proved (see [`ProofPlan`]).
#[derive(Clone, Debug)]
pub(crate) struct Proven {
    /// One per row: final.
    pub rows: Vec<bool>,
    /// The largest upper bound on a query's norm (of the centred row, as the kernels used
    /// it); NaN when a query's norm is not finite.
    pub query_top: f32,
}

/// Where `finish_lists`' per-row facts go: to the host (the k-th exact key and W-th composite
/// of each row, for its floor), or into `prove_rows` on the device.
pub(super) enum RowFacts<'a> {
    Host(&'a mut [f64], &'a mut [u64]),
    /// The plan, the rows' cuts and f32 squared query norms, the verdicts' bytes and the
    /// call's summary words (device addresses).
    Device {
        plan: ProofPlan,
        cut: u64,
        qsq: u64,
        proven: u64,
        summary: u64,
    },
}

/// Rows finished into device memory (the output's host rows then unused): `k` ids (u32, or
/// i64 with `ids_i64`) and `k` f32 distances per row, the call's row i at row i of `ids` and
/// `dists`. With `queries`, the call's query rows are read from device memory too (the
/// request's host queries are then empty and unused); without, they are the request's own
/// (a graph's rows, which lie in the resident base).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceIo {
    pub queries: Option<DeviceQueries>,
    pub ids: u64,
    pub ids_i64: bool,
    pub dists: u64,
}

impl DeviceIo {
    /// Where row `at` of the results goes for `k` neighbours a row: its ids (and whether they
    /// are i64) and its distances.
    pub(crate) fn row(&self, at: usize, k: usize) -> (u64, bool, u64) {
        let id_bytes = if self.ids_i64 { 8 } else { 4 };
        let at = (at * k) as u64;
        (self.ids + at * id_bytes, self.ids_i64, self.dists + at * 4)
    }
}

impl Finish<'_> {
    /// The same rows, borrowed again (for a retry of a call).
    pub(crate) fn reborrow(&mut self) -> Finish<'_> {
        Finish {
            k: self.k,
            mode: self.mode,
            host: &mut *self.host,
            device: self.device,
            proof: self.proof,
        }
    }
}

/// What the host needs besides the finished rows: per row, the k-th exact key and the W-th
/// composite (whose key, with the row's `cut`, gives its floor), or the device's verdicts
/// (`proof`; `kth` and `last` are then empty).
pub(crate) struct Finished {
    pub kth: Vec<f64>,
    pub last: Vec<u64>,
    pub proof: Option<Proven>,
}

/// One query chunk's share of the finished rows: ids and distances (unless they were written
/// to device memory), and the facts of each row for its floor.
pub(super) struct FinishedChunk<'a> {
    pub(super) rows: Option<(&'a mut [u32], &'a mut [f32])>,
    pub(super) kth: &'a mut [f64],
    pub(super) last: &'a mut [u64],
}

/// A chunk's finished rows on their way to the host: queued in the call's readback (each
/// buffer, where it fitted), copied into entries `range` of the output once it has landed.
pub(super) struct RowsInFlight {
    ids: Option<Queued<u32>>,
    dists: Option<Queued<f32>>,
    range: std::ops::Range<usize>,
}

impl RowsInFlight {
    /// Copies the rows into the output's `ids` and `dists` (the readback waited for).
    pub(super) fn land(self, reads: &Readback<'_>, (ids, dists): (&mut [u32], &mut [f32])) {
        if let Some(q) = self.ids {
            reads.take(q, &mut ids[self.range.clone()]);
        }
        if let Some(q) = self.dists {
            reads.take(q, &mut dists[self.range]);
        }
    }
}

/// Launches `finish_lists` on the chunk's `n` candidate lists (`lists`: composites, exact
/// keys, width) and queues its rows for entries `host.1` of `host.0` in `reads` (those that
/// do not fit there are downloaded now, the output asked for once the launch is queued), or
/// with `on_device` (device addresses of the chunk's ids, i64 or u32, and distances) writes
/// them there; the rows' k-th keys and W-th composites go where `facts` says.
#[allow(clippy::too_many_arguments)]
pub(super) fn finish_lists(
    gpu: &Gpu,
    lists: (&CudaSlice<u64>, &CudaSlice<f64>, usize),
    (k, mode): (usize, i32),
    (nb, excl): (usize, u64),
    bad: u64,
    host: (&mut dyn OutputRows, std::ops::Range<usize>),
    facts: RowFacts<'_>,
    on_device: Option<(u64, bool, u64)>,
    reads: &mut Readback<'_>,
    n: usize,
) -> Result<Option<RowsInFlight>> {
    let (comps, exact, w) = lists;
    let (own, (ids, ids_i64, dists)) = match on_device {
        Some(to) => (None, to),
        None => {
            let (i, d) = (gpu.alloc::<u32>(n * k)?, gpu.alloc::<f32>(n * k)?);
            let at = (gpu.ptr(&i), false, gpu.ptr(&d));
            (Some((i, d)), at)
        }
    };
    let kth = gpu.alloc::<f64>(n)?;
    let last = gpu.alloc::<u64>(n)?;
    let rows = ((ids, ids_i64), dists, gpu.ptr(&kth), gpu.ptr(&last));
    let lists = (gpu.ptr(comps), gpu.ptr(exact), w);
    launch_finish(gpu, lists, (k, mode), (nb, excl), bad, rows, n)?;
    if let RowFacts::Device {
        plan,
        cut,
        qsq,
        proven,
        summary,
    } = facts
    {
        let rows = (gpu.ptr(&kth), gpu.ptr(&last), cut, qsq);
        launch_prove(gpu, plan, rows, n, (proven, summary))?;
    }
    let mut in_flight = None;
    if let Some((ids, dists)) = &own {
        let (rows, range) = host;
        // SAFETY: both buffers hold n × k values and are freed in stream order, behind the
        // copies.
        let (ids_q, dists_q) = unsafe {
            (
                reads.queue::<u32>(gpu.ptr(ids), n * k)?,
                reads.queue::<f32>(gpu.ptr(dists), n * k)?,
            )
        };
        if ids_q.is_none() || dists_q.is_none() {
            let (host_ids, host_dists) = rows.buffers();
            if ids_q.is_none() {
                gpu.download_into(ids, &mut host_ids[range.clone()])?;
            }
            if dists_q.is_none() {
                gpu.download_into(dists, &mut host_dists[range.clone()])?;
            }
        }
        in_flight = Some(RowsInFlight {
            ids: ids_q,
            dists: dists_q,
            range,
        });
    }
    if let RowFacts::Host(kth_out, last_out) = facts {
        gpu.download_into(&kth, kth_out)?;
        gpu.download_into(&last, last_out)?;
    }
    Ok(in_flight)
}

/// Launches `prove_rows` (see `common.cuh`) on `n` rows: their k-th exact keys, W-th
/// composites, cuts and f32 squared query norms at `rows`, verdicts into `proven` (n bytes),
/// the count of rows left unproven and the largest norm bound into `summary` (words 1–3).
pub(super) fn launch_prove(
    gpu: &Gpu,
    plan: ProofPlan,
    (kth, last, cut, qsq): (u64, u64, u64, u64),
    n: usize,
    (proven, summary): (u64, u64),
) -> Result<()> {
    let f = gpu.func("prove_rows")?;
    let kind: i32 = match plan.kernel {
        Kernel::SqL2 => 0,
        Kernel::NegDot => 1,
        Kernel::L1 => 2,
        Kernel::Linf => 3,
    };
    let (nn, dd, complete) = (n as i32, plan.d as i32, i32::from(plan.complete));
    let (u, u_in) = plan.units;
    let (gamma, input) = plan.kernel.error_bounds(plan.d, u, u_in).constants();
    let (abs_a, abs_c, abs_g2, abs_k) =
        InputAbs::new(plan.kernel, plan.d, (u, u_in, plan.eta)).constants();
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&kth)
        .arg(&last)
        .arg(&cut)
        .arg(&qsq)
        .arg(&nn)
        .arg(&kind)
        .arg(&dd)
        .arg(&plan.bn_max)
        .arg(&gamma)
        .arg(&input)
        .arg(&abs_a)
        .arg(&abs_c)
        .arg(&abs_g2)
        .arg(&abs_k)
        .arg(&plan.key_scale)
        .arg(&complete)
        .arg(&proven)
        .arg(&summary);
    // SAFETY: kth, last, cut and qsq hold n values each, proven n bytes, summary 4 words.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (n.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }
    .map_err(dev_err("prove_rows"))?;
    Ok(())
}

/// Launches `finish_lists` (see `common.cuh`) on `n` rows: composites and exact keys at
/// `lists` (`n × w` each), the rows' excluded ids at `excl` (or 0), into the device addresses
/// `out` (ids, i64 when flagged else u32, and distances `n × k`, k-th keys and W-th
/// composites `n`).
pub(super) fn launch_finish(
    gpu: &Gpu,
    (comps, exact, w): (u64, u64, usize),
    (k, mode): (usize, i32),
    (nb, excl): (usize, u64),
    bad: u64,
    ((ids, ids_i64), dists, kth, last): ((u64, bool), u64, u64, u64),
    n: usize,
) -> Result<()> {
    let (p, pk) = (w.next_power_of_two(), k.next_power_of_two());
    let f = gpu.func("finish_lists")?;
    let (ww, pp, kk, ppk, nb64) = (w as i32, p as i32, k as i32, pk as i32, nb as i64);
    let wide = i32::from(ids_i64);
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&comps)
        .arg(&exact)
        .arg(&ww)
        .arg(&pp)
        .arg(&kk)
        .arg(&ppk)
        .arg(&mode)
        .arg(&nb64)
        .arg(&excl)
        .arg(&ids)
        .arg(&dists)
        .arg(&kth)
        .arg(&last)
        .arg(&bad)
        .arg(&wide);
    // SAFETY: comps and exact hold n×w entries, excl n ids (or null), ids and dists n×k, kth
    // and last n, bad one word; the shared memory is the 12·(p + pk) bytes the kernel uses.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: ((p / 2).clamp(32, 512) as u32, 1, 1),
            shared_mem_bytes: (12 * (p + pk)) as u32,
        })
    }
    .map_err(dev_err("finish_lists"))?;
    Ok(())
}

/// Exact f64 keys (as the host's `Kernel::exact` of `kernel`, or with `None` Hellinger's
/// `Metric::exact_key`) of the `n × w` candidate composites `comps` for the given (uncentred)
/// queries `q` (address, rows) against the given base `b` (address, rows).
pub(super) fn exact_keys(
    gpu: &Gpu,
    kernel: Option<Kernel>,
    q: (u64, usize),
    b: (u64, usize),
    comps: u64,
    w: usize,
    d: usize,
) -> Result<CudaSlice<f64>> {
    let n = q.1;
    let out = gpu.alloc::<f64>(n * w)?;
    let kind: Option<i32> = kernel.map(|k| match k {
        Kernel::SqL2 => 0,
        Kernel::NegDot => 1,
        Kernel::L1 => 2,
        Kernel::Linf => 3,
    });
    let name = if kind.is_some() {
        "exact_keys"
    } else {
        "exact_keys_hellinger"
    };
    let f = gpu.func(name)?;
    let (nb64, n64, ww, dd, pc, po) = (
        b.1 as i64,
        n as i64,
        w as i32,
        d as i32,
        comps,
        gpu.ptr(&out),
    );
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&q.0)
        .arg(&b.0)
        .arg(&nb64)
        .arg(&pc)
        .arg(&n64)
        .arg(&ww)
        .arg(&dd);
    if let Some(kind) = &kind {
        l.arg(kind);
    }
    l.arg(&po);
    let cfg = if kind.is_some() {
        // Eight threads per (row, slot).
        LaunchConfig {
            grid_dim: ((n * w).div_ceil(32) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    } else {
        // One block per row (its query's roots shared), one thread per slot.
        LaunchConfig {
            grid_dim: (n as u32, w.div_ceil(128) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        }
    };
    // SAFETY: q holds n×d floats, b nb×d, comps and out n×w entries.
    unsafe { l.launch(cfg) }.map_err(dev_err(name))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{launch_prove, ProofPlan};
    use crate::device::Gpu;
    use crate::floor::{floors, F32_UNIT, TF32_ACC_UNIT, TF32_INPUT_UNIT};
    use crate::CudaEngine;
    use knn_core::{CandidateRequest, Kernel, MatrixRef};

    /// A uniform value in [lo, hi) from a SplitMix64 state.
    fn uniform(state: &mut u64, lo: f64, hi: f64) -> f64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        lo + (hi - lo) * (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The composite of key `k` and id `id` (the inverse of `fused::decode`).
    fn composite(k: f32, id: u32) -> u64 {
        let bits = k.to_bits();
        let ord = if bits & 0x8000_0000 == 0 {
            bits ^ 0x8000_0000
        } else {
            !bits
        };
        (u64::from(ord) << 32) | u64::from(id)
    }

    /// An upper bound on the norm whose square the kernels summed in f32 (`sq_norms`: error at
    /// most γ_{d+2}), with the host's margin of `floor::norm` (1 + 10⁻⁶): what `prove_rows`
    /// takes for a query's norm.
    fn norm_bound(s: f32, d: usize) -> f32 {
        let nu = (d + 2) as f64 * 2f64.powi(-24);
        let gamma = nu / (1.0 - nu);
        ((s as f64 / (1.0 - gamma)).sqrt() * (1.0 + 1e-6)) as f32
    }

    /// `prove_rows` gives the verdicts of the host's floors (`floor::floors` and
    /// `kth · key_scale < floor`) on every row, for every kernel and both units, with and
    /// without an absolute input rounding, with exact
    /// keys placed just below, on and just above each floor, cuts below the W-th key or none,
    /// unwritten W-th slots, and norms that are not finite; and the largest norm bound.
    #[test]
    fn device_verdicts_are_the_host_floors() {
        if !knn_testkit::gpu_available_or_skip(CudaEngine::available(), "device_verdicts") {
            return;
        }
        let gpu = Gpu::new(0).unwrap();
        let mut rng = 7u64;
        let (n, nb, w) = (3000usize, 400usize, 24usize);
        for d in [3usize, 128] {
            let base = vec![0.0f32; nb * d];
            // An absolute input rounding (f16's subnormals in the collect form) at d = 128.
            let eta = if d == 128 { 1e-3 } else { 0.0 };
            for kernel in [Kernel::SqL2, Kernel::NegDot, Kernel::L1, Kernel::Linf] {
                for (u, u_in) in [(F32_UNIT, 0.0), (TF32_ACC_UNIT, TF32_INPUT_UNIT)] {
                    for infinite in [false, true] {
                        let sq: Vec<f32> = (0..n)
                            .map(|i| match i % 500 {
                                7 if infinite => f32::INFINITY,
                                9 if infinite => f32::NAN,
                                _ => uniform(&mut rng, 0.0, 400.0) as f32,
                            })
                            .collect();
                        let last_key: Vec<f32> = (0..n)
                            .map(|i| match i % 97 {
                                0 => f32::NAN, // an unwritten slot
                                _ => uniform(&mut rng, -50.0, 900.0) as f32,
                            })
                            .collect();
                        let cut_key: Vec<f32> = (0..n)
                            .map(|i| match i % 3 {
                                0 => last_key[i] - uniform(&mut rng, 0.0, 5.0) as f32,
                                _ => f32::INFINITY,
                            })
                            .collect();
                        let last: Vec<u64> = last_key.iter().map(|&k| composite(k, 5)).collect();
                        let cut: Vec<u64> = cut_key
                            .iter()
                            .map(|&k| {
                                if k == f32::INFINITY {
                                    u64::MAX
                                } else {
                                    composite(k, 9)
                                }
                            })
                            .collect();
                        let bn_max = 17.25f32;
                        let b = MatrixRef::new("base", &base, d).unwrap();
                        let req = CandidateRequest {
                            base: b,
                            queries: MatrixRef::new_unchecked_values("q", &[], d).unwrap(),
                            kernel,
                            width: w,
                            exclude: None,
                            precise: false,
                            base_key: None,
                            exact_data: true,
                            exact_from: None,
                        };
                        let qn: Vec<f32> = sq.iter().map(|&s| norm_bound(s, d)).collect();
                        let (cut_f, last_f): (Vec<f32>, Vec<f32>) = (cut_key, last_key);
                        let fl = floors(
                            &req,
                            (&last_f, 1),
                            &cut_f,
                            (bn_max, Some(&qn)),
                            None,
                            (u, u_in, eta),
                        );
                        let key_scale = 0.5;
                        // Exact keys a little below, on, and a little above each floor.
                        let kth: Vec<f64> = fl
                            .iter()
                            .enumerate()
                            .map(|(i, &f)| {
                                let at = f as f64 / key_scale;
                                match i % 4 {
                                    0 => at,
                                    1 => at * (1.0 - 1e-12) - 1e-300,
                                    2 => at * (1.0 + 1e-12) + 1e-300,
                                    _ => at + uniform(&mut rng, -2.0, 2.0),
                                }
                            })
                            .collect();
                        let want: Vec<bool> =
                            (0..n).map(|i| kth[i] * key_scale < fl[i] as f64).collect();
                        let plan = ProofPlan {
                            kernel,
                            d,
                            bn_max,
                            units: (u, u_in),
                            eta,
                            key_scale,
                            complete: false,
                        };
                        let (kth_d, last_d, cut_d, sq_d) = (
                            gpu.upload(&kth).unwrap(),
                            gpu.upload(&last).unwrap(),
                            gpu.upload(&cut).unwrap(),
                            gpu.upload(&sq).unwrap(),
                        );
                        let proven = gpu.alloc::<u8>(n).unwrap();
                        let summary = gpu.stream.alloc_zeros::<u32>(4).unwrap();
                        let rows = (
                            gpu.ptr(&kth_d),
                            gpu.ptr(&last_d),
                            gpu.ptr(&cut_d),
                            gpu.ptr(&sq_d),
                        );
                        let out = (gpu.ptr(&proven), gpu.ptr(&summary));
                        launch_prove(&gpu, plan, rows, n, out).unwrap();
                        let got = gpu.download(&proven, n).unwrap();
                        let words = gpu.download(&summary, 4).unwrap();
                        for i in 0..n {
                            assert_eq!(
                                got[i] != 0,
                                want[i],
                                "{kernel:?} d={d} u_in={u_in} row {i}: kth {} floor {}",
                                kth[i],
                                fl[i]
                            );
                        }
                        let unproven = want.iter().filter(|&&p| !p).count();
                        assert_eq!(words[1] as usize, unproven);
                        assert!(unproven > n / 8 && unproven < n - n / 8, "{unproven}");
                        assert_eq!(words[3] != 0, infinite);
                        let top = qn
                            .iter()
                            .filter(|x| x.is_finite())
                            .fold(0.0f32, |a, &x| a.max(x));
                        assert_eq!(words[2], top.to_bits());
                    }
                }
            }
        }
    }
}

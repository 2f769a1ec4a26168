//! The shared engine suite on every CUDA method, GPU = CPU under the oracle check, large widths,
//! and tiling forced by a tiny memory budget. Without a GPU every test prints SKIPPED and passes
//! (`KNN_REQUIRE_GPU=1` makes that a failure).

use knn_core::synth::{generate, Distribution};
use knn_core::{check, graph, search, Engine, Matrix, Metric, Symmetry, DEFAULT_TOLERANCE};
use knn_cuda::{CollectPlan, CudaEngine, CudaTuning, Method};
use knn_testkit as kit;

/// Device 0 with `method`, paired as `knn` pairs it: the CPU engine serves the lists wider
/// than the kernels hold.
fn cuda(method: Method) -> knn_core::Result<CudaEngine> {
    Ok(CudaEngine::new(0, method)?.with_fallback(Box::new(knn_cpu::CpuEngine::default())))
}

fn engines() -> Vec<CudaEngine> {
    Method::ALL
        .iter()
        .map(|&m| cuda(m).expect("CUDA engine"))
        .collect()
}

fn uniform(n: usize, d: usize, seed: u64) -> Matrix {
    Matrix::new(
        "u",
        generate(Distribution::Uniform { lo: 0.0, hi: 1.0 }, n, d, seed),
        d,
    )
    .unwrap()
}

/// Tile sizes of the kernels: fused 128 × 128 tiles, baselines 16 × 16.
const TILES: [usize; 2] = [16, 128];

#[test]
fn smoke_devices() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "smoke_devices") {
        return;
    }
    let devs = knn_cuda::devices();
    assert!(!devs.is_empty());
    eprintln!("{devs:?}");
    let e = cuda(Method::Fused).unwrap();
    let b = uniform(300, 8, 1);
    let q = uniform(7, 8, 2);
    let r = search(&e, b.view(), q.view(), 3, &Metric::L2).unwrap();
    let rep = check(
        b.view(),
        Some(q.view()),
        3,
        &Metric::L2,
        &r,
        DEFAULT_TOLERANCE,
    )
    .unwrap();
    assert!(rep.passed(), "{:?}", rep.first_problem);
}

#[test]
fn tile_edges() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "tile_edges") {
        return;
    }
    for e in engines() {
        kit::check_tile_edges(&e, &TILES);
    }
}

#[test]
fn metrics() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "metrics") {
        return;
    }
    for e in engines() {
        kit::check_metrics(&e);
    }
}

#[test]
fn adversarial() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "adversarial") {
        return;
    }
    for e in engines() {
        kit::check_adversarial(&e);
    }
}

#[test]
fn errors() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "errors") {
        return;
    }
    for e in engines() {
        kit::check_errors(&e);
    }
}

fn same_as_cpu(e: &dyn Engine, b: &Matrix, q: Option<&Matrix>, k: usize, metric: &Metric) {
    let cpu = knn_cpu::CpuEngine::default();
    let (gr, cr) = match q {
        Some(q) => (
            search(e, b.view(), q.view(), k, metric).unwrap(),
            search(&cpu, b.view(), q.view(), k, metric).unwrap(),
        ),
        None => (
            graph(e, b.view(), k, metric).unwrap(),
            graph(&cpu, b.view(), k, metric).unwrap(),
        ),
    };
    let rep = check(
        b.view(),
        q.map(|q| q.view()),
        k,
        metric,
        &gr,
        DEFAULT_TOLERANCE,
    )
    .unwrap();
    assert!(
        rep.passed(),
        "{} {metric} k={k}: {:?}",
        e.name(),
        rep.first_problem
    );
    assert_eq!(
        gr.ids,
        cr.ids,
        "{} {metric} k={k}: ids differ from the CPU",
        e.name()
    );
    assert_eq!(gr.distances, cr.distances, "{} {metric} k={k}", e.name());
}

#[test]
fn equals_cpu() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "equals_cpu") {
        return;
    }
    let b = uniform(20011, 64, 31);
    let q = uniform(333, 64, 32);
    for e in engines() {
        for metric in [Metric::SqL2, Metric::InnerProduct, Metric::L1, Metric::Linf] {
            for k in [1, 16, 100] {
                same_as_cpu(&e, &b, Some(&q), k, &metric);
            }
        }
    }
    let g = uniform(3001, 24, 33);
    for e in engines() {
        same_as_cpu(&e, &g, None, 10, &Metric::L2);
    }
}

/// A few queries (the `few_*` kernels up to 8, the tiles from 9) equal the CPU engine's on
/// every built-in kernel, list widths of each kernel size, a base spread over many splits
/// (two-pass merges), and on queries that are base rows stored in runs of duplicates (ties).
#[test]
fn few_queries() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "few_queries") {
        return;
    }
    let e = cuda(Method::Fused).unwrap();
    let b = uniform(200_003, 40, 41);
    // Runs of 7 equal rows: every query's neighbours tie in groups.
    let runs: Vec<f32> = (0..30_000 * 12)
        .map(|i| ((i / 12 / 7 * 31 + i % 12) % 97) as f32)
        .collect();
    let dup = Matrix::new("dup", runs, 12).unwrap();
    for n in [1, 3, 4, 5, 8, 9] {
        let q = uniform(n, 40, 42 + n as u64);
        let rows: Vec<f32> = (0..n)
            .flat_map(|i| dup.view().row(i * 35).to_vec())
            .collect();
        let qd = Matrix::new("qd", rows, 12).unwrap();
        for metric in [Metric::SqL2, Metric::InnerProduct, Metric::L1, Metric::Linf] {
            for k in [1, 16, 100, 128] {
                same_as_cpu(&e, &b, Some(&q), k, &metric);
                same_as_cpu(&e, &dup, Some(&qd), k, &metric);
            }
        }
    }
}

/// Graphs with each unordered pair computed once (`kernels/sym.cu`) equal the CPU engine's,
/// on odd and even tile counts, one tile, splits, every metric and list width, and on points
/// stored in runs of duplicates (all neighbours in the own tile, ties everywhere).
#[test]
fn symmetric_graphs() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "symmetric_graphs") {
        return;
    }
    let e = cuda(Method::Fused).unwrap().with_symmetry(Symmetry::On);
    kit::check_tile_edges(&e, &TILES);
    eprintln!("tile edges: {} symmetric graphs", e.symmetric_graphs());
    kit::check_adversarial(&e);
    eprintln!("adversarial: {} symmetric graphs", e.symmetric_graphs());
    let metrics = Metric::PLAIN;
    let mut graphs = 0;
    for (n, d) in [
        (2, 5),
        (129, 16),
        (383, 8),
        (512, 33),
        (1000, 64),
        (7001, 24),
    ] {
        let b = uniform(n, d, n as u64);
        for metric in &metrics {
            for k in [1, 5, 30, 100].into_iter().filter(|&k| k < n) {
                eprintln!("symmetric graph n={n} d={d} {metric} k={k}");
                same_as_cpu(&e, &b, None, k, metric);
                graphs += 1;
            }
        }
    }
    // 60 distinct points, each stored 50 times in a row.
    let (n, d) = (3000, 12);
    let distinct = uniform(60, d, 77);
    let runs: Vec<f32> = (0..n)
        .flat_map(|i| distinct.view().row(i / 50).to_vec())
        .collect();
    let runs = Matrix::new("runs", runs, d).unwrap();
    for metric in &metrics {
        for k in [5, 30, 100] {
            eprintln!("symmetric graph of runs of duplicates {metric} k={k}");
            same_as_cpu(&e, &runs, None, k, metric);
            graphs += 1;
        }
    }
    // Rows scaled by 2^0 .. 2^-33 (and a zero row): f16's scaled values of the small rows fall
    // below its normal range, where only the floors' absolute term covers their rounding.
    let (n, d) = (2500, 16);
    let u = uniform(n, d, 91);
    let spread: Vec<f32> = (0..n)
        .flat_map(|i| {
            let s = if i == 7 {
                0.0
            } else {
                (-3.0 * (i % 12) as f32).exp2()
            };
            u.view()
                .row(i)
                .iter()
                .map(move |&v| v * s)
                .collect::<Vec<_>>()
        })
        .collect();
    let spread = Matrix::new("spread", spread, d).unwrap();
    for (metric, k) in [
        (Metric::SqL2, 30),
        (Metric::Hellinger, 10),
        (Metric::InnerProduct, 5),
    ] {
        eprintln!("symmetric graph of rows over 33 binary orders {metric} k={k}");
        same_as_cpu(&e, &spread, None, k, &metric);
        graphs += 1;
    }
    // The collect form (f16 kernels) under plans that go wrong on purpose: a threshold that
    // keeps fewer than the width (the lists' cut must then prove or retry the rows), and
    // buffers that overflow (every row retried). The same graphs either way.
    let wide = uniform(7001, 24, 5);
    let mut made = e.symmetric_graphs();
    for (stride, r, cap) in [(12, 2, 1024), (3, 40, 32)] {
        let plan = CollectPlan { stride, r, cap };
        let tuning = CudaTuning {
            collect: Some(plan),
            ..CudaTuning::default()
        };
        let e = cuda(Method::Fused)
            .unwrap()
            .with_symmetry(Symmetry::On)
            .with_tuning(tuning);
        for (metric, k) in [
            (Metric::SqL2, 30),
            (Metric::Hellinger, 100),
            (Metric::Cosine, 5),
        ] {
            eprintln!("symmetric graph, collect plan {plan:?}, {metric} k={k}");
            same_as_cpu(&e, &wide, None, k, &metric);
            same_as_cpu(&e, &runs, None, k, &metric);
            graphs += 2;
        }
        made += e.symmetric_graphs();
    }
    eprintln!("{made} of {graphs} graphs made symmetrically");
    // Every first try but those the pipeline asks precise at once (adaptive) or that go past the
    // on-chip widths.
    assert!(made >= graphs / 2, "{made} of {graphs}");
}

/// A graph asked for again on the same engine and points is computed again (the first call's
/// lists are not its answer), and is the same graph.
#[test]
fn repeated_graphs_are_made_again() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "repeated_graphs_are_made_again") {
        return;
    }
    let e = cuda(Method::Fused).unwrap().with_symmetry(Symmetry::On);
    let points = uniform(3000, 32, 11);
    for metric in [Metric::SqL2, Metric::Hellinger] {
        let first = graph(&e, points.view(), 10, &metric).unwrap();
        let made = e.symmetric_graphs();
        let again = graph(&e, points.view(), 10, &metric).unwrap();
        assert_eq!(first, again, "{metric}");
        assert_eq!(e.symmetric_graphs(), made + 1, "{metric}: not made again");
    }
}

/// Fixed splits, whole (untruncated) split lists, wider first tries and one copy thread: the
/// same answers as the automatic tuning (the CPU engine's), for searches and graphs.
#[test]
fn tunings() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "tunings") {
        return;
    }
    let b = uniform(9001, 64, 61);
    let q = uniform(700, 64, 62);
    let big = uniform(16500, 256, 63);
    let auto = CudaTuning::default();
    for tuning in [
        CudaTuning {
            splits: Some(1),
            ..auto.clone()
        },
        CudaTuning {
            splits: Some(7),
            truncate_splits: false,
            ..auto.clone()
        },
        CudaTuning {
            width: Some(72),
            copy_threads: Some(1),
            ..auto.clone()
        },
    ] {
        let e = cuda(Method::Fused).unwrap().with_tuning(tuning.clone());
        assert_eq!(e.tuning(), &tuning);
        for metric in [Metric::SqL2, Metric::L1, Metric::Cosine] {
            eprintln!("{tuning:?}: {metric}");
            same_as_cpu(&e, &b, Some(&q), 16, &metric);
            same_as_cpu(&e, &b, None, 10, &metric);
        }
        same_as_cpu(&e, &big, None, 10, &Metric::Hellinger);
    }
}

/// Bases large enough (≥ 2²² values) that the pipeline has the engine copy them while the host
/// prepares (`Engine::prefetch_base`): graphs and a search, with and without derived rows.
#[test]
fn prefetched_bases() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "prefetched_bases") {
        return;
    }
    let e = cuda(Method::Fused).unwrap();
    let b = uniform(16500, 256, 3);
    let q = uniform(700, 256, 4);
    for metric in [Metric::Hellinger, Metric::SqL2] {
        eprintln!("prefetched base, graph {metric}");
        same_as_cpu(&e, &b, None, 10, &metric);
        eprintln!("prefetched base, search {metric}");
        same_as_cpu(&e, &b, Some(&q), 10, &metric);
    }
}

#[test]
fn large_widths() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "large_widths") {
        return;
    }
    let b = uniform(9000, 32, 41);
    let q = uniform(40, 32, 42);
    let fused = cuda(Method::Fused).unwrap();
    let cublas = cuda(Method::Cublas).unwrap();
    for k in [129, 1024, 4096] {
        for metric in [Metric::L2, Metric::L1] {
            same_as_cpu(&fused, &b, Some(&q), k, &metric);
        }
    }
    same_as_cpu(&cublas, &b, Some(&q), 1024, &Metric::L2);
    same_as_cpu(&fused, &uniform(5000, 16, 43), None, 4096, &Metric::L2);
}

#[test]
fn tiny_budget_tiles_base_and_queries() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "tiny_budget") {
        return;
    }
    let b = uniform(12000, 40, 51);
    let q = uniform(700, 40, 52);
    for m in Method::ALL {
        let e = cuda(m).unwrap().with_memory_budget(1 << 20);
        for k in [5, 200] {
            same_as_cpu(&e, &b, Some(&q), k, &Metric::L2);
        }
        same_as_cpu(&e, &uniform(2500, 40, 53), None, 7, &Metric::L1);
    }
}

/// The fused method's device-side exact keys are the host's `Kernel::exact`, bit for bit, for
/// every kernel, on data near the origin and far from it (centred on the device, so the given
/// rows must be kept beside the centred ones), for a dimension that is not a multiple of 8, and
/// on repeated calls (resident base) and a second base.
#[test]
fn device_exact_keys_are_the_host_ones() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "device_exact_keys") {
        return;
    }
    use knn_core::{base_key, CandidateRequest, Kernel};
    let e = cuda(Method::Fused).unwrap();
    for (d, lo) in [(13, 0.0f32), (64, 4e3)] {
        let shift = |m: Matrix| {
            let v: Vec<f32> = m.view().as_slice().iter().map(|x| x + lo).collect();
            Matrix::new("x", v, d).unwrap()
        };
        let b = shift(uniform(3000, d, 61));
        let q = shift(uniform(300, d, 62));
        let key = base_key();
        for kernel in [Kernel::SqL2, Kernel::NegDot, Kernel::L1, Kernel::Linf] {
            for width in [16, 100] {
                let req = CandidateRequest {
                    base: b.view(),
                    queries: q.view(),
                    kernel,
                    width,
                    exclude: None,
                    precise: false,
                    base_key: Some(key),
                    exact_data: true,
                    exact_from: None,
                };
                let (c, exact) = e.candidates_with_exact(&req).unwrap();
                let exact = exact.expect("the fused method gives exact keys for a resident base");
                for (i, (&id, &x)) in c.ids.iter().zip(&exact).enumerate() {
                    let want = kernel.exact(q.view().row(i / width), b.view().row(id as usize));
                    assert_eq!(
                        x.to_bits(),
                        want.to_bits(),
                        "{kernel:?} d={d} row {} id {id}: device {x} host {want}",
                        i / width
                    );
                }
            }
        }
    }
}

/// Hellinger's device-side exact keys (from the given rows, the request holding their square
/// roots) are the host's `Metric::exact_key`, bit for bit, with values from 0 to 4e6, at a
/// dimension of the kernel's 16-byte loads (256), others, and one past a 512-coordinate stage
/// of the kernel; and a search through the pipeline,
/// which takes them, equals the CPU engine's.
#[test]
fn device_hellinger_keys_are_the_host_ones() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "device_hellinger_keys") {
        return;
    }
    use knn_core::{base_key, CandidateRequest, ExactFrom, Kernel, Metric};
    let e = cuda(Method::Fused).unwrap();
    for d in [7, 256, 515] {
        let spread = |m: Matrix, seed: u32| {
            let v: Vec<f32> = (m.view().as_slice().iter().enumerate())
                .map(|(i, &x)| match (i as u32 ^ seed) % 7 {
                    0 => 0.0,
                    1 => x * 4e6,
                    _ => x,
                })
                .collect();
            Matrix::new("x", v, d).unwrap()
        };
        let b = spread(uniform(2000, d, 71), 1);
        let q = spread(uniform(200, d, 72), 2);
        let root = |m: &Matrix| {
            let v: Vec<f32> = m.view().as_slice().iter().map(|x| x.sqrt()).collect();
            Matrix::new("r", v, d).unwrap()
        };
        let (rb, rq) = (root(&b), root(&q));
        let key = base_key();
        for width in [16, 130] {
            let req = CandidateRequest {
                base: rb.view(),
                queries: rq.view(),
                kernel: Kernel::SqL2,
                width,
                exclude: None,
                precise: false,
                base_key: Some(key),
                exact_data: false,
                exact_from: Some(ExactFrom::Hellinger {
                    base: b.view(),
                    queries: q.view(),
                }),
            };
            let (c, exact) = e.candidates_with_exact(&req).unwrap();
            let exact = exact.expect("the fused method gives Hellinger keys for a resident base");
            for (i, (&id, &x)) in c.ids.iter().zip(&exact).enumerate() {
                let want =
                    Metric::Hellinger.exact_key(q.view().row(i / width), b.view().row(id as usize));
                assert_eq!(
                    x.to_bits(),
                    want.to_bits(),
                    "d={d} row {} id {id}: device {x} host {want}",
                    i / width
                );
            }
        }
        same_as_cpu(&e, &b, Some(&q), 10, &Metric::Hellinger);
        same_as_cpu(&e, &b, None, 10, &Metric::Hellinger);
    }
}

/// Hellinger's centred roots derived on the device (from the given rows it uploads) are the
/// host's bit for bit: FP32 candidates of a derived base equal those of the same rows made on
/// the host, for queries of their own and for the base's own rows (whose norms the device
/// measures), and the host never makes the derived rows.
#[test]
fn device_derived_roots_are_the_host_ones() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "device_derived_roots") {
        return;
    }
    use knn_core::{base_key, CandidateRequest, CentredRoots, Kernel};
    let e = cuda(Method::Fused).unwrap();
    for d in [7, 256, 515] {
        let b = uniform(3001, d, 81);
        let v: Vec<f32> = b
            .view()
            .as_slice()
            .iter()
            .enumerate()
            .map(|(i, &x)| if i % 5 == 0 { x * 4e6 } else { x })
            .collect();
        let b = Matrix::new("b", v, d).unwrap();
        let centre: Vec<f64> = (0..d).map(|j| 0.3 + j as f64 * 1e-3).collect();
        let made = CentredRoots::new(b.view(), centre.clone());
        let host = Matrix::new("h", made.view().as_slice().to_vec(), d).unwrap();
        let roots = CentredRoots::new(b.view(), centre);
        let q = uniform(100, d, 82);
        for (rows, width) in [(0..200, 16), (1000..1300, 130)] {
            for own_rows in [false, true] {
                let ask = |base: knn_core::MatrixRef<'_>, key| {
                    let queries = if own_rows {
                        base.slice_rows(rows.start, rows.end)
                    } else {
                        q.view()
                    };
                    let exclude: Vec<u32> = (rows.start as u32..rows.end as u32).collect();
                    let req = CandidateRequest {
                        base,
                        queries,
                        kernel: Kernel::SqL2,
                        width,
                        exclude: own_rows.then_some(&exclude[..]),
                        precise: true,
                        base_key: Some(key),
                        exact_data: false,
                        exact_from: None,
                    };
                    e.candidates(&req).unwrap()
                };
                let want = ask(host.view(), base_key());
                let got = ask(roots.view(), base_key());
                assert_eq!(got.ids, want.ids, "d={d} width {width} own rows {own_rows}");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got.keys), bits(&want.keys), "d={d} width {width}");
                for (g, w) in got.floor.iter().zip(&want.floor) {
                    assert!((g - w).abs() <= 1e-4 * w.abs().max(1.0), "floor {g} vs {w}");
                }
            }
        }
        assert!(
            !roots.view().centred_roots().unwrap().made,
            "the host made the roots"
        );
    }
}

#[test]
fn method_names_parse() {
    for m in Method::ALL {
        assert_eq!(m.name().parse::<Method>().unwrap(), m);
    }
    assert!("warp".parse::<Method>().is_err());
}

/// Expression metrics: the shared expression checks (same neighbours as the built-ins they
/// spell, identical Hellinger, errors), and the same answers as the CPU engine for every
/// expression of the suite, on one channel and several, at dimensions that end inside a staged
/// block, with large widths (device key tiles) and with a budget that streams the base.
#[test]
fn expressions() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "expressions") {
        return;
    }
    let fused = cuda(Method::Fused).unwrap();
    kit::check_expr(&fused);
    for d in [5, 16, 67] {
        let b = uniform(3001, d, 61 + d as u64);
        let q = uniform(257, d, 62 + d as u64);
        for metric in kit::expr_metrics() {
            same_as_cpu(&fused, &b, Some(&q), 10, &metric);
            same_as_cpu(&fused, &b, None, 7, &metric);
        }
    }
    let b = uniform(9000, 32, 63);
    let q = uniform(40, 32, 64);
    for text in [
        "acc + abs(x - y)",
        "acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)",
    ] {
        let metric = kit::expr(text);
        for k in [129, 1024] {
            same_as_cpu(&fused, &b, Some(&q), k, &metric);
        }
        let small = cuda(Method::Fused).unwrap().with_memory_budget(1 << 20);
        let q40 = uniform(300, 40, 66);
        same_as_cpu(&small, &uniform(12000, 40, 65), Some(&q40), 5, &metric);
    }
}

//! Tests of `device`.

use super::compile::*;

#[test]
fn finds_every_kernel_name() {
    assert_eq!(
        kernel_names(EXPR),
        [
            "fused_expr_w32",
            "fused_expr_w64",
            "fused_expr_w128",
            "tile_expr",
            "filter_expr"
        ]
    );
    let names: Vec<String> = SOURCES.iter().flat_map(|s| kernel_names(s)).collect();
    for n in [
        "sq_norms",
        "fill_u64",
        "fused_sql2_w32",
        "fused_linf_w128",
        "fused_tf32_negdot_w64",
        "few_sql2_w32",
        "few_linf_w128",
        "filter_linf",
        "tile_l1",
        "select_topk",
        "dist_texture_linf",
        "add_norms",
        "modified_insertion_sort",
        "grid_count_3",
        "grid_scan_blocks",
        "grid_query_sql2_k8",
        "grid_query_linf_k32",
        "grid_cand_l1",
        "grid_crowd_geom_3",
        "grid_sub_scatter",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} not found in {names:?}");
    }
    assert!(!names.iter().any(|x| x == "NAME"));
    let sym = kernel_names(SYM);
    assert_eq!(sym.len(), SYM_KERNELS, "{sym:?}");
    for n in [
        "sym_collect_f16_sql2_thr",
        "round_f16",
        "sym_tf32_negdot_w128",
    ] {
        assert!(sym.iter().any(|x| x == n), "{n} not found in {sym:?}");
    }
    // TF32 rounding lost to f16 in the collect form (NOTES.md, stop 17).
    assert!(!sym
        .iter()
        .any(|x| x.contains("collect_tf32") || x == "round_tf32"));
}

/// Kernels of the symmetric module (`kernels/sym.cu`).
const SYM_KERNELS: usize = 21;

/// The kernels a CUBIN image holds: its `.text.NAME` sections.
fn entries(image: &[u8]) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = image;
    while let Some(at) = rest.windows(6).position(|w| w == b".text.") {
        let tail = &rest[at + 6..];
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        names.push(String::from_utf8_lossy(&tail[..end]).into_owned());
        rest = &tail[end..];
    }
    names.sort();
    names.dedup();
    names
}

/// Compiles every kernel for sm_90 with NVRTC when the library can be loaded (no GPU
/// needed: `LD_LIBRARY_PATH` pointing at a `libnvrtc.so` is enough); skips otherwise.
/// The CUBIN images stay in the disk cache's layout under `nvrtc-cubin/` beside the test
/// binary (`target/release/deps/nvrtc-cubin/knn/`), e.g. for `cuobjdump -res-usage`
/// (registers and spills without a GPU) or to copy to a device's cache
/// (`$XDG_CACHE_HOME/knn/`) ahead of a run. Modules already there (same source, architecture
/// and NVRTC) are not compiled again: NVRTC compiled that very source before.
#[test]
fn kernels_compile_with_nvrtc() {
    if nvrtc_version().is_err() {
        eprintln!("SKIPPED: NVRTC not loadable here");
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .map_or_else(std::env::temp_dir, std::path::Path::to_path_buf)
        .join("nvrtc-cubin");
    std::env::set_var("XDG_CACHE_HOME", &dir);
    let main = entries(&compiled_main(9, 0).expect("kernels compile"));
    for n in SOURCES.iter().flat_map(|s| kernel_names(s)) {
        assert!(main.contains(&n), "{n} missing from the module");
    }
    assert!(
        !main.iter().any(|n| n.contains("_expr")),
        "expression kernels belong to their own modules"
    );
    // Expression modules: one channel, features, several channels with every function,
    // and a dimension that ends inside a stage.
    for (expr, d) in [
        ("acc + abs(x - y)", 128),
        ("acc + abs(x - y)", 100),
        ("acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)", 7),
        (
            "max(acc, min(x, y) / (1 + abs(x - y))) + exp(-x) * log(y + 1) - sqrt(x) * y^3",
            5,
        ),
    ] {
        let m = knn_core::Metric::Expr(std::sync::Arc::new(
            knn_core::MetricExpr::parse(expr).unwrap(),
        ));
        let data: Vec<f32> = (0..3 * d).map(|i| (i % 7) as f32 * 0.25).collect();
        let b = knn_core::MatrixRef::new("b", &data, d).unwrap();
        let prep = knn_core::prepare::prepare(&m, b, None).unwrap();
        let plan = prep.expr.as_ref().unwrap();
        let prelude = crate::expr::prelude(plan.program(), d * plan.program().stride);
        let image =
            compiled_expr(&prelude, 9, 0).unwrap_or_else(|e| panic!("{expr}: {e}\n{prelude}"));
        let names = entries(&image);
        for n in kernel_names(EXPR) {
            assert!(names.contains(&n), "{expr}: {n} missing");
        }
        assert!(
            !names.iter().any(|n| n == "fused_l1_w32"),
            "{expr}: built-ins compiled"
        );
    }
    let sym = entries(&compiled_sym(9, 0).expect("symmetric kernels compile"));
    let names = kernel_names(SYM);
    assert_eq!(names.len(), SYM_KERNELS, "{names:?}");
    for n in names {
        assert!(sym.contains(&n), "{n} missing");
    }
    assert!(
        !sym.iter().any(|n| n == "fused_l1_w32"),
        "symmetric module: built-ins compiled"
    );
    eprintln!("CUBIN images kept in {}", dir.join("knn").display());
}

/// Reads of several types land with one wait at their offsets; a read that does not fit is
/// refused (`None`), not written past the memory; a readback dropped with its reads in flight
/// leaves the memory to the next one intact.
#[test]
fn readbacks_land_every_queued_read() {
    if !knn_testkit::gpu_available_or_skip(crate::CudaEngine::available(), "readbacks") {
        return;
    }
    let gpu = super::Gpu::new(0).unwrap();
    let ids: Vec<u32> = (0..70_001).map(|i| i * 7 + 1).collect();
    let dists: Vec<f32> = (0..70_001).map(|i| i as f32 * 0.5 - 3.0).collect();
    let words: Vec<u64> = vec![u64::MAX, 3, 1 << 40];
    let (di, dd, dw) = (
        gpu.upload(&ids).unwrap(),
        gpu.upload(&dists).unwrap(),
        gpu.upload(&words).unwrap(),
    );
    for round in 0..3 {
        let mut reads = gpu.readback();
        // SAFETY: each buffer holds the values read, alive until the readback is dropped.
        let (qi, qd, qw) = unsafe {
            (
                reads.queue::<u32>(gpu.ptr(&di), ids.len()).unwrap(),
                reads.queue::<f32>(gpu.ptr(&dd), dists.len()).unwrap(),
                reads.queue::<u64>(gpu.ptr(&dw), words.len()).unwrap(),
            )
        };
        // The memory holds 2 MiB and a few words: 2 MiB more do not fit.
        // SAFETY: refused before any copy (the buffer holds 3 words).
        let big = unsafe { reads.queue::<u64>(gpu.ptr(&dw), 1 << 18) }.unwrap();
        assert!(big.is_none());
        if round == 1 {
            drop(reads); // in flight: landed by the drop, before the memory is reused
            continue;
        }
        reads.wait().unwrap();
        let (mut gi, mut gd, mut gw) = (vec![0u32; ids.len()], vec![0f32; dists.len()], [0u64; 3]);
        reads.take(qi.unwrap(), &mut gi);
        reads.take(qd.unwrap(), &mut gd);
        reads.take(qw.unwrap(), &mut gw);
        assert_eq!(gi, ids);
        assert_eq!(gd, dists);
        assert_eq!(gw[..], words[..]);
    }
}

/// The host's reading of `sq_norms`' warp: lane l sums `fmaf(v, v, s)` over j = l, l + 32, …,
/// then the lanes' sums meet by the xor shuffles 16, 8, 4, 2, 1.
fn warp_sq_norm(row: &[f32]) -> f32 {
    let mut s = [0f32; 32];
    for (l, acc) in s.iter_mut().enumerate() {
        for v in row.iter().skip(l).step_by(32) {
            *acc = v.mul_add(*v, *acc);
        }
    }
    for o in [16, 8, 4, 2, 1] {
        let prev = s;
        for (l, acc) in s.iter_mut().enumerate() {
            *acc = prev[l] + prev[l ^ o];
        }
    }
    s[0]
}

/// `ready_rows` in each of its forms, bit for bit against the host: a centred copy (the given
/// rows untouched), centring in place, norms alone, a plain copy; the cut of every row set to
/// `u64::MAX` and nothing past it. Rows not a multiple of a block's 8, dimensions on and off
/// the warp's 32.
#[test]
fn ready_rows_centre_measure_and_cut() {
    if !knn_testkit::gpu_available_or_skip(crate::CudaEngine::available(), "ready_rows") {
        return;
    }
    let gpu = super::Gpu::new(0).unwrap();
    for (rows, d) in [(13usize, 37usize), (8, 128), (1, 1), (70, 100)] {
        let given: Vec<f32> = (0..rows * d)
            .map(|i| ((i * 7919) % 1009) as f32 * 0.37 - 150.0)
            .collect();
        let centre: Vec<f32> = (0..d).map(|j| j as f32 * 1.5 - 20.25).collect();
        let centred: Vec<f32> = given
            .iter()
            .enumerate()
            .map(|(i, &v)| v - centre[i % d])
            .collect();
        let norms_of =
            |x: &[f32]| -> Vec<u32> { x.chunks(d).map(|r| warp_sq_norm(r).to_bits()).collect() };
        let bits = |x: &[f32]| -> Vec<u32> { x.iter().map(|v| v.to_bits()).collect() };
        let dc = gpu.upload(&centre).unwrap();
        for (form, centred_form, copy) in [
            ("centred copy", true, true),
            ("in place", true, false),
            ("norms alone", false, false),
            ("plain copy", false, true),
        ] {
            let from = gpu.upload(&given).unwrap();
            let to = gpu.alloc::<f32>(rows * d).unwrap();
            let norms = gpu.alloc::<f32>(rows).unwrap();
            // One word past the rows' cuts, which must keep its value.
            let mut cut_host = vec![7u64; rows + 1];
            cut_host[rows] = 42;
            let cut = gpu.upload(&cut_host).unwrap();
            let to_ptr = match (centred_form, copy) {
                (true, false) => gpu.ptr(&from),
                (_, true) => gpu.ptr(&to),
                (false, false) => 0,
            };
            let r = super::ReadyRows {
                from: gpu.ptr(&from),
                to: to_ptr,
                centre: if centred_form { gpu.ptr(&dc) } else { 0 },
                norms: gpu.ptr(&norms),
                cut: gpu.ptr(&cut),
            };
            gpu.ready_rows(rows, d, r).unwrap();
            let got_from = gpu.download(&from, rows * d).unwrap();
            let got_norms = gpu.download(&norms, rows).unwrap();
            let got_cut = gpu.download(&cut, rows + 1).unwrap();
            let want = if centred_form { &centred } else { &given };
            assert_eq!(
                bits(&got_norms),
                norms_of(want),
                "{form}, {rows} x {d}: norms"
            );
            let kept = if (centred_form, copy) == (true, false) {
                want
            } else {
                &given
            };
            assert_eq!(
                bits(&got_from),
                bits(kept),
                "{form}, {rows} x {d}: given rows"
            );
            if copy {
                let got_to = gpu.download(&to, rows * d).unwrap();
                assert_eq!(bits(&got_to), bits(want), "{form}, {rows} x {d}: copy");
            }
            assert!(
                got_cut[..rows].iter().all(|&c| c == u64::MAX),
                "{form}: cut"
            );
            assert_eq!(got_cut[rows], 42, "{form}: a word past the cut");
        }
    }
}

#[test]
fn locked_blocks_take_downloads_and_are_reused() {
    if !knn_testkit::gpu_available_or_skip(crate::CudaEngine::available(), "locked blocks") {
        return;
    }
    let gpu = super::Gpu::new(0).unwrap();
    let pool = super::LockedPool::new(gpu.ctx.clone(), gpu.pins.clone());
    // Larger than the staged copies' threshold: the download is a DMA into the block.
    let n = (super::STAGED_MIN / 8) + 12_345;
    let words: Vec<u64> = (0..n as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let dev = gpu.upload(&words).unwrap();
    let mut lent = pool.take::<u64>(n).expect("a block of that size");
    assert!(matches!(lent, super::HostVec::Locked { .. }));
    assert!(gpu.pins.contains(crate::staging::bytes_of(&lent)));
    gpu.download_into(&dev, &mut lent).unwrap();
    assert!(lent[..] == words[..]);
    let at = lent.as_ptr() as usize;
    drop(lent);
    // The same block again, for fewer values; its old contents are there (no zeroing).
    let again = pool.take::<u64>(n - 1).unwrap();
    assert_eq!(again.as_ptr() as usize, at);
    assert_eq!(again.len(), n - 1);
    assert_eq!(again.into_vec(), words[..n - 1]);
    // Too large for a block: ordinary memory, staged.
    assert!(pool.take::<u8>(super::locked::BLOCK_MAX + 1).is_none());
    // Freed with its pool: its range is no longer taken for page-locked memory.
    let probe = pool.take::<u64>(16).unwrap();
    let addr = probe.as_ptr() as usize;
    assert!(gpu.pins.covers(addr, 128));
    drop(probe);
    drop(pool);
    assert!(!gpu.pins.covers(addr, 128));
}

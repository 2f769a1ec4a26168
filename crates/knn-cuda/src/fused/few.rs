//! A few queries against the base: the `few_{tag}_w{32,64,128}` kernels (`kernels/few.cu`),
//! which read the base once, a warp per row, where the 128-query tiles would spend their
//! products on empty rows. One query against 10⁶ × 128 on an H200: 0.55 ms of kernels with the
//! tiles, 0.38 ms with these, against 0.107 ms to read the base (NOTES.md, "A few queries"); on
//! an H100 with `few1_*` at 4 blocks per SM 0.26 ms against 0.153 ms (NOTES.md, "One query").
//! Rows read 16 bytes a lane and 8 rows at a time per warp (`row_sums_x4`): `few1_sql2_w32` on
//! an H200 181 → 123 µs, 87 % of the DRAM bandwidth (NOTES.md, "Rows in flight").

use super::{Chunk, BASE_TILE};
use crate::device::{dev_err, Gpu};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use knn_core::Result;

/// Queries per block (`NQ` in the kernel) of the `few_*` kernels; a lone query takes the
/// `few1_*` ones (one per block).
const PER_BLOCK: usize = 4;
/// Largest query count sent here: beyond it the base is read once per 4 queries, and the
/// tiles' products catch up.
pub(super) const MAX_QUERIES: usize = 8;
/// Largest dimension (the block's queries stay in shared memory).
const MAX_DIM: usize = 2048;
/// Warps per block (256 threads).
const WARPS: usize = 8;

/// Each query's top `w` of every split of the chunk, as `fused_topk` writes them without
/// truncation: `(lists, splits)` with `lists[(q · splits + s) · w + i]` sorted and
/// SENTINEL-padded. `None` when the request is not one for these kernels (more queries, a
/// wide dimension, an expression's kernels); the tiles then take it.
pub(super) fn lists(
    gpu: &Gpu,
    tag: &str,
    slots: usize,
    few: &Chunk,
) -> Result<Option<(CudaSlice<u64>, usize)>> {
    let builtin = matches!(tag, "sql2" | "negdot" | "l1" | "linf");
    if !builtin || few.n > MAX_QUERIES || few.d > MAX_DIM || few.rows == 0 {
        return Ok(None);
    }
    // Blocks per SM in one wave: the register limit of each kernel (`few1_*` 48 registers a
    // thread, `few_*` about 110). Rows in flight, not arithmetic, bound these kernels: with 2
    // blocks of `few1_*` per SM an H100 read the base at 43 % of its bandwidth (Nsight Compute,
    // 25 % of warps occupied).
    let (name, per_block, per_sm) = match few.n {
        1 => (format!("few1_{tag}_w{}", 32 * slots), 1, 4),
        _ => (format!("few_{tag}_w{}", 32 * slots), PER_BLOCK, 2),
    };
    let smem = WARPS * per_block * 32 * slots * 8 + per_block * few.d * 4;
    if smem > gpu.max_smem_optin {
        return Ok(None);
    }
    let f = gpu.func_with_smem(&name, smem)?;
    // One wave (fewer splits also shorten the merge of their lists). Each warp keeps at least
    // a tile's rows, so that its list is not mostly its first fill.
    let splits = (per_sm * gpu.sm_count)
        .min(few.rows.div_ceil(WARPS * BASE_TILE))
        .max(1);
    let split_len = few.rows.div_ceil(splits);
    let splits = few.rows.div_ceil(split_len);
    let out = gpu.alloc::<u64>(few.n * splits * few.w)?;
    let (nq, nb, id0, d, ww, sl) = (
        few.n as i64,
        few.rows as i64,
        few.id0 as u32,
        few.d as i32,
        few.w as i32,
        split_len as i64,
    );
    let po = gpu.ptr(&out);
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&few.q)
        .arg(&few.qn)
        .arg(&nq)
        .arg(&few.b.0)
        .arg(&few.b.1)
        .arg(&nb)
        .arg(&id0)
        .arg(&d)
        .arg(&few.exclude)
        .arg(&ww)
        .arg(&sl)
        .arg(&po);
    // SAFETY: q holds n×d floats and qn n, b rows×d and its norms rows, exclude n ids (or
    // null), out n×splits×w; every (query, split) writes its w slots.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (few.n.div_ceil(per_block) as u32, splits as u32, 1),
            block_dim: ((WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        })
    }
    .map_err(dev_err(&name))?;
    Ok(Some((out, splits)))
}

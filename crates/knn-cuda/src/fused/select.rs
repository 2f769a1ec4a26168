//! Candidate lists and their selection: merges of sorted runs (the on-chip widths), the
//! large-width path (threshold filter over growing column ranges, radix select, key blocks
//! on overflow) and the priming of shared thresholds from earlier lists.

use super::{BASE_TILE, QUERY_TILE, SENTINEL, TILE_SMEM, TILE_SMEM_TF32};
use crate::device::{dev_err, Gpu};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use knn_core::Result;

/// Key columns per select step on the large-width path's overflow fallback.
const KEY_BLOCK: usize = 32768;
/// Survivor slots per query of the large-width threshold filter (at least 2·W).
pub(super) const FILTER_CAP: usize = 16384;

pub(super) struct Lists {
    pub(super) buf: CudaSlice<u64>,
}

/// `gthr[i]` = the W-th composite of row `i` of the sorted lists at `lists` (`n × w`), plus one
/// (filters keep composites strictly below the threshold, and that entry must stay).
pub(super) fn prime_thresholds(gpu: &Gpu, lists: u64, n: usize, w: usize, gthr: u64) -> Result<()> {
    let f = gpu.func("prime_thresholds")?;
    let (n64, ww) = (n as i64, w as i32);
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&lists).arg(&n64).arg(&ww).arg(&gthr);
    // SAFETY: lists holds n×w composites and gthr n.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (n.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }
    .map_err(dev_err("prime_thresholds"))?;
    Ok(())
}

/// Runs one warp merges one after another; longer chains (a few queries over many splits) are
/// split over several warps first.
const MERGE_CHAIN: usize = 32;

/// The top `w` of `a.1` sorted runs of `w` composites per row at `a.0` and, when `b` is not 0,
/// of one more sorted run per row at `b`, for `n` rows (`merge_w{slots}`, one warp per row).
/// More than [`MERGE_CHAIN`] runs are merged in two passes: groups of about √runs runs, one
/// warp each, then each row's group lists (the same answer: the top `w` of a union).
pub(super) fn merge_runs(
    gpu: &Gpu,
    n: usize,
    w: usize,
    slots: usize,
    a: (u64, usize),
    b: u64,
) -> Result<Lists> {
    let runs = a.1;
    if runs > MERGE_CHAIN {
        let group = runs.isqrt().max(2);
        let groups = runs.div_ceil(group);
        let partial = merge_pass(gpu, n, w, slots, (a.0, runs, group), 0, groups)?;
        return merge_pass(
            gpu,
            n,
            w,
            slots,
            (gpu.ptr(&partial.buf), groups, groups),
            b,
            1,
        );
    }
    merge_pass(gpu, n, w, slots, (a.0, runs, runs.max(1)), b, 1)
}

/// One launch of `merge_w{slots}`: `a` = (address, runs per row, runs per group), `groups`
/// lists per row out (see `kernels/fused.cu`, `merge_runs`).
fn merge_pass(
    gpu: &Gpu,
    n: usize,
    w: usize,
    slots: usize,
    a: (u64, usize, usize),
    b: u64,
    groups: usize,
) -> Result<Lists> {
    let out = gpu.alloc::<u64>(n * groups * w)?;
    let name = format!("merge_w{slots}");
    let f = gpu.func(&name)?;
    let (runs, group, n64, ww, po) = (a.1 as i32, a.2 as i32, n as i64, w as i32, gpu.ptr(&out));
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&a.0)
        .arg(&runs)
        .arg(&group)
        .arg(&b)
        .arg(&n64)
        .arg(&ww)
        .arg(&po);
    // SAFETY: a holds n×runs×w composites, b (or null) n×w, out n×groups×w with groups =
    // max(1, ⌈runs / group⌉); every slot of out written.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: ((n * groups * 32).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }
    .map_err(dev_err(&name))?;
    Ok(Lists { buf: out })
}

/// Launches `select_topk` for `n` rows: union of two composite lists (pointer, per-row count;
/// `bcount`, when not 0, points to per-row counts that cap b's) and optionally a key block
/// (pointer, columns, row stride, first id, exclude pointer).
fn select(
    gpu: &Gpu,
    n: usize,
    w: usize,
    a: (u64, usize),
    b: (u64, usize),
    bcount: u64,
    keys: Option<(u64, usize, usize, u32, u64)>,
) -> Result<Lists> {
    let out = gpu.alloc::<u64>(n * w)?;
    // Poison: an unwritten slot decodes to an invalid id and is caught on the host.
    gpu.fill_u64(gpu.ptr(&out), n * w, SENTINEL)?;
    let p = w.next_power_of_two();
    let smem = p * 8;
    let f = gpu.func_with_smem("select_topk", smem)?;
    let (pk, nk, ld, id0, px) = keys.unwrap_or((0, 0, 0, 0, 0));
    let (ma, mb, nk32, ld64, ww, pp) = (
        a.1 as i32, b.1 as i32, nk as i32, ld as i64, w as i32, p as i32,
    );
    let po = gpu.ptr(&out);
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&a.0)
        .arg(&ma)
        .arg(&b.0)
        .arg(&mb)
        .arg(&bcount)
        .arg(&pk)
        .arg(&ld64)
        .arg(&nk32)
        .arg(&id0)
        .arg(&px)
        .arg(&ww)
        .arg(&pp)
        .arg(&po);
    // SAFETY: lists hold n rows of ma / mb composites, keys n rows of stride ld, out n×w.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem as u32,
        })
    }
    .map_err(dev_err("select_topk"))?;
    Ok(Lists { buf: out })
}

/// What the large-width path needs of one query chunk × base chunk (device addresses).
pub(super) struct Large<'t> {
    pub(super) tag: &'t str,
    pub(super) tf: bool,
    pub(super) n: usize,
    pub(super) d: usize,
    pub(super) w: usize,
    pub(super) cap: usize,
    pub(super) q: u64,
    pub(super) qn: u64,
    pub(super) excl: u64,
    pub(super) b: u64,
    pub(super) bn: u64,
    /// Id of the chunk's first base row.
    pub(super) id0: usize,
}

/// Widest column range of one filter launch (grid y ≤ 65535 tiles).
const FILTER_COLS_MAX: usize = 1 << 22;

/// Large widths (W > 128) over `bl` base rows: a threshold filter over growing column ranges,
/// each followed by one select of (running list ∪ survivors). Survivors of a range are the keys
/// below the running W-th one, about W·len/seen for data in random order, so ranges grow with
/// the columns seen while staying under cap/2 expected survivors. A range whose survivors
/// overflow `cap` in some row is redone with whole key blocks in device memory.
pub(super) fn large(
    gpu: &Gpu,
    c: &Large<'_>,
    bl: usize,
    mut running: Option<Lists>,
) -> Result<Lists> {
    let (n, d, w, cap) = (c.n, c.d, c.w, c.cap);
    let buf = gpu.alloc::<u64>(n * cap)?;
    let mut count = gpu.alloc::<u32>(n)?;
    let name = format!("filter_{}{}", if c.tf { "tf32_" } else { "" }, c.tag);
    let smem = if c.tf { TILE_SMEM_TF32 } else { TILE_SMEM };
    let f = gpu.func_with_smem(&name, smem)?;
    let mut seen = 0;
    while seen < bl {
        let done = c.id0 + seen;
        let len = match &running {
            None => cap,
            Some(_) => (done * cap / (2 * w)).max(cap),
        };
        let len = (len.min(FILTER_COLS_MAX) / BASE_TILE * BASE_TILE)
            .max(BASE_TILE)
            .min(bl - seen);
        gpu.stream
            .memset_zeros(&mut count)
            .map_err(dev_err("clearing counts"))?;
        let run_ptr = running.as_ref().map_or(0, |r| gpu.ptr(&r.buf));
        let (pb, pbn) = (c.b + (seen * d * 4) as u64, c.bn + (seen * 4) as u64);
        let (nq64, nb64, id0, dd, ww, cc) = (
            n as i64,
            len as i64,
            done as u32,
            d as i32,
            w as i32,
            cap as i32,
        );
        let (pbuf, pcount) = (gpu.ptr(&buf), gpu.ptr(&count));
        let mut l = gpu.stream.launch_builder(f);
        l.arg(&c.q)
            .arg(&c.qn)
            .arg(&nq64)
            .arg(&pb)
            .arg(&pbn)
            .arg(&nb64)
            .arg(&id0)
            .arg(&dd)
            .arg(&c.excl)
            .arg(&run_ptr)
            .arg(&ww)
            .arg(&cc)
            .arg(&pbuf)
            .arg(&pcount);
        // SAFETY: q n×d, qn n, b/bn offset to `seen` inside the chunk with len rows left,
        // exclude n (or null), running n×w (or null), buf n×cap, count n.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (
                    n.div_ceil(QUERY_TILE) as u32,
                    len.div_ceil(BASE_TILE) as u32,
                    1,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: smem as u32,
            })
        }
        .map_err(dev_err(&name))?;
        let a = running.as_ref().map_or((0, 0), |r| (gpu.ptr(&r.buf), w));
        let next = select(gpu, n, w, a, (pbuf, cap), pcount, None)?;
        let counts = gpu.download(&count, n)?;
        let next = if counts.iter().any(|&k| k as usize > cap) {
            key_blocks(gpu, c, seen, len, running)?
        } else {
            next
        };
        running = Some(next);
        seen += len;
    }
    Ok(running.expect("the base chunk is not empty"))
}

/// Columns [seen, seen+len) of the chunk with FP32 key blocks in device memory, each merged into
/// the running list by a full select (the filter's overflow fallback).
fn key_blocks(
    gpu: &Gpu,
    c: &Large<'_>,
    seen: usize,
    len: usize,
    mut running: Option<Lists>,
) -> Result<Lists> {
    let (n, d, w) = (c.n, c.d, c.w);
    let kb = KEY_BLOCK.min(len);
    let keys = gpu.alloc::<f32>(n * kb)?;
    let name = format!("tile_{}", c.tag);
    let f = gpu.func(&name)?;
    for ks in (seen..seen + len).step_by(kb) {
        let ke = (ks + kb).min(seen + len);
        let kl = ke - ks;
        let pb = c.b + (ks * d * 4) as u64;
        let pbn = c.bn + (ks * 4) as u64;
        let pk = gpu.ptr(&keys);
        let (nq64, nb64, dd, ld) = (n as i64, kl as i64, d as i32, kl as i64);
        let mut l = gpu.stream.launch_builder(f);
        l.arg(&c.q)
            .arg(&c.qn)
            .arg(&nq64)
            .arg(&pb)
            .arg(&pbn)
            .arg(&nb64)
            .arg(&dd)
            .arg(&ld)
            .arg(&pk);
        // SAFETY: keys holds n×kb floats ≥ n×kl; b, bn offset inside the chunk.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (
                    n.div_ceil(QUERY_TILE) as u32,
                    kl.div_ceil(BASE_TILE) as u32,
                    1,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(dev_err(&name))?;
        let next = select(
            gpu,
            n,
            w,
            running.as_ref().map_or((0, 0), |r| (gpu.ptr(&r.buf), w)),
            (0, 0),
            0,
            Some((pk, kl, kl, (c.id0 + ks) as u32, c.excl)),
        )?;
        gpu.sync()?;
        running = Some(next);
    }
    Ok(running.expect("the range is not empty"))
}

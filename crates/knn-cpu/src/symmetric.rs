//! Symmetric self-join for kNN graphs: each unordered pair's key is computed once and folded
//! into both points' top-k lists (seeds 001 and 002).
//!
//! # Ownership
//! The points are cut into blocks of rows; every block owns the running lists ([`BlockLists`])
//! of its rows, so all `n` lists (`n·width` entries) live in memory at once. The work is the set of
//! block pairs `(I, J)` with `I ≤ J`: the keys of `I × J` are folded into the rows of `I` (by
//! row) and of `J` (by column); a diagonal pair `(I, I)` only takes the pairs `i < j`. A
//! round-robin *tournament* orders the pairs in rounds in which every block appears at most
//! once, so the tasks of a round touch disjoint lists and run in parallel without contention;
//! an odd block count gives each block one bye, which takes its diagonal pair.
//!
//! # Exactness
//! The keys are the CPU engine's own (bf16 or f32 GEMM form, or the direct L1/L∞ kernels), made
//! whole (`‖x‖² + ‖y‖² − 2x·y` rather than `‖y‖² − 2x·y`) so that a pair's key is one number
//! for both points. A key's rounding bound is the same seen from either side, so each row's
//! floor is its `width`-th key less the engine's bound for that row, exactly as in
//! [`Engine::candidates`](knn_core::Engine::candidates). The lists keep the `width` smallest
//! `(key, id)` (compared `≤` against thresholds, ties settled by the lists), so the candidates
//! do not depend on the thread count or the order of the rounds.

use crate::direct::DirectPlan;
use crate::engine::GemmPlan;
use knn_core::{CandidateRequest, Candidates, Kernel, MatrixRef};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Mutex;

/// Largest block of rows: a block pair's packed rows and columns stay in L2.
const MAX_BLOCK: usize = 512;
/// A row's buffer holds this many times `width` packed pairs before it is cut to `width` (3 and
/// 4 measured no faster: fewer cuts, but more pairs pass the staler thresholds).
const SLOTS_PER_WIDTH: usize = 2;
/// Block sizes are multiples of this (the widest SIMD query group), so groups never straddle
/// two blocks' thresholds.
const BLOCK_ALIGN: usize = 64;

/// What one symmetric computation did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymmetricStats {
    /// Rows per block (the last block may be shorter).
    pub block_rows: usize,
    /// Number of blocks.
    pub blocks: usize,
    /// Rounds of the tournament (each a parallel step).
    pub rounds: usize,
    /// Pair keys computed (`n(n−1)/2` plus what the kernels' micro-blocks compute beyond the
    /// diagonal); the one-sided path computes `n²`.
    pub pair_keys: u64,
}

/// `(key, id)` as one integer whose order is the lexicographic order of `(key, id)`, keys
/// compared by [`f32::total_cmp`]: the sign-magnitude bits of the key made monotone, then the id.
#[inline]
fn pack(key: f32, id: u32) -> u64 {
    let b = key.to_bits();
    let ordered = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
    (u64::from(ordered) << 32) | u64::from(id)
}

/// The `(key, id)` of [`pack`].
#[inline]
fn unpack(p: u64) -> (f32, u32) {
    let o = (p >> 32) as u32;
    let b = if o >> 31 == 1 { o & 0x7FFF_FFFF } else { !o };
    (f32::from_bits(b), p as u32)
}

/// The running lists of one block's rows, flat: per row a buffer of `2·width` packed
/// `(key, id)` ([`pack`]); accepted pairs are appended, and a full buffer is cut to its `width`
/// smallest by an integer selection, whose largest becomes the row's cut. This is
/// [`TopK`](knn_core::TopK)'s reservoir on one allocation per block with integer compares
/// (its tuple compares made compaction a fifth of a graph's time at d = 16), keeping the same
/// pairs: the `width` smallest `(key, id)` pushed, in any push order.
///
/// `thr` holds each row's cut key as f32 for the kernels' vector compares (`key ≤ thr`;
/// `+∞` before the first cut), padded with `−∞` to a whole number of [`BLOCK_ALIGN`] rows so
/// padding lanes never take a key.
pub(crate) struct BlockLists {
    width: usize,
    slots: Vec<u64>,
    len: Vec<u32>,
    cut: Vec<u64>,
    thr: Vec<f32>,
}

impl BlockLists {
    fn new(rows: usize, width: usize) -> Self {
        let mut thr = vec![f32::INFINITY; rows];
        thr.resize(rows.next_multiple_of(BLOCK_ALIGN), f32::NEG_INFINITY);
        BlockLists {
            width,
            slots: vec![0; rows * SLOTS_PER_WIDTH * width],
            len: vec![0; rows],
            cut: vec![u64::MAX; rows],
            thr,
        }
    }

    /// Offers `(key, id)` to row `a`.
    #[inline]
    fn push(&mut self, a: usize, key: f32, id: u32) {
        let p = pack(key, id);
        if p >= self.cut[a] {
            return;
        }
        let n = self.len[a] as usize;
        self.slots[a * SLOTS_PER_WIDTH * self.width + n] = p;
        self.len[a] = n as u32 + 1;
        if n + 1 == SLOTS_PER_WIDTH * self.width {
            self.compact(a);
        }
    }

    /// Keeps row `a`'s `width` smallest; its cut becomes the largest of them.
    fn compact(&mut self, a: usize) {
        let w = self.width;
        let n = self.len[a] as usize;
        if n <= w {
            return;
        }
        let row = &mut self.slots[a * SLOTS_PER_WIDTH * w..a * SLOTS_PER_WIDTH * w + n];
        row.select_nth_unstable(w - 1);
        self.len[a] = w as u32;
        self.cut[a] = row[w - 1];
        self.thr[a] = unpack(row[w - 1]).0;
    }

    /// Row `a`'s `width` smallest, sorted, into `keys` / `ids`.
    fn drain_sorted_into(&mut self, a: usize, keys: &mut [f32], ids: &mut [u32]) {
        self.compact(a);
        let w = self.width;
        let start = a * SLOTS_PER_WIDTH * w;
        let row = &mut self.slots[start..start + self.len[a] as usize];
        row.sort_unstable();
        debug_assert_eq!(row.len(), w);
        for ((k, i), &p) in keys.iter_mut().zip(ids.iter_mut()).zip(row.iter()) {
            (*k, *i) = unpack(p);
        }
    }
}

/// The two sides a block pair folds into, by local index: the rows of block `I` and the
/// columns, the rows of block `J` (the rows themselves on the diagonal).
pub(crate) struct Sides<'a> {
    rows: &'a mut BlockLists,
    cols: Option<&'a mut BlockLists>,
    row_first: u32,
    col_first: u32,
}

impl Sides<'_> {
    /// `true` for a diagonal pair `(I, I)`: only pairs with row < column are to be folded.
    #[inline]
    pub fn is_diagonal(&self) -> bool {
        self.cols.is_none()
    }

    /// Thresholds of the rows (padded with `−∞` to a multiple of 64 rows).
    #[inline]
    pub fn row_thr(&self) -> &[f32] {
        &self.rows.thr
    }

    /// Thresholds of the columns.
    #[inline]
    pub fn col_thr(&self) -> &[f32] {
        match &self.cols {
            Some(c) => &c.thr,
            None => &self.rows.thr,
        }
    }

    /// Point id of local row `a`.
    #[inline]
    pub fn row_id(&self, a: usize) -> u32 {
        self.row_first + a as u32
    }

    /// Point id of local column `b`.
    #[inline]
    pub fn col_id(&self, b: usize) -> u32 {
        self.col_first + b as u32
    }

    /// Offers `(key, id)` to the list of local row `a`.
    #[inline]
    pub fn push_row(&mut self, a: usize, key: f32, id: u32) {
        self.rows.push(a, key, id);
    }

    /// Offers `(key, id)` to the list of local column `b`.
    #[inline]
    pub fn push_col(&mut self, b: usize, key: f32, id: u32) {
        match &mut self.cols {
            Some(c) => c.push(b, key, id),
            None => self.rows.push(b, key, id),
        }
    }
}

/// Rows per block for `n` points on `threads` threads: at most [`MAX_BLOCK`], and small enough
/// that a round holds at least two tasks per thread.
fn block_rows(n: usize, threads: usize) -> usize {
    let per = n.div_ceil(4 * threads.max(1));
    per.next_multiple_of(BLOCK_ALIGN)
        .clamp(BLOCK_ALIGN, MAX_BLOCK)
}

/// The tournament: rounds of block pairs `(I, J)`, `I ≤ J`, holding every pair `I < J` once and
/// every diagonal `(I, I)` once, no block twice in a round. The circle method pairs `m` (even)
/// slots in `m − 1` rounds; with an odd block count the slot `m − 1` is a bye, taken by the
/// diagonal of the block that meets it; with an even one the diagonals make one more round.
/// Either way there are as many rounds as blocks.
pub(crate) fn rounds(blocks: usize) -> Vec<Vec<(usize, usize)>> {
    let m = blocks + blocks % 2;
    let mut out: Vec<Vec<(usize, usize)>> = (0..m - 1)
        .map(|r| {
            let mut round = Vec::with_capacity(m / 2);
            let mut add = |a: usize, b: usize| {
                let (a, b) = (a.min(b), a.max(b));
                round.push(if b >= blocks { (a, a) } else { (a, b) });
            };
            add(r, m - 1);
            for i in 1..m / 2 {
                add((r + i) % (m - 1), (r + m - 1 - i) % (m - 1));
            }
            round
        })
        .collect();
    if blocks.is_multiple_of(2) {
        out.push((0..blocks).map(|b| (b, b)).collect());
    }
    out
}

/// How the keys are computed, with the points packed once for the kernel.
enum Keys {
    /// GEMM form (squared L2, inner product) with bf16 products.
    Bf16(GemmPlan, crate::bf16::PackedPoints),
    /// GEMM form with f32 products.
    Gemm(GemmPlan),
    /// Direct kernels (L1, L∞).
    Direct(DirectPlan, crate::direct::PackedGroups),
}

/// Candidates of every row of the kNN graph of `points` (see
/// [`Engine::graph_candidates`](knn_core::Engine::graph_candidates)), each unordered pair's key
/// computed once; `bf16` allows the bf16 GEMM path, `precise` asks for full f32 keys. Runs on
/// the current rayon pool.
pub(crate) fn graph_candidates(
    points: MatrixRef<'_>,
    kernel: Kernel,
    width: usize,
    bf16: bool,
    precise: bool,
) -> (Candidates, SymmetricStats) {
    let (n, d) = (points.rows(), points.dim());
    let available = n - 1;
    debug_assert!(n >= 2 && (1..=available).contains(&width));
    let req = CandidateRequest {
        base: points,
        queries: points,
        kernel,
        width,
        exclude: None,
        precise,
        base_key: None,
        exact_data: false,
        exact_from: None,
    };
    let keys = if kernel.is_gemm() {
        let plan = GemmPlan::new(&req, bf16 && !precise);
        if plan.bf16 {
            let packed = crate::bf16::PackedPoints::new(points, &plan);
            Keys::Bf16(plan, packed)
        } else {
            Keys::Gemm(plan)
        }
    } else {
        let plan = DirectPlan::new(&req);
        let packed = crate::direct::PackedGroups::new(points);
        Keys::Direct(plan, packed)
    };
    let rows_per = block_rows(n, rayon::current_num_threads());
    let blocks = n.div_ceil(rows_per);
    let range = |b: usize| b * rows_per..((b + 1) * rows_per).min(n);
    let lists: Vec<Mutex<BlockLists>> = (0..blocks)
        .map(|b| Mutex::new(BlockLists::new(range(b).len(), width)))
        .collect();
    let schedule = rounds(blocks);
    let mut pair_keys = 0u64;
    for round in &schedule {
        pair_keys += round
            .par_iter()
            .map(|&(bi, bj)| {
                // The schedule gives each block to one task per round: these locks never wait.
                let mut rows = lists[bi].lock().expect("no task panicked");
                let mut cols = (bi != bj).then(|| lists[bj].lock().expect("no task panicked"));
                let mut sides = Sides {
                    rows: &mut rows,
                    cols: cols.as_deref_mut(),
                    row_first: range(bi).start as u32,
                    col_first: range(bj).start as u32,
                };
                fold_pair(points, kernel, &keys, range(bi), range(bj), &mut sides)
            })
            .sum::<u64>();
    }

    // Rows: the lists sorted, each with its floor (its width-th key less the row's bound).
    let mut ids = vec![0u32; n * width];
    let mut out_keys = vec![0f32; n * width];
    let mut floor = vec![f32::INFINITY; n];
    ids.par_chunks_mut(rows_per * width)
        .zip(out_keys.par_chunks_mut(rows_per * width))
        .zip(floor.par_chunks_mut(rows_per))
        .zip(lists.into_par_iter())
        .enumerate()
        .for_each(|(b, (((ids, row_keys), floor), lists))| {
            let mut lists = lists.into_inner().expect("no task panicked");
            for (a, floor) in floor.iter_mut().enumerate() {
                let i = b * rows_per + a;
                let (ids, row_keys) = (
                    &mut ids[a * width..(a + 1) * width],
                    &mut row_keys[a * width..(a + 1) * width],
                );
                lists.drain_sorted_into(a, row_keys, ids);
                if width == available {
                    continue;
                }
                let worst = row_keys[width - 1];
                let x = points.row(i);
                let bound = match &keys {
                    Keys::Bf16(p, _) | Keys::Gemm(p) => p.bound(kernel, d, x, worst),
                    Keys::Direct(p, _) => p.bound(kernel, x, worst),
                };
                *floor = crate::engine::round_down(worst as f64 - bound as f64);
            }
        });
    let stats = SymmetricStats {
        block_rows: rows_per,
        blocks,
        rounds: schedule.len(),
        pair_keys,
    };
    (
        Candidates {
            width,
            ids,
            keys: out_keys,
            floor,
            // The last key less the keys' bound (above).
            floor_bounds_rounding: true,
        },
        stats,
    )
}

/// One block pair with the kernel of `keys`; returns the pair keys computed.
fn fold_pair(
    points: MatrixRef<'_>,
    kernel: Kernel,
    keys: &Keys,
    ri: Range<usize>,
    rj: Range<usize>,
    sides: &mut Sides<'_>,
) -> u64 {
    match keys {
        Keys::Bf16(p, packed) => crate::bf16::fold_pair(packed, kernel, p, ri, rj, sides),
        Keys::Gemm(p) => crate::gemm::fold_pair(points, kernel, &p.norms, ri, rj, sides),
        Keys::Direct(p, packed) => crate::direct::fold_pair(points, p, packed, ri, rj, sides),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_cover_every_pair_once_and_no_block_twice_per_round() {
        for blocks in 1..=13 {
            let r = rounds(blocks);
            let mut seen = vec![vec![0u32; blocks]; blocks];
            for round in &r {
                let mut used = vec![false; blocks];
                for &(a, b) in round {
                    assert!(a <= b && b < blocks);
                    assert!(!used[a] && !used[b], "block twice in a round ({blocks})");
                    used[a] = true;
                    used[b] = true;
                    seen[a][b] += 1;
                }
            }
            for (a, row) in seen.iter().enumerate() {
                for (b, &times) in row.iter().enumerate().skip(a) {
                    assert_eq!(times, 1, "pair ({a}, {b}) of {blocks}");
                }
            }
            assert_eq!(r.len(), blocks, "one round per block");
        }
    }
}

#[cfg(test)]
mod list_tests {
    use super::*;

    #[test]
    fn pack_orders_like_total_cmp_then_id() {
        let keys = [
            f32::NEG_INFINITY,
            -3.5,
            -1e-40,
            -0.0,
            0.0,
            1e-40,
            2.0,
            f32::MAX,
            f32::INFINITY,
        ];
        for (a, &x) in keys.iter().enumerate() {
            for (b, &y) in keys.iter().enumerate() {
                for (i, j) in [(0u32, 0u32), (1, 2), (7, 3)] {
                    let expect = x.total_cmp(&y).then(i.cmp(&j));
                    assert_eq!(pack(x, i).cmp(&pack(y, j)), expect, "{a} {b}");
                }
            }
            assert_eq!(unpack(pack(x, 9)).0.to_bits(), x.to_bits());
        }
    }

    #[test]
    fn lists_keep_the_smallest_in_any_order() {
        let items: Vec<(f32, u32)> = (0..300).map(|i| (((i * 37) % 13) as f32, i)).collect();
        let mut expect = items.clone();
        expect.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for width in [1usize, 2, 15, 64, 299] {
            for rev in [false, true] {
                let mut l = BlockLists::new(1, width);
                let mut it = items.clone();
                if rev {
                    it.reverse();
                }
                for (k, i) in it {
                    l.push(0, k, i);
                }
                let (mut k, mut i) = (vec![0.0; width], vec![0; width]);
                l.drain_sorted_into(0, &mut k, &mut i);
                let got: Vec<_> = k.into_iter().zip(i).collect();
                assert_eq!(got, expect[..width].to_vec(), "width {width} rev {rev}");
            }
        }
    }
}

//! Symmetric self-join for kNN graphs: each unordered pair's key is computed once and folded
//! into both points' top-k lists (seeds 001 and 002).
//!
//! # Ownership
//! The points are cut into blocks of rows; every block owns the running lists ([`TopK`]) of its
//! rows, so all `n` lists (`n·width` entries) live in memory at once. The work is the set of
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
use knn_core::{CandidateRequest, Candidates, Kernel, MatrixRef, TopK};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Mutex;

/// Largest block of rows: a block pair's packed rows and columns stay in L2.
const MAX_BLOCK: usize = 512;
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

/// The lists of one block's rows and a copy of their thresholds, padded with `−∞` to a whole
/// number of [`BLOCK_ALIGN`] rows (padding lanes never take a key).
pub(crate) struct BlockLists {
    tops: Vec<TopK>,
    thr: Vec<f32>,
}

impl BlockLists {
    fn new(rows: usize, width: usize) -> Self {
        let mut thr = vec![f32::INFINITY; rows];
        thr.resize(rows.next_multiple_of(BLOCK_ALIGN), f32::NEG_INFINITY);
        BlockLists {
            tops: vec![TopK::new(width); rows],
            thr,
        }
    }

    #[inline]
    fn push(&mut self, a: usize, key: f32, id: u32) {
        let t = &mut self.tops[a];
        t.push(key, id);
        self.thr[a] = t.threshold();
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
    if blocks % 2 == 0 {
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
    let tops: Vec<TopK> = lists
        .into_iter()
        .flat_map(|l| l.into_inner().expect("no task panicked").tops)
        .collect();
    ids.par_chunks_mut(width)
        .zip(out_keys.par_chunks_mut(width))
        .zip(floor.par_iter_mut())
        .zip(tops.into_par_iter())
        .enumerate()
        .for_each(|(i, (((ids, row_keys), floor), mut top))| {
            debug_assert_eq!(top.len(), width);
            top.drain_sorted_into(row_keys, ids);
            if width < available {
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
            for a in 0..blocks {
                for b in a..blocks {
                    assert_eq!(seen[a][b], 1, "pair ({a}, {b}) of {blocks}");
                }
            }
            assert_eq!(r.len(), blocks, "one round per block");
        }
    }
}

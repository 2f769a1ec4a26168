//! Building the grid: a bounding box, cells sized from the point count, a counting sort of the
//! points into cell order, and sub-grids for crowded cells.
//!
//! Nothing the search proves depends on how a point was assigned to a cell: every lower bound
//! is computed from the *actual* coordinates that ended up in each slab of cells (their min and
//! max per axis), so the f32 arithmetic of the assignment may round any way it likes.

use crate::lanes::WIDTH;
use rayon::prelude::*;

/// Points per cell the grid aims for: a ring of 3^g cells then holds about a hundred points.
/// 2²⁰ uniform 3-D points, 2 cores, A/B in turns (bench/README.md): 5 against 3 took k = 16
/// from 757-805 to 719-728 ms with k = 1 unchanged (193-198 ms); 6 slowed k = 1 by 8 %, 9 both.
pub(crate) const TARGET_PER_CELL: f64 = 5.0;
/// Upper bound on the cells of one level (16 MiB of offsets), so memory stays bounded whatever
/// the point count.
pub(crate) const MAX_CELLS: usize = 1 << 22;
/// A cell holding more points than this gets its own sub-grid (unless all its points coincide
/// on the gridded axes), so clustered data does not degrade to scanning crowded cells.
pub(crate) const CROWDED: usize = 48;
/// Levels of sub-grids at most (the root is level 0).
pub(crate) const MAX_DEPTH: usize = 8;
/// Most axes a grid uses; beyond d = 3 the three widest axes are gridded and the others only
/// enter the keys.
pub(crate) const MAX_AXES: usize = 3;

/// One level of the grid: `res[0]·res[1]·res[2]` cells in row-major order (axis 0 innermost);
/// axes past `g` have one cell.
pub(crate) struct Level {
    /// Cells per axis.
    pub res: [usize; MAX_AXES],
    /// Cell of a coordinate `x` on axis `j`: `⌊(x − origin[j])·inv[j]⌋`, clamped to the grid.
    pub origin: [f32; MAX_AXES],
    pub inv: [f32; MAX_AXES],
    /// Per gridded axis and slab (all cells with one index on that axis): smallest and largest
    /// coordinate of the points in the slab (`+∞` / `−∞` when empty).
    pub slab_lo: [Vec<f32>; MAX_AXES],
    pub slab_hi: [Vec<f32>; MAX_AXES],
    /// `hi_below[j][i]`: largest coordinate of slabs `0..i` (`−∞` for none); `res + 1` long.
    pub hi_below: [Vec<f32>; MAX_AXES],
    /// `lo_from[j][i]`: smallest coordinate of slabs `i..res` (`+∞` for none); `res + 1` long.
    pub lo_from: [Vec<f32>; MAX_AXES],
    /// Bounding box of the level's points on the gridded axes.
    pub bbox_lo: [f32; MAX_AXES],
    pub bbox_hi: [f32; MAX_AXES],
    /// Cell `c` holds positions `start[c]..start[c + 1]` of the index's point arrays.
    pub start: Vec<u32>,
    /// Cells that have a sub-grid, sorted; `children[i]` is the sub-grid of `child_cells[i]`.
    /// Kept apart from the (large) levels so the lookup's binary search stays in cache.
    pub child_cells: Vec<u32>,
    /// Sub-grids of crowded cells, in the order of `child_cells`.
    pub children: Vec<Level>,
}

impl Level {
    /// Number of cells.
    pub fn cells(&self) -> usize {
        self.res.iter().product()
    }

    /// Cell index on axis `j` of coordinate `x` (queries outside the box clamp to the border).
    #[inline]
    pub fn axis_cell(&self, j: usize, x: f32) -> usize {
        // `as usize` saturates: negative and NaN give 0, +∞ gives usize::MAX.
        (((x - self.origin[j]) * self.inv[j]) as usize).min(self.res[j] - 1)
    }

    /// The sub-grid of `cell`, if it has one.
    pub fn child(&self, cell: usize) -> Option<&Level> {
        self.child_cells
            .binary_search(&(cell as u32))
            .ok()
            .map(|i| &self.children[i])
    }
}

/// The whole structure: points copied in cell order with their original ids, and the root
/// level.
pub(crate) struct GridIndex {
    /// Coordinates per point.
    pub d: usize,
    /// Gridded axes: `axes[..g]` are coordinates of the points.
    pub g: usize,
    pub axes: [usize; MAX_AXES],
    /// `n·d` coordinates in cell order.
    pub points: Vec<f32>,
    /// The same coordinates column by column (`cols[j][pos]`, each `n + WIDTH − 1` long, the
    /// tail padded with zeros so a key loop may read whole groups of lanes past a run's end);
    /// empty when `d > MAX_AXES` (such points are scanned row by row).
    pub cols: Vec<Vec<f32>>,
    /// Original id of each point in cell order.
    pub ids: Vec<u32>,
    pub root: Level,
}

/// Which coordinates the grid uses: all of them up to d = 3, else the three with the largest
/// extent (ties by index), in index order.
fn choose_axes(lo: &[f32], hi: &[f32]) -> (usize, [usize; MAX_AXES]) {
    let d = lo.len();
    let mut order: Vec<usize> = (0..d).collect();
    order.sort_by(|&a, &b| {
        let (ea, eb) = (hi[a] as f64 - lo[a] as f64, hi[b] as f64 - lo[b] as f64);
        eb.total_cmp(&ea).then(a.cmp(&b))
    });
    let g = d.min(MAX_AXES);
    let mut axes = [0usize; MAX_AXES];
    let mut chosen = order[..g].to_vec();
    chosen.sort_unstable();
    axes[..g].copy_from_slice(&chosen);
    (g, axes)
}

/// Cells per axis for `count` points in the box `lo..hi` (g axes): about `count /
/// TARGET_PER_CELL` cells of roughly equal side, axes thinner than a side getting one cell.
fn plan_resolution(lo: &[f32], hi: &[f32], count: usize) -> [usize; MAX_AXES] {
    let g = lo.len();
    let target = ((count as f64 / TARGET_PER_CELL).ceil() as usize).clamp(1, MAX_CELLS);
    let ext: Vec<f64> = (0..g).map(|j| hi[j] as f64 - lo[j] as f64).collect();
    let mut active: Vec<usize> = (0..g).filter(|&j| ext[j] > 0.0).collect();
    let mut res = [1usize; MAX_AXES];
    let side = loop {
        if active.is_empty() {
            return res;
        }
        let log_vol: f64 = active.iter().map(|&j| ext[j].ln()).sum();
        let side = ((log_vol - (target as f64).ln()) / active.len() as f64).exp();
        let before = active.len();
        active.retain(|&j| ext[j] >= side);
        if active.len() == before {
            break side;
        }
    };
    for &j in &active {
        res[j] = ((ext[j] / side).round() as usize).clamp(1, target);
    }
    // Rounding may overshoot the cap: shrink the finest axis until it holds.
    while res.iter().product::<usize>() > MAX_CELLS {
        let j = (0..MAX_AXES).max_by_key(|&j| res[j]).unwrap();
        res[j] = res[j].div_ceil(2);
    }
    res
}

/// Per-dimension bounding box of `points` (`d` per row), in parallel.
fn bounding_box(points: &[f32], d: usize) -> (Vec<f32>, Vec<f32>) {
    points
        .par_chunks(d * 4096)
        .fold(
            || (vec![f32::INFINITY; d], vec![f32::NEG_INFINITY; d]),
            |(mut lo, mut hi), chunk| {
                for p in chunk.chunks_exact(d) {
                    for j in 0..d {
                        lo[j] = lo[j].min(p[j]);
                        hi[j] = hi[j].max(p[j]);
                    }
                }
                (lo, hi)
            },
        )
        .reduce(
            || (vec![f32::INFINITY; d], vec![f32::NEG_INFINITY; d]),
            |(mut lo, mut hi), (l, h)| {
                for j in 0..d {
                    lo[j] = lo[j].min(l[j]);
                    hi[j] = hi[j].max(h[j]);
                }
                (lo, hi)
            },
        )
}

/// A raw pointer that may cross threads: the scatter writes disjoint positions through it.
#[derive(Clone, Copy)]
struct SyncPtr<T>(*mut T);
// SAFETY: only used by `counting_sort`, where every position is written by exactly one chunk.
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}

/// Stable counting sort of `src` rows (ids `src_ids`, or `id_base + row` when `None`) into
/// cell order: histogram per chunk, prefix sum over (cell, chunk), scatter per chunk, chunks in
/// parallel. Returns the cell offsets (`cells + 1`, relative to `dst`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn counting_sort(
    src: &[f32],
    src_ids: Option<&[u32]>,
    id_base: u32,
    d: usize,
    cell_of: &[u32],
    ncells: usize,
    dst: &mut [f32],
    dst_ids: &mut [u32],
) -> Vec<u32> {
    let n = cell_of.len();
    let chunks = if n >= 1 << 15 {
        rayon::current_num_threads().max(1)
    } else {
        1
    };
    let per = n.div_ceil(chunks).max(1);
    let mut hist: Vec<Vec<u32>> = cell_of
        .par_chunks(per)
        .map(|cs| {
            let mut h = vec![0u32; ncells];
            for &c in cs {
                h[c as usize] += 1;
            }
            h
        })
        .collect();
    let mut start = vec![0u32; ncells + 1];
    let mut run = 0u32;
    for c in 0..ncells {
        start[c] = run;
        for h in hist.iter_mut() {
            let cnt = h[c];
            h[c] = run;
            run += cnt;
        }
    }
    start[ncells] = run;
    debug_assert_eq!(run as usize, n);
    assert!(dst.len() == n * d && dst_ids.len() == n);
    let (pp, pi) = (SyncPtr(dst.as_mut_ptr()), SyncPtr(dst_ids.as_mut_ptr()));
    cell_of
        .par_chunks(per)
        .zip(hist.par_iter_mut())
        .enumerate()
        .for_each(|(ch, (cs, offs))| {
            let (pp, pi) = (pp, pi);
            for (r, &c) in cs.iter().enumerate() {
                let row = ch * per + r;
                let pos = offs[c as usize] as usize;
                offs[c as usize] += 1;
                let id = src_ids.map_or(id_base + row as u32, |s| s[row]);
                // SAFETY: `pos < n` and each position is produced once over all chunks (the
                // prefix sum gives every (cell, chunk) pair its own range of `cnt` slots), so
                // no two writes alias and all stay inside `dst` / `dst_ids`, whose lengths
                // were checked above. The slices outlive this parallel loop.
                unsafe {
                    let (from, to) = (src.as_ptr().add(row * d), pp.0.add(pos * d));
                    // Fixed lengths for the common dimensions: no memmove call per point.
                    match d {
                        1 => std::ptr::copy_nonoverlapping(from, to, 1),
                        2 => std::ptr::copy_nonoverlapping(from, to, 2),
                        3 => std::ptr::copy_nonoverlapping(from, to, 3),
                        _ => std::ptr::copy_nonoverlapping(from, to, d),
                    }
                    *pi.0.add(pos) = id;
                }
            }
        });
    start
}

/// Builds one level over `src` (its rows, sorted into `dst` / `dst_ids`, which sit at
/// absolute position `offset` of the index arrays), then sub-grids for its crowded cells.
#[allow(clippy::too_many_arguments)]
fn build_level(
    src: &[f32],
    src_ids: Option<&[u32]>,
    dst: &mut [f32],
    dst_ids: &mut [u32],
    offset: usize,
    d: usize,
    g: usize,
    axes: [usize; MAX_AXES],
    depth: usize,
) -> Level {
    let n = dst_ids.len();
    let (lo, hi) = bounding_box(src, d);
    let (mut bbox_lo, mut bbox_hi) = ([0f32; MAX_AXES], [0f32; MAX_AXES]);
    for j in 0..g {
        bbox_lo[j] = lo[axes[j]];
        bbox_hi[j] = hi[axes[j]];
    }
    let res = plan_resolution(&bbox_lo[..g], &bbox_hi[..g], n);
    let mut origin = [0f32; MAX_AXES];
    let mut inv = [0f32; MAX_AXES];
    for j in 0..g {
        origin[j] = bbox_lo[j];
        let ext = bbox_hi[j] as f64 - bbox_lo[j] as f64;
        inv[j] = if res[j] > 1 && ext > 0.0 {
            (res[j] as f64 / ext) as f32
        } else {
            0.0
        };
    }
    let mut level = Level {
        res,
        origin,
        inv,
        slab_lo: Default::default(),
        slab_hi: Default::default(),
        hi_below: Default::default(),
        lo_from: Default::default(),
        bbox_lo,
        bbox_hi,
        start: Vec::new(),
        child_cells: Vec::new(),
        children: Vec::new(),
    };
    let ncells = level.cells();
    let cell_of: Vec<u32> = src
        .par_chunks(d)
        .with_min_len(4096)
        .map(|p| {
            let mut c = 0usize;
            for j in (0..g).rev() {
                c = c * res[j] + level.axis_cell(j, p[axes[j]]);
            }
            c as u32
        })
        .collect();
    let mut start = counting_sort(
        src,
        src_ids,
        offset as u32,
        d,
        &cell_of,
        ncells,
        dst,
        dst_ids,
    );
    drop(cell_of);

    // Slab bounds from the sorted points, cell by cell (in parallel over runs of cells).
    let empty = || -> [(Vec<f32>, Vec<f32>); MAX_AXES] {
        std::array::from_fn(|j| {
            let r = if j < g { res[j] } else { 0 };
            (vec![f32::INFINITY; r], vec![f32::NEG_INFINITY; r])
        })
    };
    let run = (ncells / (4 * rayon::current_num_threads())).max(1024);
    let slabs = (0..ncells.div_ceil(run))
        .into_par_iter()
        .fold(empty, |mut acc, part| {
            for c in part * run..((part + 1) * run).min(ncells) {
                let (s, e) = (start[c] as usize, start[c + 1] as usize);
                if s == e {
                    continue;
                }
                let mut rest = c;
                for (j, (slo, shi)) in acc.iter_mut().enumerate().take(g) {
                    let i = rest % res[j];
                    rest /= res[j];
                    for p in dst[s * d..e * d].chunks_exact(d) {
                        let x = p[axes[j]];
                        slo[i] = slo[i].min(x);
                        shi[i] = shi[i].max(x);
                    }
                }
            }
            acc
        })
        .reduce(empty, |mut a, b| {
            for ((alo, ahi), (blo, bhi)) in a.iter_mut().zip(b) {
                alo.iter_mut().zip(blo).for_each(|(x, y)| *x = x.min(y));
                ahi.iter_mut().zip(bhi).for_each(|(x, y)| *x = x.max(y));
            }
            a
        });
    for (j, (slo, shi)) in slabs.into_iter().enumerate().take(g) {
        let r = res[j];
        let mut below = vec![f32::NEG_INFINITY; r + 1];
        for i in 0..r {
            below[i + 1] = below[i].max(shi[i]);
        }
        let mut from = vec![f32::INFINITY; r + 1];
        for i in (0..r).rev() {
            from[i] = from[i + 1].min(slo[i]);
        }
        level.slab_lo[j] = slo;
        level.slab_hi[j] = shi;
        level.hi_below[j] = below;
        level.lo_from[j] = from;
    }
    start.iter_mut().for_each(|s| *s += offset as u32);

    // Sub-grids for crowded cells, each on its own disjoint part of the arrays.
    if depth + 1 < MAX_DEPTH {
        let mut jobs = Vec::new();
        let (mut rest_p, mut rest_i) = (dst, dst_ids);
        let mut consumed = offset;
        for c in 0..ncells {
            let (s, e) = (start[c] as usize, start[c + 1] as usize);
            if e - s <= CROWDED {
                continue;
            }
            let (_, tail_p) = rest_p.split_at_mut((s - consumed) * d);
            let (_, tail_i) = rest_i.split_at_mut(s - consumed);
            let (cell_p, tail_p) = tail_p.split_at_mut((e - s) * d);
            let (cell_i, tail_i) = tail_i.split_at_mut(e - s);
            jobs.push((c as u32, s, cell_p, cell_i));
            rest_p = tail_p;
            rest_i = tail_i;
            consumed = e;
        }
        // Each crowded cell's points, reordered in place; none where the points coincide on
        // every gridded axis (no grid can separate them).
        (level.child_cells, level.children) = jobs
            .into_par_iter()
            .filter(|(_, _, ps, _)| spread(ps, d, g, axes))
            .map(|(c, s, ps, is)| {
                let (src, src_ids) = (ps.to_vec(), is.to_vec());
                let child = build_level(&src, Some(&src_ids), ps, is, s, d, g, axes, depth + 1);
                (c, child)
            })
            .unzip();
    }
    level.start = start;
    level
}

/// Whether `points` differ on some gridded axis.
fn spread(points: &[f32], d: usize, g: usize, axes: [usize; MAX_AXES]) -> bool {
    let first = &points[..d];
    points
        .chunks_exact(d)
        .any(|p| (0..g).any(|j| p[axes[j]] != first[axes[j]]))
}

impl GridIndex {
    /// Builds the index of `base` (`n` rows of `d`), on the current rayon pool.
    pub fn build(base: &[f32], d: usize) -> Self {
        let n = base.len() / d;
        let (lo, hi) = bounding_box(base, d);
        let (g, axes) = choose_axes(&lo, &hi);
        let mut points = vec![0f32; n * d];
        let mut ids = vec![0u32; n];
        let root = build_level(base, None, &mut points, &mut ids, 0, d, g, axes, 0);
        let cols = if d <= MAX_AXES {
            (0..d)
                .into_par_iter()
                .map(|j| {
                    let mut c = Vec::with_capacity(n + WIDTH - 1);
                    c.extend(points.iter().skip(j).step_by(d));
                    c.resize(n + WIDTH - 1, 0.0);
                    c
                })
                .collect()
        } else {
            Vec::new()
        };
        GridIndex {
            d,
            g,
            axes,
            points,
            cols,
            ids,
            root,
        }
    }

    /// Levels in the tree (root included) and the largest leaf population, for reports.
    pub fn shape(&self) -> (usize, usize) {
        fn walk(l: &Level, levels: &mut usize, biggest: &mut usize) {
            *levels += 1;
            for c in 0..l.cells() {
                if l.child(c).is_none() {
                    *biggest = (*biggest).max((l.start[c + 1] - l.start[c]) as usize);
                }
            }
            for ch in &l.children {
                walk(ch, levels, biggest);
            }
        }
        let (mut levels, mut biggest) = (0, 0);
        walk(&self.root, &mut levels, &mut biggest);
        (levels, biggest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_follows_count_and_shape() {
        let per = TARGET_PER_CELL as usize;
        let r = plan_resolution(&[0.0, 0.0, 0.0], &[1.0, 1.0, 1.0], per << 15);
        assert_eq!(r.iter().product::<usize>(), 32768);
        // A flat box: the thin axis gets one cell.
        let r = plan_resolution(&[0.0, 0.0, 0.0], &[1.0, 1.0, 1e-9], per * 100);
        assert_eq!(r[2], 1);
        assert_eq!(r[0], 10);
        // Empty extent everywhere: one cell.
        assert_eq!(plan_resolution(&[2.0], &[2.0], 1000), [1, 1, 1]);
        // The cap holds.
        let r = plan_resolution(&[0.0], &[1.0], usize::MAX / 2);
        assert!(r.iter().product::<usize>() <= MAX_CELLS);
    }

    #[test]
    fn sorts_every_point_once_into_its_cell() {
        let n = 5000;
        let d = 2;
        let base: Vec<f32> = (0..n * d)
            .map(|i| ((i * 7919) % 1013) as f32 / 1013.0)
            .collect();
        let ix = GridIndex::build(&base, d);
        let mut seen = ix.ids.clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..n as u32).collect::<Vec<_>>());
        for (pos, &id) in ix.ids.iter().enumerate() {
            assert_eq!(
                &ix.points[pos * d..(pos + 1) * d],
                &base[id as usize * d..(id as usize + 1) * d]
            );
        }
    }
}

//! The result of a search: `n_q × k` ids and distances.

/// `rows × k` neighbour ids and distances, row-major. Each row is ordered by (distance, id),
/// smaller id first among equal distances; for similarities ([`crate::Metric::InnerProduct`])
/// by decreasing similarity, then id. Distances are f32, or f64 for rows given in f64
/// ([`crate::in_given_precision`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Neighbors<D = f32> {
    /// Neighbours per row.
    pub k: usize,
    /// Base-point ids, `rows·k`.
    pub ids: Vec<u32>,
    /// Distances (or similarities), `rows·k`.
    pub distances: Vec<D>,
}

impl Neighbors {
    /// An empty result of `rows × k`, ids 0 and distances NaN until written.
    pub fn with_shape(rows: usize, k: usize) -> Self {
        let mut out = Self::zeroed(rows, k);
        out.mark_unwritten();
        out
    }

    /// A result of `rows × k` zeros whose pages are not yet made (large buffers come as fresh
    /// memory, advised to huge pages where the kernel allows: fills and downloads into them
    /// are bound by page faults otherwise).
    pub fn zeroed(rows: usize, k: usize) -> Self {
        Self {
            k,
            ids: crate::pages::zeroed_huge(rows * k),
            distances: crate::pages::zeroed_huge(rows * k),
        }
    }

    /// Distances NaN (unwritten), ids written too: every page is made now, on every core
    /// (for large results the fill is mostly first-touch page faults, which one thread takes
    /// far longer to serve; k = 16, 2^23 rows: 512 MiB), not later by the copies of results
    /// into them.
    pub fn mark_unwritten(&mut self) {
        use rayon::prelude::*;
        self.distances
            .par_chunks_mut(1 << 16)
            .for_each(|c| c.fill(f32::NAN));
        // (Through `black_box`: the compiler may not drop zeros written over zeroed memory.)
        self.ids
            .par_chunks_mut(1 << 16)
            .for_each(|c| std::hint::black_box(c).fill(0));
    }
}

impl<D> Neighbors<D> {
    /// Number of query rows.
    pub fn rows(&self) -> usize {
        self.ids.len().checked_div(self.k).unwrap_or(0)
    }
    /// Ids of row `i`.
    pub fn ids_of(&self, i: usize) -> &[u32] {
        &self.ids[i * self.k..(i + 1) * self.k]
    }
    /// Distances of row `i`.
    pub fn distances_of(&self, i: usize) -> &[D] {
        &self.distances[i * self.k..(i + 1) * self.k]
    }
}

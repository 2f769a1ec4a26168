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
    /// A result of `rows × k` not yet written: ids 0, distances NaN (so that a row left
    /// unwritten cannot pass for an answer). Large buffers are written in pieces on every core
    /// in memory advised to huge pages ([`crate::pages::filled_huge`]): that one pass also
    /// makes every page, which one thread's first-touch faults would otherwise make far more
    /// slowly (k = 16, 2^23 rows: 512 MiB), later, in the copies of results into them.
    pub fn with_shape(rows: usize, k: usize) -> Self {
        let len = rows.checked_mul(k).expect("result size overflows");
        Self {
            k,
            ids: crate::pages::filled_huge(len, 0),
            distances: crate::pages::filled_huge(len, f32::NAN),
        }
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

//! The running selection of one query: the `cap` smallest `(key, id)` pairs seen so far.
//!
//! Unlike [`knn_core::TopK`] (a reservoir whose threshold is only refreshed when its buffer
//! fills) this keeps the pairs sorted, so the current `cap`-th key — the number the ring search
//! compares with the distance to unvisited cells — is always exact. Widths are small in the
//! grid's use (k + 1), so insertion into a sorted array is the cheapest structure.

/// Sorted selection of the `cap` smallest `(key, id)` pairs, ties by smaller id, never holding
/// the excluded id.
pub(crate) struct Best {
    cap: usize,
    /// Sorted by (key, id), at most `cap` long.
    items: Vec<(f32, u32)>,
    /// The key to reach: the `cap`-th key once full, `+∞` before. A pair whose key is above it
    /// cannot enter, so the scan loop tests only this.
    pub(crate) limit: f32,
    /// The id this query must never return (self-joins).
    exclude: Option<u32>,
}

#[inline]
fn less(a: (f32, u32), b: (f32, u32)) -> bool {
    a.0 < b.0 || (a.0 == b.0 && a.1 < b.1)
}

impl Best {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            cap,
            items: Vec::with_capacity(cap + 1),
            limit: f32::INFINITY,
            exclude: None,
        }
    }

    /// Empties the selection for the next query.
    pub(crate) fn reset(&mut self, exclude: Option<u32>) {
        self.items.clear();
        self.limit = f32::INFINITY;
        self.exclude = exclude;
    }

    /// `true` once `cap` pairs are held: from then on `limit` is the `cap`-th key.
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.items.len() == self.cap
    }

    /// Offers a pair whose key is at most `limit` (callers test that first).
    #[inline]
    pub(crate) fn offer(&mut self, key: f32, id: u32) {
        if self.exclude == Some(id) {
            return;
        }
        if self.is_full() {
            if !less((key, id), self.items[self.cap - 1]) {
                return;
            }
            self.items.pop();
        }
        let pos = if self.cap <= 32 {
            let mut p = self.items.len();
            while p > 0 && less((key, id), self.items[p - 1]) {
                p -= 1;
            }
            p
        } else {
            self.items.partition_point(|&e| less(e, (key, id)))
        };
        self.items.insert(pos, (key, id));
        if self.is_full() {
            self.limit = self.items[self.cap - 1].0;
        }
    }

    /// The pairs, sorted by (key, id).
    pub(crate) fn items(&self) -> &[(f32, u32)] {
        &self.items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_smallest_sorted_with_id_ties_and_exclusion() {
        let items: Vec<(f32, u32)> = (0..300).map(|i| (((i * 37) % 11) as f32, i)).collect();
        for cap in [1usize, 2, 5, 31, 33, 100, 299] {
            for rev in [false, true] {
                let mut b = Best::new(cap);
                b.reset(Some(7));
                let mut it = items.clone();
                if rev {
                    it.reverse();
                }
                for (k, i) in it {
                    if k <= b.limit {
                        b.offer(k, i);
                    }
                }
                let mut expect: Vec<_> = items.iter().copied().filter(|e| e.1 != 7).collect();
                expect.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                expect.truncate(cap);
                assert_eq!(b.items(), &expect[..], "cap {cap} rev {rev}");
                assert_eq!(b.limit, expect[cap - 1].0);
            }
        }
    }
}

//! The running selection of one query: the `cap` smallest `(key, id)` pairs seen so far, and
//! what is known about every point left out.
//!
//! Two modes, by width. Up to [`SMALL_CAP`] pairs are kept sorted by insertion. Wider
//! selections are a reservoir, like [`knn_core::TopK`]: accepted pairs are appended and a
//! linear-time selection keeps the `cap` smallest when the buffer fills; the ring search also
//! calls [`Best::settle`] before each stopping test, so the threshold it compares with the
//! distance to unvisited cells is then exact. Appending is branch-light; sorted insertion would
//! shift up to `cap` pairs per accepted point.

/// Widths up to this are kept sorted by insertion; wider ones in a reservoir.
pub(crate) const SMALL_CAP: usize = 4;

/// Selection of the `cap` smallest `(key, id)` pairs, ties by smaller id, never holding the
/// excluded id; plus the two facts the floor is made of.
pub(crate) struct Best {
    cap: usize,
    /// Small widths: sorted by (key, id), at most `cap` long. Reservoir: unsorted, below
    /// `4·cap`; its `cap` smallest are the selection.
    items: Vec<(f32, u32)>,
    /// `true` once `cap` pairs were selected: from then on `limit` is the `cap`-th key of the
    /// last settled state (an upper bound of the current one; exact after [`Best::settle`]).
    full: bool,
    /// The key to reach (`+∞` until full). A pair whose key is above it cannot enter.
    pub(crate) limit: f32,
    /// Smallest computed key of the examined points left out (rejected or evicted).
    pub(crate) runner_up: f32,
    /// Smallest proven lower bound (exact key) of the regions skipped without examining them.
    pub(crate) skipped: f32,
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
            items: Vec::with_capacity(if cap <= SMALL_CAP { cap + 1 } else { 4 * cap }),
            full: false,
            limit: f32::INFINITY,
            runner_up: f32::INFINITY,
            skipped: f32::INFINITY,
            exclude: None,
        }
    }

    /// Empties the selection for the next query.
    pub(crate) fn reset(&mut self, exclude: Option<u32>) {
        self.items.clear();
        self.full = false;
        self.limit = f32::INFINITY;
        self.runner_up = f32::INFINITY;
        self.skipped = f32::INFINITY;
        self.exclude = exclude;
    }

    /// `true` once `cap` pairs were selected (see `full`).
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.full
    }

    /// Offers an examined point. Keys above `limit` only update the runner-up.
    #[inline]
    pub(crate) fn offer(&mut self, key: f32, id: u32) {
        if key > self.limit {
            self.runner_up = self.runner_up.min(key);
        } else {
            self.insert(key, id);
        }
    }

    /// Records a region left out whose points all have exact keys of at least `bound`.
    #[inline]
    pub(crate) fn skip(&mut self, bound: f32) {
        self.skipped = self.skipped.min(bound);
    }

    #[inline]
    fn insert(&mut self, key: f32, id: u32) {
        if self.exclude == Some(id) {
            return;
        }
        if self.cap > SMALL_CAP {
            self.items.push((key, id));
            if self.items.len() == 4 * self.cap {
                self.compact();
            }
            return;
        }
        if self.full {
            let last = self.items[self.cap - 1];
            if !less((key, id), last) {
                self.runner_up = self.runner_up.min(key);
                return;
            }
            self.runner_up = self.runner_up.min(last.0);
            self.items.pop();
        }
        // Shift in place (a `Vec::insert` would call memmove for a handful of elements).
        let mut p = self.items.len();
        self.items.push((key, id));
        while p > 0 && less((key, id), self.items[p - 1]) {
            self.items[p] = self.items[p - 1];
            p -= 1;
        }
        self.items[p] = (key, id);
        if self.items.len() == self.cap {
            self.full = true;
            self.limit = self.items[self.cap - 1].0;
        }
    }

    /// Reservoir: keeps the `cap` smallest, the rest feed the runner-up; the limit becomes the
    /// largest kept key.
    #[cold]
    fn compact(&mut self) {
        if self.items.len() < self.cap {
            return;
        }
        if self.items.len() > self.cap {
            self.items.select_nth_unstable_by(self.cap - 1, order);
            let dropped = self.items[self.cap..]
                .iter()
                .fold(f32::INFINITY, |m, e| m.min(e.0));
            self.runner_up = self.runner_up.min(dropped);
            self.items.truncate(self.cap);
        }
        self.full = true;
        self.limit = self.items.iter().fold(f32::NEG_INFINITY, |m, e| m.max(e.0));
    }

    /// Makes `limit` exact (the `cap`-th key of everything offered so far).
    #[inline]
    pub(crate) fn settle(&mut self) {
        if self.cap > SMALL_CAP && self.items.len() > self.cap || !self.full {
            self.compact();
        }
    }

    /// The selected pairs, sorted by (key, id).
    pub(crate) fn finish(&mut self) -> &[(f32, u32)] {
        if self.cap > SMALL_CAP {
            self.compact();
            self.items.sort_unstable_by(order);
        }
        &self.items
    }
}

fn order(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_smallest_sorted_with_id_ties_exclusion_and_runner_up() {
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
                    b.offer(k, i);
                }
                let mut expect: Vec<_> = items.iter().copied().filter(|e| e.1 != 7).collect();
                expect.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let runner = expect.get(cap).map_or(f32::INFINITY, |e| e.0);
                expect.truncate(cap);
                assert_eq!(b.finish(), &expect[..], "cap {cap} rev {rev}");
                assert_eq!(b.limit, expect[cap - 1].0);
                assert_eq!(b.runner_up, runner, "cap {cap} rev {rev}");
            }
        }
    }
}

//! The running selection of one query: the `cap` smallest `(key, id)` pairs seen so far, and
//! what is known about every point left out. Points are held by their position in the index's
//! cell-ordered arrays (so the engine can read their coordinates back from cache); the id that
//! orders ties and is excluded is looked up only when needed.
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
pub(crate) struct Best<'a> {
    cap: usize,
    /// Id of each position (the index's `ids`).
    ids: &'a [u32],
    /// `(key, position)`. Small widths: sorted by (key, id), at most `cap` long. Reservoir:
    /// unsorted, below `4·cap`; its `cap` smallest are the selection.
    items: Vec<(f32, u32)>,
    /// `true` once `cap` pairs were selected: from then on `limit` is the `cap`-th key of the
    /// last settled state (an upper bound of the current one; exact after [`Best::settle`]).
    full: bool,
    /// The key to reach (`+∞` until full). A pair whose key is above it cannot enter.
    pub(crate) limit: f32,
    /// Smallest computed key of the examined points left out (rejected or evicted).
    pub(crate) runner_up: f32,
    /// Smallest proven lower bound (exact key, computed in f64 and not yet rounded down: see
    /// `search::f32_below`) of the regions skipped without examining them.
    pub(crate) skipped: f64,
    /// The id this query must never return (self-joins).
    exclude: Option<u32>,
}

impl<'a> Best<'a> {
    /// An empty selection of `cap` over points whose ids are `ids` (by position).
    pub(crate) fn new(cap: usize, ids: &'a [u32]) -> Self {
        Self {
            cap,
            ids,
            items: Vec::with_capacity(if cap <= SMALL_CAP { cap + 1 } else { 4 * cap }),
            full: false,
            limit: f32::INFINITY,
            runner_up: f32::INFINITY,
            skipped: f64::INFINITY,
            exclude: None,
        }
    }

    /// Empties the selection for the next query.
    pub(crate) fn reset(&mut self, exclude: Option<u32>) {
        self.items.clear();
        self.full = false;
        self.limit = f32::INFINITY;
        self.runner_up = f32::INFINITY;
        self.skipped = f64::INFINITY;
        self.exclude = exclude;
    }

    /// `true` once `cap` pairs were selected (see `full`).
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.full
    }

    /// Offers the examined point at position `pos`. Keys above `limit` only update the
    /// runner-up.
    #[inline]
    pub(crate) fn offer(&mut self, key: f32, pos: u32) {
        if key > self.limit {
            self.runner_up = self.runner_up.min(key);
        } else {
            self.insert(key, pos);
        }
    }

    /// `a` before `b` in (key, id) order (the id is read only on equal keys).
    #[inline]
    fn less(&self, a: (f32, u32), b: (f32, u32)) -> bool {
        a.0 < b.0 || (a.0 == b.0 && self.ids[a.1 as usize] < self.ids[b.1 as usize])
    }

    /// Records a region left out whose points all have exact keys of at least `bound` (up to
    /// the f64 rounding of its computation).
    #[inline]
    pub(crate) fn skip(&mut self, bound: f64) {
        self.skipped = self.skipped.min(bound);
    }

    /// `true` for a selection of one pair that excludes nothing: [`Best::single`] and
    /// [`Best::set_single`] may then replace [`Best::offer`].
    #[inline]
    pub(crate) fn is_single(&self) -> bool {
        self.cap == 1 && self.exclude.is_none()
    }

    /// The selected pair of a single selection, `(+∞, u32::MAX)` while empty.
    #[inline]
    pub(crate) fn single(&self) -> (f32, u32) {
        self.items
            .first()
            .copied()
            .unwrap_or((f32::INFINITY, u32::MAX))
    }

    /// Sets a single selection to the pair `(key, pos)` (finite key) with the runner-up
    /// `runner_up`, as if every point examined had been offered.
    #[inline]
    pub(crate) fn set_single(&mut self, key: f32, pos: u32, runner_up: f32) {
        debug_assert!(self.is_single() && key.is_finite());
        self.items.clear();
        self.items.push((key, pos));
        self.full = true;
        self.limit = key;
        self.runner_up = runner_up;
    }

    /// The id of the point at position `pos`.
    #[inline]
    pub(crate) fn id(&self, pos: u32) -> u32 {
        self.ids[pos as usize]
    }

    #[inline]
    fn insert(&mut self, key: f32, pos: u32) {
        if self.exclude.is_some_and(|x| self.ids[pos as usize] == x) {
            return;
        }
        if self.cap > SMALL_CAP {
            self.items.push((key, pos));
            if self.items.len() == 4 * self.cap {
                self.compact();
            }
            return;
        }
        if self.full {
            let last = self.items[self.cap - 1];
            if !self.less((key, pos), last) {
                self.runner_up = self.runner_up.min(key);
                return;
            }
            self.runner_up = self.runner_up.min(last.0);
            self.items.pop();
        }
        // Shift in place (a `Vec::insert` would call memmove for a handful of elements).
        let mut p = self.items.len();
        self.items.push((key, pos));
        while p > 0 && self.less((key, pos), self.items[p - 1]) {
            self.items[p] = self.items[p - 1];
            p -= 1;
        }
        self.items[p] = (key, pos);
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
            let ids = self.ids;
            self.items
                .select_nth_unstable_by(self.cap - 1, |a, b| order(ids, a, b));
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

    /// The selected `(key, position)` pairs, sorted by (key, id).
    pub(crate) fn finish(&mut self) -> &[(f32, u32)] {
        if self.cap > SMALL_CAP {
            self.compact();
            let ids = self.ids;
            self.items.sort_unstable_by(|a, b| order(ids, a, b));
        }
        &self.items
    }
}

impl Best<'_> {
    /// The selection as [`Best::finish`] left it.
    pub(crate) fn selected(&self) -> &[(f32, u32)] {
        &self.items
    }
}

/// (key, id) order of two `(key, position)` pairs.
fn order(ids: &[u32], a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    a.0.total_cmp(&b.0)
        .then_with(|| ids[a.1 as usize].cmp(&ids[b.1 as usize]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_smallest_sorted_with_id_ties_exclusion_and_runner_up() {
        // Positions 0..300 hold ids in another order, so ties must be broken by id, not
        // position.
        let ids: Vec<u32> = (0..300u32).map(|p| (p * 7 + 3) % 300).collect();
        let items: Vec<(f32, u32)> = (0..300).map(|p| (((p * 37) % 11) as f32, p)).collect();
        for cap in [1usize, 2, 5, 31, 33, 100, 299] {
            for rev in [false, true] {
                let mut b = Best::new(cap, &ids);
                b.reset(Some(7));
                let mut it = items.clone();
                if rev {
                    it.reverse();
                }
                for (k, p) in it {
                    b.offer(k, p);
                }
                let mut expect: Vec<(f32, u32)> = items
                    .iter()
                    .map(|&(k, p)| (k, ids[p as usize]))
                    .filter(|e| e.1 != 7)
                    .collect();
                expect.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let runner = expect.get(cap).map_or(f32::INFINITY, |e| e.0);
                expect.truncate(cap);
                let got: Vec<(f32, u32)> = b
                    .finish()
                    .iter()
                    .map(|&(k, p)| (k, ids[p as usize]))
                    .collect();
                assert_eq!(got, expect, "cap {cap} rev {rev}");
                assert_eq!(b.limit, expect[cap - 1].0);
                assert_eq!(b.runner_up, runner, "cap {cap} rev {rev}");
            }
        }
    }
}

//! The running selection of one query: the `cap` smallest `(key, id)` pairs seen so far, and
//! what is known about every point left out. Points are held by their position in the index's
//! cell-ordered arrays (so the engine can read their coordinates back from cache), next to an
//! order key that packs the key and the id into one integer (keys are never negative, so their
//! bits order like their values): comparing two pairs is one integer comparison.
//!
//! Two modes, by width. Up to [`SMALL_CAP`] pairs are kept sorted by insertion. Wider
//! selections start as a reservoir, like [`knn_core::TopK`]: while the limit is still `+∞`
//! (most of a query's accepted points arrive then) accepted pairs are appended, a group of
//! lanes without a branch per point ([`Best::offer_lanes`]), and a linear-time selection keeps
//! the `cap` smallest when the buffer fills. Up to [`SORTED_CAP`], that first selection also
//! sorts the kept pairs and later ones are inserted in order (few enter once the limit is
//! set, and each tightens it at once): the limit is then always exact and the row comes out
//! sorted. Wider reservoirs stay reservoirs, and the ring search calls [`Best::settle`] before
//! each stopping test, so the threshold it compares with the distance to unvisited cells is
//! then exact.

use crate::lanes::WIDTH;
use crate::search::min_key;

/// Widths up to this are kept sorted by insertion; wider ones in a reservoir.
pub(crate) const SMALL_CAP: usize = 4;
/// Reservoirs up to this width sort their pairs at the first selection and from then on
/// insert in order; wider ones stay reservoirs to the end.
const SORTED_CAP: usize = 1024;

/// The order key of a pair: the key's bits above the id, so that integer order is (key, id)
/// order for keys `≥ +0.0` (every kernel's keys: sums and maxima of squares and magnitudes).
#[inline(always)]
fn pack(key: f32, id: u32) -> u64 {
    ((key.to_bits() as u64) << 32) | id as u64
}

/// The key of an order key.
#[inline(always)]
pub(crate) fn key_of(packed: u64) -> f32 {
    f32::from_bits((packed >> 32) as u32)
}

/// Selection of the `cap` smallest `(key, id)` pairs, ties by smaller id, never holding the
/// excluded id; plus the two facts the floor is made of.
pub(crate) struct Best<'a> {
    cap: usize,
    /// Id of each position (the index's `ids`).
    ids: &'a [u32],
    /// `(order key, position)`. Small widths: sorted, at most `cap` long. Reservoir: a buffer
    /// of fixed length whose first `fill` pairs (unsorted, fewer than `4·cap`; sorted and
    /// `cap` once full when `sorted`) are held; their `cap` smallest are the selection.
    items: Vec<(u64, u32)>,
    /// Reservoir: pairs held at the front of `items`.
    fill: usize,
    /// Reservoir of at most [`SORTED_CAP`] pairs: once full, its pairs are kept sorted.
    sorted: bool,
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
            // A reservoir compacts before `4·cap`; a group of lanes may write WIDTH pairs
            // past the fill before that test.
            items: if cap <= SMALL_CAP {
                Vec::with_capacity(cap + 1)
            } else {
                vec![(0, 0); 4 * cap + WIDTH]
            },
            fill: 0,
            sorted: cap <= SORTED_CAP,
            full: false,
            limit: f32::INFINITY,
            runner_up: f32::INFINITY,
            skipped: f64::INFINITY,
            exclude: None,
        }
    }

    /// Empties the selection for the next query.
    pub(crate) fn reset(&mut self, exclude: Option<u32>) {
        if self.cap <= SMALL_CAP {
            self.items.clear();
        }
        self.fill = 0;
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

    /// The selected `(key, position)` of a single selection, `(+∞, u32::MAX)` while empty.
    #[inline]
    pub(crate) fn single(&self) -> (f32, u32) {
        self.items
            .first()
            .map_or((f32::INFINITY, u32::MAX), |&(p, pos)| (key_of(p), pos))
    }

    /// Sets a single selection to the pair `(key, pos)` (finite key) with the runner-up
    /// `runner_up`, as if every point examined had been offered.
    #[inline]
    pub(crate) fn set_single(&mut self, key: f32, pos: u32, runner_up: f32) {
        debug_assert!(self.is_single() && key.is_finite());
        self.items.clear();
        self.items.push((pack(key, self.id(pos)), pos));
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
        let id = self.id(pos);
        if self.exclude == Some(id) {
            return;
        }
        let item = (pack(key, id), pos);
        if self.cap > SMALL_CAP {
            if self.full && self.sorted {
                return self.insert_sorted(item);
            }
            self.items[self.fill] = item;
            self.fill += 1;
            if self.fill == 4 * self.cap {
                self.compact();
            }
            return;
        }
        if self.full {
            let last = self.items[self.cap - 1];
            if item.0 >= last.0 {
                self.runner_up = self.runner_up.min(key);
                return;
            }
            self.runner_up = self.runner_up.min(key_of(last.0));
            self.items.pop();
        }
        // Shift in place (a `Vec::insert` would call memmove for a handful of elements).
        let mut p = self.items.len();
        self.items.push(item);
        while p > 0 && item.0 < self.items[p - 1].0 {
            self.items[p] = self.items[p - 1];
            p -= 1;
        }
        self.items[p] = item;
        if self.items.len() == self.cap {
            self.full = true;
            self.limit = key_of(self.items[self.cap - 1].0);
        }
    }

    /// Reservoir: keeps the `cap` smallest (sorted, up to [`SORTED_CAP`]), the rest feed the
    /// runner-up; the limit becomes the largest kept key.
    #[cold]
    fn compact(&mut self) {
        if self.fill < self.cap {
            return;
        }
        let held = &mut self.items[..self.fill];
        if self.fill > self.cap {
            held.select_nth_unstable_by_key(self.cap - 1, |e| e.0);
            let dropped = held[self.cap..].iter().fold(u64::MAX, |m, e| m.min(e.0));
            self.runner_up = self.runner_up.min(key_of(dropped));
            self.fill = self.cap;
        }
        self.full = true;
        if self.sorted {
            self.items[..self.cap].sort_unstable_by_key(|e| e.0);
            self.limit = key_of(self.items[self.cap - 1].0);
        } else {
            self.limit = key_of(self.items[..self.cap].iter().fold(0, |m, e| m.max(e.0)));
        }
    }

    /// Reservoir once full: the `cap` pairs are sorted and `item` (key at most the limit) is
    /// shifted in, the last pair evicted into the runner-up.
    #[inline]
    fn insert_sorted(&mut self, item: (u64, u32)) {
        let cap = self.cap;
        let last = self.items[cap - 1];
        if item.0 >= last.0 {
            self.runner_up = self.runner_up.min(key_of(item.0));
            return;
        }
        self.runner_up = self.runner_up.min(key_of(last.0));
        let mut p = cap - 1;
        while p > 0 && item.0 < self.items[p - 1].0 {
            self.items[p] = self.items[p - 1];
            p -= 1;
        }
        self.items[p] = item;
        self.limit = key_of(self.items[cap - 1].0);
    }

    /// [`Best::offer`] for the examined points at positions `first..first + n` (`n ≤ WIDTH`),
    /// of keys `keys[..n]`. In a reservoir without a branch per point: each pair is written past
    /// the held ones and kept by advancing the fill when it can enter.
    #[inline]
    pub(crate) fn offer_lanes(&mut self, keys: &[f32; WIDTH], first: u32, n: usize) {
        if self.cap <= SMALL_CAP {
            for (l, &k) in keys.iter().enumerate().take(n) {
                self.offer(k, first + l as u32);
            }
            return;
        }
        if self.full && self.sorted {
            for (l, &k) in keys.iter().enumerate().take(n) {
                self.offer(k, first + l as u32);
            }
            return;
        }
        let limit = self.limit;
        let (excluding, exclude) = (self.exclude.is_some(), self.exclude.unwrap_or(0));
        let (mut fill, mut runner_up) = (self.fill, self.runner_up);
        for (l, &key) in keys.iter().enumerate().take(n) {
            let pos = first + l as u32;
            let id = self.ids[pos as usize];
            let enter = key <= limit;
            self.items[fill] = (pack(key, id), pos);
            fill += (enter & !(excluding & (id == exclude))) as usize;
            // As `offer`: a key above the limit is left out, excluded or not.
            runner_up = min_key(runner_up, if enter { f32::INFINITY } else { key });
        }
        (self.fill, self.runner_up) = (fill, runner_up);
        if fill > 4 * self.cap - WIDTH {
            self.compact();
        }
    }

    /// Makes `limit` exact (the `cap`-th key of everything offered so far).
    #[inline]
    pub(crate) fn settle(&mut self) {
        if !self.full || !self.sorted && self.cap > SMALL_CAP && self.fill > self.cap {
            self.compact();
        }
    }

    /// Sorts the selection by (key, id); [`Best::selected`] then reads it.
    pub(crate) fn finish(&mut self) {
        if self.cap > SMALL_CAP && !(self.full && self.sorted) {
            self.compact();
            if !(self.full && self.sorted) {
                // (Fewer than `cap` pairs when fewer points could enter.)
                self.items[..self.fill].sort_unstable_by_key(|e| e.0);
            }
        }
    }

    /// The selection as [`Best::finish`] left it: `(key, position)` pairs, sorted by (key, id).
    pub(crate) fn selected(&self) -> impl ExactSizeIterator<Item = (f32, u32)> + '_ {
        let held = if self.cap > SMALL_CAP {
            self.fill
        } else {
            self.items.len()
        };
        self.items[..held].iter().map(|&(p, pos)| (key_of(p), pos))
    }
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
                b.finish();
                let got: Vec<(f32, u32)> =
                    b.selected().map(|(k, p)| (k, ids[p as usize])).collect();
                assert_eq!(got, expect, "cap {cap} rev {rev}");
                assert_eq!(b.limit, expect[cap - 1].0);
                assert_eq!(b.runner_up, runner, "cap {cap} rev {rev}");
            }
        }
    }

    #[test]
    fn packed_order_is_key_then_id() {
        let keys = [0.0f32, 1e-45, 1e-30, 0.5, 1.0, 1.5, 3e38, f32::INFINITY];
        for (i, &a) in keys.iter().enumerate() {
            for &b in &keys[i..] {
                for (x, y) in [(0u32, 1u32), (5, 5), (9, 2)] {
                    let want = a.total_cmp(&b).then(x.cmp(&y));
                    assert_eq!(pack(a, x).cmp(&pack(b, y)), want, "{a} {x} / {b} {y}");
                }
            }
        }
    }
}

//! Running selection of the `width` smallest `(key, id)` pairs.

use std::cmp::Ordering;

/// A key [`TopK`] selects by: the engines' f32 candidate keys, the exact pipeline's f64 keys.
pub trait SortKey: Copy + PartialOrd {
    /// Above every key that may enter.
    const INFINITY: Self;
    /// The total order of the keys (`f32::total_cmp`, `f64::total_cmp`).
    fn total_cmp(&self, other: &Self) -> Ordering;
}

impl SortKey for f32 {
    const INFINITY: Self = f32::INFINITY;
    #[inline]
    fn total_cmp(&self, other: &Self) -> Ordering {
        f32::total_cmp(self, other)
    }
}

impl SortKey for f64 {
    const INFINITY: Self = f64::INFINITY;
    #[inline]
    fn total_cmp(&self, other: &Self) -> Ordering {
        f64::total_cmp(self, other)
    }
}

/// Keeps the `cap` smallest `(key, id)` pairs pushed so far, compared lexicographically
/// (smaller id wins among equal keys), so the result does not depend on the order of pushes.
///
/// A reservoir: accepted pairs are appended to a buffer of `2·cap`; when it fills, a linear-time
/// selection keeps the `cap` smallest and raises the threshold to the largest kept. A push costs
/// O(1) amortised, and `threshold()` is the key to beat, so most candidates stop at one
/// comparison. The engines select f32 candidate keys with it, the exact scans (the re-rank of
/// unproven rows, the oracle, `knn verify`) f64 exact keys: collecting a whole base's keys per
/// query and selecting among them spent half of `knn verify`'s time on the collection's pages
/// and the selection. NaN keys are refused.
#[derive(Clone, Debug)]
pub struct TopK<K: SortKey = f32> {
    cap: usize,
    buf: Vec<(K, u32)>,
    /// Largest kept pair after the last compaction; `(+∞, MAX)` before the first.
    cut: (K, u32),
}

/// `a` before `b` in [`order`], the order of compactions and of the result; a NaN key is never
/// before anything (such pairs are refused). One order for both, so that the kept set does not
/// depend on the order of pushes: an IEEE comparison here (-0 == +0) refused a pair (-0, 5)
/// after a compaction had cut at (+0, 3), which [`order`] puts first.
#[inline]
fn less<K: SortKey>(a: (K, u32), b: (K, u32)) -> bool {
    // (`<` first: the common case, and `order`'s answer wherever it holds.)
    a.0 < b.0 || (a.0 == b.0 && order(&a, &b).is_lt())
}

fn order<K: SortKey>(a: &(K, u32), b: &(K, u32)) -> Ordering {
    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
}

impl<K: SortKey> TopK<K> {
    /// An empty selection keeping at most `cap` pairs.
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            buf: Vec::with_capacity(2 * cap.max(1)),
            cut: (K::INFINITY, u32::MAX),
        }
    }

    /// Keys above this cannot enter (`+∞` until the buffer first fills).
    #[inline]
    pub fn threshold(&self) -> K {
        self.cut.0
    }

    /// Number of pairs that would be returned now.
    pub fn len(&self) -> usize {
        self.buf.len().min(self.cap)
    }

    /// `true` when nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Offers a pair; kept if it is among the `cap` smallest so far.
    #[inline]
    pub fn push(&mut self, key: K, id: u32) {
        if self.cap == 0 || !less((key, id), self.cut) {
            return;
        }
        self.buf.push((key, id));
        if self.buf.len() == 2 * self.cap {
            self.compact();
        }
    }

    /// Keeps the `cap` smallest; the cut becomes the largest of them.
    fn compact(&mut self) {
        if self.buf.len() > self.cap {
            self.buf.select_nth_unstable_by(self.cap - 1, order);
            self.buf.truncate(self.cap);
        }
        if self.buf.len() == self.cap {
            self.cut = *self.buf.iter().max_by(|a, b| order(a, b)).expect("cap > 0");
        }
    }

    /// Keeps the `cap` smallest, sorted by (key, id).
    fn sort_held(&mut self) {
        self.compact();
        self.buf.sort_unstable_by(order);
    }

    /// The pairs held, sorted by (key, id).
    pub fn into_sorted(mut self) -> Vec<(K, u32)> {
        self.sort_held();
        self.buf
    }

    /// The pairs held, sorted by (key, id), written to `keys` / `ids`; the selection is emptied
    /// (its buffer kept for the next row).
    pub fn drain_sorted_into(&mut self, keys: &mut [K], ids: &mut [u32]) {
        self.sort_held();
        for (j, &(k, i)) in self.buf.iter().enumerate() {
            keys[j] = k;
            ids[j] = i;
        }
        self.buf.clear();
        self.cut = (K::INFINITY, u32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys -0 and +0 (and NaN, refused) in every order of pushes: the same kept pairs, those
    /// of a sort by [`order`].
    #[test]
    fn signed_zeros_keep_the_same_pairs_in_any_order() {
        let items = [
            (0.0f32, 3u32),
            (1.0, 9),
            (-0.0, 5),
            (f32::NAN, 1),
            (-0.0, 7),
            (0.5, 2),
        ];
        let mut sorted: Vec<_> = items.iter().copied().filter(|p| !p.0.is_nan()).collect();
        sorted.sort_by(order);
        let bits = |v: &[(f32, u32)]| v.iter().map(|p| (p.0.to_bits(), p.1)).collect::<Vec<_>>();
        for cap in 1..=5 {
            // Every rotation and its reverse.
            for r in 0..items.len() {
                for rev in [false, true] {
                    let mut it = items.to_vec();
                    it.rotate_left(r);
                    if rev {
                        it.reverse();
                    }
                    let mut t = TopK::new(cap);
                    it.iter().for_each(|&(k, i)| t.push(k, i));
                    let n = t.len();
                    let (mut k, mut i) = (vec![0.0; n], vec![0; n]);
                    t.drain_sorted_into(&mut k, &mut i);
                    let got: Vec<_> = k.into_iter().zip(i).collect();
                    assert_eq!(bits(&got), bits(&sorted[..cap]), "cap {cap}, {it:?}");
                }
            }
        }
    }

    #[test]
    fn keeps_smallest_with_id_tiebreak_in_any_order() {
        let items: Vec<(f32, u32)> = (0..200).map(|i| (((i * 37) % 11) as f32, i)).collect();
        let mut expect = items.clone();
        expect.sort_by(order);
        for cap in [1usize, 2, 15, 64, 199, 200, 300] {
            for rev in [false, true] {
                let mut t = TopK::new(cap);
                let mut it = items.clone();
                if rev {
                    it.reverse();
                }
                for (k, i) in it {
                    t.push(k, i);
                }
                let n = t.len();
                assert_eq!(n, cap.min(200));
                let (mut k, mut i) = (vec![0.0; n], vec![0; n]);
                t.drain_sorted_into(&mut k, &mut i);
                let got: Vec<_> = k.into_iter().zip(i).collect();
                assert_eq!(got, expect[..n].to_vec(), "cap {cap} rev {rev}");
            }
        }
    }

    use proptest::prelude::*;

    proptest! {
        /// The streamed selection keeps exactly a full sort's first k: keys drawn from a few
        /// values (ties decided by id), streams shorter and far longer than the buffer (many
        /// cuts), k from 1 to past the stream's length.
        #[test]
        fn smallest_is_a_full_sorts_first_k(
            keys in proptest::collection::vec(0u8..12, 0..5000),
            k in 1usize..1500,
            shuffle in any::<u64>(),
        ) {
            // Ids in a scrambled order, as a base scanned in id order would not give them.
            let n = keys.len() as u64;
            let pairs: Vec<(f64, u32)> = keys
                .iter()
                .enumerate()
                .map(|(i, &key)| {
                    let id = ((i as u64).wrapping_mul(2654435761) ^ shuffle) % n.max(1);
                    (f64::from(key) * 0.25, (id as u32) ^ ((i as u32) << 13))
                })
                .collect();
            let mut want = pairs.clone();
            want.sort_unstable_by(order);
            want.truncate(k);
            let mut best = TopK::<f64>::new(k);
            pairs.iter().for_each(|&(key, id)| best.push(key, id));
            prop_assert_eq!(best.into_sorted(), want);
        }
    }
}

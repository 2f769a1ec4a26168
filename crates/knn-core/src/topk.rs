//! Running selection of the `width` smallest `(key, id)` pairs.

/// Keeps the `cap` smallest `(key, id)` pairs pushed so far, compared lexicographically
/// (smaller id wins among equal keys), so the result does not depend on the order of pushes.
///
/// A reservoir: accepted pairs are appended to a buffer of `2·cap`; when it fills, a linear-time
/// selection keeps the `cap` smallest and raises the threshold to the largest kept. A push costs
/// O(1) amortised, and `threshold()` is the key to beat, so most candidates stop at one
/// comparison.
#[derive(Clone, Debug)]
pub struct TopK {
    cap: usize,
    buf: Vec<(f32, u32)>,
    /// Largest kept pair after the last compaction; `(+∞, MAX)` before the first.
    cut: (f32, u32),
}

/// `a` before `b` in [`order`], the order of compactions and of the result; a NaN key is never
/// before anything (such pairs are refused). One order for both, so that the kept set does not
/// depend on the order of pushes: an IEEE comparison here (-0 == +0) refused a pair (-0, 5)
/// after a compaction had cut at (+0, 3), which [`order`] puts first.
#[inline]
fn less(a: (f32, u32), b: (f32, u32)) -> bool {
    // (`<` first: the common case, and `order`'s answer wherever it holds.)
    a.0 < b.0 || (a.0 == b.0 && order(&a, &b).is_lt())
}

fn order(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
}

impl TopK {
    /// An empty selection keeping at most `cap` pairs.
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            buf: Vec::with_capacity(2 * cap.max(1)),
            cut: (f32::INFINITY, u32::MAX),
        }
    }

    /// Keys above this cannot enter (`+∞` until the buffer first fills).
    #[inline]
    pub fn threshold(&self) -> f32 {
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
    pub fn push(&mut self, key: f32, id: u32) {
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

    /// The pairs held, sorted by (key, id), written to `keys` / `ids`; the selection is emptied.
    pub fn drain_sorted_into(&mut self, keys: &mut [f32], ids: &mut [u32]) {
        self.compact();
        self.buf.sort_unstable_by(order);
        for (j, &(k, i)) in self.buf.iter().enumerate() {
            keys[j] = k;
            ids[j] = i;
        }
        self.buf.clear();
        self.cut = (f32::INFINITY, u32::MAX);
    }
}

/// Total order of (key, id) pairs: key by `total_cmp`, then the smaller id.
fn by_key_then_id(a: &(f64, u32), b: &(f64, u32)) -> std::cmp::Ordering {
    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
}

/// The `k` smallest of a stream of exact (f64 key, id) pairs in [`by_key_then_id`] order (the
/// exact pipeline's order: keys by `total_cmp`), without holding the stream; [`TopK`]'s
/// reservoir for the f64 keys of the re-rank and the oracle, where [`TopK`] serves the engines'
/// f32 candidate keys (and refuses NaN ones, where this keeps them last as a full sort would:
/// a type of both would carry that difference). Pairs gather in a buffer of [`ExactTopK::CAP_PER_K`]·k (at least
/// [`ExactTopK::CAP_MIN`]), cut back to its best `k` when full; from the first cut on, a pair
/// that does not come before the k-th kept is dropped at once. The order is total (ids are
/// distinct), so the result is exactly a full sort's first `k`. (Collecting a whole base's
/// keys per query and selecting among them spent half of `knn verify`'s time on the
/// collection's pages and the selection.)
pub(crate) struct ExactTopK {
    k: usize,
    cap: usize,
    kept: Vec<(f64, u32)>,
    /// The k-th smallest so far (after a cut): nothing after it can enter.
    worst: Option<(f64, u32)>,
}

impl ExactTopK {
    const CAP_PER_K: usize = 4;
    const CAP_MIN: usize = 1024;

    pub(crate) fn new(k: usize) -> Self {
        let cap = k.saturating_mul(Self::CAP_PER_K).max(Self::CAP_MIN);
        ExactTopK {
            k,
            cap,
            kept: Vec::with_capacity(cap),
            worst: None,
        }
    }

    #[inline]
    pub(crate) fn offer(&mut self, pair: (f64, u32)) {
        if self
            .worst
            .is_some_and(|w| by_key_then_id(&pair, &w).is_ge())
        {
            return;
        }
        self.kept.push(pair);
        if self.kept.len() >= self.cap {
            self.cut();
        }
    }

    fn cut(&mut self) {
        if self.k == 0 {
            self.kept.clear();
        } else if self.kept.len() > self.k {
            self.kept.select_nth_unstable_by(self.k - 1, by_key_then_id);
            self.kept.truncate(self.k);
            self.worst = Some(self.kept[self.k - 1]);
        }
    }

    /// The `k` smallest offered (all of them when fewer), sorted.
    pub(crate) fn sorted(mut self) -> Vec<(f64, u32)> {
        self.cut();
        self.kept.sort_unstable_by(by_key_then_id);
        self.kept
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
            want.sort_unstable_by(by_key_then_id);
            want.truncate(k);
            let mut best = ExactTopK::new(k);
            pairs.iter().for_each(|&p| best.offer(p));
            prop_assert_eq!(best.sorted(), want);
        }
    }
}

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

#[inline]
fn less(a: (f32, u32), b: (f32, u32)) -> bool {
    a.0 < b.0 || (a.0 == b.0 && a.1 < b.1)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

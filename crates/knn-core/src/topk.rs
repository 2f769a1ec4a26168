//! Running selection of the `width` smallest `(key, id)` pairs.

/// A bounded max-heap holding the `cap` smallest `(key, id)` pairs pushed so far, compared
/// lexicographically (smaller id wins among equal keys), so the result does not depend on the
/// order of the pushes. `threshold()` is the key to beat: most pushes stop at one comparison.
#[derive(Clone, Debug)]
pub struct TopK {
    cap: usize,
    heap: Vec<(f32, u32)>,
}

#[inline]
fn worse(a: (f32, u32), b: (f32, u32)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && a.1 > b.1)
}

impl TopK {
    /// An empty selection keeping at most `cap` pairs.
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            heap: Vec::with_capacity(cap),
        }
    }

    /// Empties it for reuse.
    pub fn clear(&mut self) {
        self.heap.clear();
    }

    /// Keys above this cannot enter (`+∞` while not full).
    #[inline]
    pub fn threshold(&self) -> f32 {
        if self.heap.len() < self.cap {
            f32::INFINITY
        } else {
            self.heap[0].0
        }
    }

    /// Number of pairs held.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// `true` when nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Offers a pair; kept if it is among the `cap` smallest so far.
    #[inline]
    pub fn push(&mut self, key: f32, id: u32) {
        let item = (key, id);
        if self.heap.len() < self.cap {
            self.heap.push(item);
            self.sift_up(self.heap.len() - 1);
        } else if self.cap > 0 && worse(self.heap[0], item) {
            self.heap[0] = item;
            self.sift_down(0);
        }
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let p = (i - 1) / 2;
            if worse(self.heap[i], self.heap[p]) {
                self.heap.swap(i, p);
                i = p;
            } else {
                break;
            }
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < n && worse(self.heap[l], self.heap[m]) {
                m = l;
            }
            if r < n && worse(self.heap[r], self.heap[m]) {
                m = r;
            }
            if m == i {
                break;
            }
            self.heap.swap(i, m);
            i = m;
        }
    }

    /// The pairs held, sorted by (key, id), appended to `keys` / `ids`; the selection is emptied.
    pub fn drain_sorted_into(&mut self, keys: &mut [f32], ids: &mut [u32]) {
        self.heap
            .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (j, &(k, i)) in self.heap.iter().enumerate() {
            keys[j] = k;
            ids[j] = i;
        }
        self.heap.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_smallest_with_id_tiebreak_in_any_order() {
        let items: Vec<(f32, u32)> = (0..200).map(|i| (((i * 37) % 11) as f32, i)).collect();
        let mut expect = items.clone();
        expect.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for rev in [false, true] {
            let mut t = TopK::new(15);
            let mut it = items.clone();
            if rev {
                it.reverse();
            }
            for (k, i) in it {
                t.push(k, i);
            }
            let (mut k, mut i) = (vec![0.0; 15], vec![0; 15]);
            t.drain_sorted_into(&mut k, &mut i);
            let got: Vec<_> = k.into_iter().zip(i).collect();
            assert_eq!(got, expect[..15].to_vec());
        }
    }
}

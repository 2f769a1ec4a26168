//! Where a [`run`](super::run) puts its rows: whole lists into host buffers made before the
//! call takes the device, or finished rows.

use super::Finish;

/// Where a [`run`](super::run)'s rows go.
pub(crate) enum Results<'a> {
    /// Whole candidate lists to the host, into these buffers (or new ones where they do not
    /// fit the call).
    Lists(HostLists),
    /// Finished on the device, when it holds the exact rows; as lists otherwise.
    Finished(Finish<'a>),
}

impl Results<'_> {
    /// The same destination for a retry of the call (lists' buffers are made anew then).
    pub(crate) fn reborrow(&mut self) -> Results<'_> {
        match self {
            Results::Lists(l) => Results::Lists(std::mem::take(l)),
            Results::Finished(f) => Results::Finished(f.reborrow()),
        }
    }
}

/// The host buffers of a call's `nq × W` lists: composites and, when asked for, exact keys.
/// An engine makes them before it takes the device, on its own thread: zeroed under the
/// device's lock on the rayon pool, where they queued behind the pipeline's work on other
/// rounds, they left each GPU of a base split among 4 idle 6 ms (up to 38) of every 190 ms
/// round.
#[derive(Default)]
pub(crate) struct HostLists {
    composites: Vec<u64>,
    exact: Option<Vec<f64>>,
}

impl HostLists {
    /// Buffers for `entries` list entries, with exact keys when `exact`, zeroed on the calling
    /// thread (every page made here, not by the download).
    pub(crate) fn new(entries: usize, exact: bool) -> HostLists {
        fn zeros<T: knn_core::pages::Zeroable + Default>(n: usize) -> Vec<T> {
            let mut v = Vec::with_capacity(n);
            v.resize(n, T::default());
            v
        }
        HostLists {
            composites: zeros(entries),
            exact: exact.then(|| zeros(entries)),
        }
    }

    /// Composites for `entries` entries, and exact keys when `exact`: these buffers where they
    /// are that long, new zeroed ones otherwise.
    pub(super) fn take(self, entries: usize, exact: bool) -> (Vec<u64>, Option<Vec<f64>>) {
        fn sized<T: knn_core::pages::Zeroable>(v: Option<Vec<T>>, len: usize) -> Vec<T> {
            v.filter(|v| v.len() == len)
                .unwrap_or_else(|| knn_core::pages::zeroed_huge(len))
        }
        let exact = exact.then(|| sized(self.exact, entries));
        (sized(Some(self.composites), entries), exact)
    }
}

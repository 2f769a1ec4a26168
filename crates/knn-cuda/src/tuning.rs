//! [`CudaTuning`]: the CUDA engine's tuning, typed and passed down explicitly
//! ([`CudaEngine::with_tuning`](crate::CudaEngine::with_tuning)). Every field defaults to the
//! automatic choice (`None`, as faer's `Auto`), which is what the engine measured best; a value
//! fixes it, for measurements and tests. No field changes an answer: only how it is computed
//! (and so how many rows the pipeline asks again).

/// How the collect form of symmetric graphs (`kernels/sym.cu`, TF32/f16 GEMM kernels) keeps a
/// graph's candidates: each point's threshold is the `r`-th smallest of its keys to the sample
/// of every `stride`-th point, and its buffer holds `cap` keys. A plan that keeps too few keys
/// or overflows the buffers gives the same graph: the rows it leaves unproven are asked again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollectPlan {
    /// Sample stride (at least 1 when given; the automatic plan uses 0, no sample, for graphs
    /// of at most 1025 points).
    pub stride: usize,
    /// Rank of the threshold among a point's sample keys (1 ..= 64 when given).
    pub r: usize,
    /// Buffer entries per point: a power of two, at least 32 and twice the list width (a
    /// given value is raised to that).
    pub cap: usize,
}

impl CollectPlan {
    /// This plan made valid for lists `w` wide: stride ≥ 1, r in 1 ..= 64, cap a power of two
    /// of at least 32 and 2w.
    pub(crate) fn valid_for(self, w: usize) -> CollectPlan {
        CollectPlan {
            stride: self.stride.max(1),
            r: self.r.clamp(1, 64),
            cap: self
                .cap
                .next_power_of_two()
                .max(32)
                .max((2 * w).next_power_of_two()),
        }
    }
}

/// The CUDA engine's tuning. `CudaTuning::default()` is the automatic choice of every field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaTuning {
    /// Width of the fused method's first-try candidate lists (raised to k, cut to the base).
    /// `None`: k + 4 + k/16, and for the TF32 kernels at least k + k/4, a multiple of 8 while
    /// the lists fit on chip (k = 16: 24, k = 100: 128).
    pub width: Option<usize>,
    /// Splits of the base per query tile in the fused kernels, and per tile in the symmetric
    /// fold. `None`: the fewest whose last wave of blocks is at least 95 % full.
    pub splits: Option<usize>,
    /// Whether the splits keep fewer entries than the list width (truncated splits: each keeps
    /// the fewest that hold a row's share of its nearest with probability 1 − 1e-5, and a row
    /// whose share was larger is asked again). Default `true`; `false` keeps whole lists.
    pub truncate_splits: bool,
    /// The collect form's plan. `None`: stride 16, r = ⌈λ + 4√λ + 3⌉ with λ = W/16, and cap
    /// eight standard deviations above the expected r·stride keys (see [`CollectPlan`]).
    pub collect: Option<CollectPlan>,
    /// Host threads of each copy through the staging memory outside the rayon pool (1 ..= 64).
    /// `None`: 4 (one memcpy stream reaches about a third of the bus; 8 and 12 measured no
    /// faster, see NOTES.md).
    pub copy_threads: Option<usize>,
}

impl Default for CudaTuning {
    fn default() -> Self {
        CudaTuning {
            width: None,
            splits: None,
            truncate_splits: true,
            collect: None,
            copy_threads: None,
        }
    }
}

/// Host threads per staged copy when [`CudaTuning::copy_threads`] is `None`.
pub(crate) const COPY_THREADS: usize = 4;

impl CudaTuning {
    /// The host threads of each staged copy.
    pub(crate) fn copy_threads(&self) -> usize {
        self.copy_threads.map_or(COPY_THREADS, |n| n.clamp(1, 64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_collect_plans_are_made_valid() {
        let p = CollectPlan {
            stride: 0,
            r: 100,
            cap: 100,
        };
        assert_eq!(
            p.valid_for(24),
            CollectPlan {
                stride: 1,
                r: 64,
                cap: 128
            }
        );
        let p = CollectPlan {
            stride: 3,
            r: 40,
            cap: 32,
        };
        assert_eq!(p.valid_for(100).cap, 256);
        assert_eq!(p.valid_for(5).cap, 32);
    }

    #[test]
    fn defaults_are_automatic() {
        let t = CudaTuning::default();
        assert!(t.truncate_splits);
        assert_eq!(t.copy_threads(), COPY_THREADS);
        let t = CudaTuning {
            copy_threads: Some(0),
            ..CudaTuning::default()
        };
        assert_eq!(t.copy_threads(), 1);
    }
}

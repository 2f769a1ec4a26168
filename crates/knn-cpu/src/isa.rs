//! Which vector instruction set the direct and expression kernels run with, found at run time.

/// Instruction sets the direct and expression kernels are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    Avx512,
    /// AVX2 with FMA.
    Avx2,
    /// No vector instructions the kernels use: plain f32 (CPUs without AVX2, or not x86-64).
    Scalar,
}

impl Isa {
    /// Every instruction set, best first.
    #[cfg(test)]
    pub(crate) const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2, Isa::Scalar];

    /// The best instruction set of this CPU.
    pub(crate) fn best() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// The instruction sets this CPU can run, best first.
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Isa> {
        let best = Isa::ALL.iter().position(|&i| i == Isa::best());
        Isa::ALL[best.unwrap_or(2)..].to_vec()
    }
}

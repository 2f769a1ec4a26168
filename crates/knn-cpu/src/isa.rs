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

/// What this CPU gives the engine, in words: the kernels' instruction set and the fast first
/// tries of squared L2 it takes (bf16 products on AMX tiles or AVX-512 BF16, int8 products
/// with AVX-512 VNNI at small dimensions), as `knn info` prints it.
pub fn describe() -> String {
    let isa = match Isa::best() {
        Isa::Avx512 => "avx512",
        Isa::Avx2 => "avx2+fma",
        Isa::Scalar => "scalar",
    };
    let mut paths = Vec::new();
    if crate::bf16::available() {
        paths.push(match crate::amx::available() {
            true => "bf16 products on AMX tiles",
            false => "bf16 products (AVX-512 BF16)",
        });
    }
    match crate::int8::available() {
        Some(crate::int8::Products::Vnni) => paths.push("int8 products at d <= 64 (AVX-512 VNNI)"),
        Some(crate::int8::Products::Avx2) => {
            paths.push("12-bit integer products at d <= 128 (AVX2; L1 too)")
        }
        None => {}
    }
    match paths.is_empty() {
        true => format!("SIMD {isa}"),
        false => format!("SIMD {isa}; squared L2 first tries: {}", paths.join(", ")),
    }
}

//! AMX tiles for the bf16 products of the GEMM-form keys (`bf16.rs`), on CPUs that have them
//! (Intel Xeon from Sapphire Rapids on). There `vdpbf16ps` issues on one port, so the
//! AVX-512 BF16 micro-kernel runs no faster than f32 FMAs; `tdpbf16ps` multiplies a 16 × 32
//! bf16 tile by a 32 × 16 one (8192 products) per instruction.
//!
//! Same arithmetic as `vdpbf16ps`: bf16 inputs (the same rounded values), each product exact
//! in f32, each sum rounded to nearest even, denormal inputs and outputs flushed; so the keys
//! keep the AVX-512 BF16 path's error bound (`u_in = BF16_UNIT`, f32 accumulation in any
//! order).
//!
//! Layout: the packed queries of `bf16.rs` (pair `t` of query `l` at word `t·32 + l`) are the
//! right operand as they are (16 pairs × 16 queries per tile); base rows converted to bf16
//! pairs are the left one (16 rows × 16 pairs). Pairs are padded to a multiple of 16 and base
//! blocks to 32 rows, with zeros. Four accumulator tiles hold a 32-point × 32-query block.
//!
//! Linux grants a process the tiles' register state on request (`arch_prctl`); without it, or
//! on other systems, [`available`] is false and the AVX-512 BF16 kernel runs.

/// Pairs of bf16 per tile row (64 bytes).
pub(crate) const PAIRS_PER_STEP: usize = 16;
/// Base points (and queries) per block: two tiles of 16 rows.
pub(crate) const BLOCK: usize = 32;

/// `true` when this CPU has AMX-TILE and AMX-BF16, the OS saves their state, and this process
/// was granted it (asked once).
pub(crate) fn available() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            use std::arch::x86_64::{__cpuid, __cpuid_count, _xgetbv};
            // AMX-TILE (leaf 7, EDX bit 24) and AMX-BF16 (bit 22); OSXSAVE (leaf 1, ECX bit
            // 27), without which XGETBV does not exist.
            let leaf7 = __cpuid_count(7, 0);
            let tiles = (leaf7.edx >> 24) & 1 == 1 && (leaf7.edx >> 22) & 1 == 1;
            let xsave = (__cpuid(1).ecx >> 27) & 1 == 1;
            if !tiles || !xsave {
                return false;
            }
            // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS saves the tile state.
            // SAFETY: OSXSAVE is set (checked above).
            let xcr0 = unsafe { _xgetbv(0) };
            if xcr0 & (3 << 17) != 3 << 17 {
                return false;
            }
            // ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18).
            // SAFETY: a plain system call with integer arguments.
            unsafe { libc::syscall(libc::SYS_arch_prctl, 0x1023, 18) == 0 }
        })
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    false
}

/// The tile configuration of this module, loaded on the calling thread for as long as it
/// lives (the tiles are released when it drops): accumulators `tmm0`–`tmm3` and operands
/// `tmm4`–`tmm7`, each 16 rows of 64 bytes. Not `Send`: the state belongs to the thread.
pub(crate) struct Tiles(std::marker::PhantomData<*const ()>);

impl Tiles {
    /// Loads the configuration on this thread.
    ///
    /// # Safety
    /// [`available`] must have returned true.
    #[cfg(target_arch = "x86_64")]
    pub(crate) unsafe fn load() -> Self {
        let mut cfg = [0u8; 64];
        cfg[0] = 1; // palette 1
        for t in 0..8 {
            cfg[16 + 2 * t] = 64; // bytes per row
            cfg[48 + t] = 16; // rows
        }
        // SAFETY: AMX is available and granted (the caller's promise); `cfg` is a valid
        // 64-byte palette-1 configuration.
        unsafe { std::arch::asm!("ldtilecfg [{0}]", in(reg) cfg.as_ptr(), options(nostack)) };
        Tiles(std::marker::PhantomData)
    }

    /// The 32 × 32 dot products of base rows `b` (bf16 pairs, `stride` words per row, 32
    /// rows) with one group of 32 packed queries `q` (word `t·32 + l`), over `pairs` pairs (a
    /// multiple of 16): `out[p][l]`.
    ///
    /// # Safety
    /// `b` must hold `31·stride + pairs` words, `q` `pairs·32` words; `pairs ≤ stride`.
    #[cfg(target_arch = "x86_64")]
    pub(crate) unsafe fn dots(
        &self,
        q: *const u32,
        b: *const u32,
        stride: usize,
        pairs: usize,
        out: &mut [[f32; BLOCK]; BLOCK],
    ) {
        use std::arch::asm;
        debug_assert_eq!(pairs % PAIRS_PER_STEP, 0);
        let (b_row, q_row, out_row) = (stride * 4, BLOCK * 4, BLOCK * 4);
        // SAFETY: the tiles are configured (`self`); every load reads 16 rows of 64 bytes
        // inside `b` or `q`, every store 16 rows of 64 bytes inside `out` (the caller's sizes).
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack)
            );
            for t0 in (0..pairs).step_by(PAIRS_PER_STEP) {
                let a0 = b.add(t0);
                let a1 = b.add(16 * stride + t0);
                let q0 = q.add(t0 * BLOCK);
                let q1 = q.add(t0 * BLOCK + 16);
                asm!(
                    "tileloadd tmm4, [{a0} + {bs}*1]",
                    "tileloadd tmm5, [{a1} + {bs}*1]",
                    "tileloadd tmm6, [{q0} + {qs}*1]",
                    "tileloadd tmm7, [{q1} + {qs}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a0 = in(reg) a0,
                    a1 = in(reg) a1,
                    q0 = in(reg) q0,
                    q1 = in(reg) q1,
                    bs = in(reg) b_row,
                    qs = in(reg) q_row,
                    options(nostack, readonly)
                );
            }
            let o = out.as_mut_ptr() as *mut f32;
            asm!(
                "tilestored [{o0} + {os}*1], tmm0",
                "tilestored [{o1} + {os}*1], tmm1",
                "tilestored [{o2} + {os}*1], tmm2",
                "tilestored [{o3} + {os}*1], tmm3",
                o0 = in(reg) o,
                o1 = in(reg) o.add(16),
                o2 = in(reg) o.add(16 * BLOCK),
                o3 = in(reg) o.add(16 * BLOCK + 16),
                os = in(reg) out_row,
                options(nostack)
            );
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by `load` on this thread (`Tiles` is not `Send`).
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem))
        };
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::{available, Tiles, BLOCK, PAIRS_PER_STEP};

    /// The tiles' dot products are those of the bf16 values within f32 accumulation's bound
    /// (γ_n · Σ|aᵢbᵢ|, n = the padded length) for dimensions that need padding, and exact
    /// where every partial sum is representable (small integers).
    #[test]
    fn tile_dots_are_bf16_dots() {
        if !available() {
            eprintln!("tile_dots_are_bf16_dots: SKIPPED (no AMX on this machine)");
            return;
        }
        // bf16 by truncation; the reference takes the same truncated values.
        let bf = |x: f32| (x.to_bits() >> 16) as u16;
        let val = |h: u16| f32::from_bits((h as u32) << 16) as f64;
        let mut state = 11u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) as i32 % 2001 - 1000) as f32 / 64.0
        };
        // SAFETY: `available()` said so.
        let tiles = unsafe { Tiles::load() };
        for d in [2usize, 37, 128, 200] {
            let pairs = d.div_ceil(2).next_multiple_of(PAIRS_PER_STEP);
            let word = |v: &[f32], c: usize| -> u32 {
                let h = |c: usize| if c < v.len() { bf(v[c]) } else { 0 };
                h(2 * c) as u32 | (h(2 * c + 1) as u32) << 16
            };
            let base: Vec<Vec<f32>> = (0..BLOCK)
                .map(|_| (0..d).map(|_| next()).collect())
                .collect();
            let queries: Vec<Vec<f32>> = (0..BLOCK)
                .map(|_| (0..d).map(|_| next()).collect())
                .collect();
            let b: Vec<u32> = base
                .iter()
                .flat_map(|r| (0..pairs).map(|t| word(r, t)))
                .collect();
            let mut q = vec![0u32; pairs * BLOCK];
            for (l, r) in queries.iter().enumerate() {
                for t in 0..pairs {
                    q[t * BLOCK + l] = word(r, t);
                }
            }
            let mut out = [[0.0f32; BLOCK]; BLOCK];
            // SAFETY: `b` holds 32 rows of `pairs` words, `q` `pairs · 32` words.
            unsafe { tiles.dots(q.as_ptr(), b.as_ptr(), pairs, pairs, &mut out) };
            let n = (2 * pairs) as f64 * 2f64.powi(-24);
            let gamma = n / (1.0 - n);
            for p in 0..BLOCK {
                for l in 0..BLOCK {
                    let terms = (0..d).map(|c| val(bf(base[p][c])) * val(bf(queries[l][c])));
                    let (exact, abs) = terms.fold((0.0, 0.0), |(s, a), x| (s + x, a + x.abs()));
                    let got = out[p][l] as f64;
                    assert!(
                        (got - exact).abs() <= gamma * abs,
                        "d={d} point {p} query {l}: {got} vs {exact}"
                    );
                }
            }
        }
        // Small integers: every partial sum exact, so the products are exact.
        let pairs = PAIRS_PER_STEP;
        let b: Vec<u32> = (0..BLOCK * pairs)
            .map(|i| bf((i % 7) as f32) as u32 | (bf(1.0) as u32) << 16)
            .collect();
        let q: Vec<u32> = (0..pairs * BLOCK)
            .map(|i| bf((i % 5) as f32) as u32 | (bf(2.0) as u32) << 16)
            .collect();
        let mut out = [[0.0f32; BLOCK]; BLOCK];
        // SAFETY: as above.
        unsafe { tiles.dots(q.as_ptr(), b.as_ptr(), pairs, pairs, &mut out) };
        for (p, row) in out.iter().enumerate() {
            for (l, &got) in row.iter().enumerate() {
                let want: f32 = (0..pairs)
                    .map(|t| ((p * pairs + t) % 7) as f32 * ((t * BLOCK + l) % 5) as f32 + 2.0)
                    .sum();
                assert_eq!(got, want, "point {p} query {l}");
            }
        }
    }
}

//! Seeded synthetic data: uniform, gaussian and clustered points, reproducible on every
//! platform (a fixed SplitMix64 generator, no external RNG whose stream could change).

use std::str::FromStr;

/// A small, fast, seedable generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(f64::MIN_POSITIVE);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// The shape of generated data.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Distribution {
    /// Uniform in `[lo, hi)` in every coordinate.
    Uniform { lo: f32, hi: f32 },
    /// Standard normal coordinates.
    Gaussian,
    /// `clusters` gaussian blobs of standard deviation `spread` around centres uniform in
    /// `[0, 1)`.
    Clustered { clusters: usize, spread: f32 },
}

impl FromStr for Distribution {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uniform" => Ok(Distribution::Uniform { lo: 0.0, hi: 1.0 }),
            "gaussian" | "normal" => Ok(Distribution::Gaussian),
            "clustered" => Ok(Distribution::Clustered {
                clusters: 100,
                spread: 0.01,
            }),
            _ => Err(format!(
                "unknown distribution '{s}' (uniform, gaussian, clustered)"
            )),
        }
    }
}

/// `rows × dim` values of `dist`, row-major, from `seed`.
pub fn generate(dist: Distribution, rows: usize, dim: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(rows * dim);
    match dist {
        Distribution::Uniform { lo, hi } => {
            let (lo, w) = (lo as f64, (hi - lo) as f64);
            out.extend((0..rows * dim).map(|_| (lo + w * rng.uniform()) as f32));
        }
        Distribution::Gaussian => out.extend((0..rows * dim).map(|_| rng.normal() as f32)),
        Distribution::Clustered { clusters, spread } => {
            let clusters = clusters.max(1);
            let mut crng = Rng::new(seed.wrapping_add(0xC1));
            let centres: Vec<f64> = (0..clusters * dim).map(|_| crng.uniform()).collect();
            for _ in 0..rows {
                let c = rng.below(clusters as u64) as usize;
                for j in 0..dim {
                    out.push((centres[c * dim + j] + spread as f64 * rng.normal()) as f32);
                }
            }
        }
    }
    out
}

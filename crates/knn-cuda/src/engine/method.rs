//! [`Method`]: how a CUDA engine computes its candidates (the fused kernels, or a seed-000
//! reference kernel).

use knn_core::{KnnError, Result};
use std::fmt;
use std::str::FromStr;

/// How the candidates are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// Fused tiles with on-chip top-k (the fast method).
    Fused,
    /// Seed 000: global-memory tiled distance kernel + modified insertion sort.
    Global,
    /// Seed 000: base points read through a texture object + modified insertion sort.
    Texture,
    /// Seed 000: cuBLAS GEMM form + modified insertion sort (L1/L∞ use the global kernel).
    Cublas,
}

impl Method {
    /// Every method, fast one first.
    pub const ALL: [Method; 4] = [
        Method::Fused,
        Method::Global,
        Method::Texture,
        Method::Cublas,
    ];

    /// Name as accepted by [`FromStr`].
    pub fn name(self) -> &'static str {
        match self {
            Method::Fused => "fused",
            Method::Global => "global",
            Method::Texture => "texture",
            Method::Cublas => "cublas",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Method {
    type Err = KnnError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "fused" => Ok(Method::Fused),
            "global" => Ok(Method::Global),
            "texture" => Ok(Method::Texture),
            "cublas" => Ok(Method::Cublas),
            _ => Err(KnnError::Option(format!(
                "unknown CUDA method '{s}' (expected one of: fused, global, texture, cublas)"
            ))),
        }
    }
}

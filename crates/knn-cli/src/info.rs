//! `knn info`.

use anyhow::Result;
use std::process::ExitCode;

fn simd_level() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return "avx2+fma";
        }
        "sse2"
    }
    #[cfg(not(target_arch = "x86_64"))]
    "baseline"
}

pub fn info() -> Result<ExitCode> {
    println!("knn {}", env!("CARGO_PKG_VERSION"));
    println!(
        "cpu: {} threads, SIMD {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        simd_level()
    );
    let gpus = knn::gpu_devices();
    if gpus.is_empty() {
        println!("cuda: no usable device ({})", knn::gpu_status());
    }
    for g in gpus {
        println!("cuda:{}: {}", g.0, g.1);
    }
    Ok(ExitCode::SUCCESS)
}

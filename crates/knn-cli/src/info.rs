//! `knn info`.

use anyhow::Result;
use std::process::ExitCode;

pub fn info() -> Result<ExitCode> {
    println!("knn {}", env!("CARGO_PKG_VERSION"));
    println!(
        "cpu: {} threads, {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        knn::cpu_paths()
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

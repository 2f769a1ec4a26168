//! Times writing and reading a large table in every format:
//! `cargo run --release -p knn-io --example throughput [rows] [cols]` (default 1000000 x 100).

use std::time::Instant;

use knn_io::{read_f32, write_f32, Format, Table};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let rows = args.next().transpose()?.unwrap_or(1_000_000);
    let cols = args.next().transpose()?.unwrap_or(100);
    let t = Table {
        data: (0..rows * cols)
            .map(|k| (k % 9973) as f32 * 0.125 - 300.0)
            .collect(),
        rows,
        cols,
    };
    let dir = std::env::temp_dir().join(format!("knn-io-throughput-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    println!("{rows} x {cols} f32");
    for format in [Format::Fvecs, Format::Npy, Format::Csv] {
        let path = dir.join(format!("t.{format}"));
        let start = Instant::now();
        write_f32(&path, None, &t)?;
        let write_s = start.elapsed().as_secs_f64();
        let bytes = std::fs::metadata(&path)?.len() as f64;
        // Best of three reads: the first may pay for page-cache effects of the write.
        let mut read_s = f64::INFINITY;
        let mut back = Table {
            data: Vec::new(),
            rows: 0,
            cols: 0,
        };
        for _ in 0..3 {
            let start = Instant::now();
            back = read_f32(&path, None)?;
            read_s = read_s.min(start.elapsed().as_secs_f64());
        }
        assert_eq!(back, t, "{format} round trip");
        println!(
            "{format:>6}: {:8.1} MB  write {write_s:6.3} s ({:6.0} MB/s)  read {read_s:6.3} s ({:6.0} MB/s)",
            bytes / 1e6,
            bytes / 1e6 / write_s,
            bytes / 1e6 / read_s
        );
        std::fs::remove_file(&path)?;
    }
    std::fs::remove_dir(&dir)?;
    Ok(())
}

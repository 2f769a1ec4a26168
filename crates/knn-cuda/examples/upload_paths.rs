//! How long a host → device upload of pageable rows takes by path, as a search's queries see
//! it (host time from the call until the bytes are on the device; the host idle ~0.4 ms
//! between uploads, as while a search's kernels run): the driver's own pageable copy, and
//! page-locked staging filled by a persistent pool of T threads (whole, or in pieces each sent
//! on while the next is filled). `upload_paths [KIB...]` (default 256 1024 2048 4096); medians
//! and 90th percentiles of 300.
use cudarc::driver::{result as driver, CudaContext, DevicePtr};
use rayon::prelude::*;
use std::time::{Duration, Instant};

const REPEAT: usize = 300;

fn stats(mut t: Vec<f64>) -> (f64, f64) {
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2], t[t.len() * 9 / 10])
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().expect("sizes in KiB"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![256, 1024, 2048, 4096]
    } else {
        sizes
    };
    let ctx = CudaContext::new(0).expect("a GPU");
    let stream = ctx.default_stream();
    let pools: Vec<(usize, rayon::ThreadPool)> = [1usize, 2, 4, 8]
        .into_iter()
        .map(|t| {
            let p = rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .expect("a pool");
            (t, p)
        })
        .collect();
    println!("| KiB | path | median µs | p90 µs |");
    println!("|---|---|---|---|");
    for kib in sizes {
        let bytes = kib << 10;
        let src: Vec<u8> = (0..bytes).map(|i| (i * 31 % 251) as u8).collect();
        let dst = unsafe { stream.alloc::<u8>(bytes) }.expect("device memory");
        let (dptr, _sync) = dst.device_ptr(&stream);
        let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }.expect("pinned");
        let pin = pinned.as_mut_ptr().expect("pinned address") as usize;
        let cs = stream.cu_stream();
        let run = |name: String, f: &mut dyn FnMut()| {
            let mut t = Vec::with_capacity(REPEAT);
            for i in 0..REPEAT + 20 {
                std::thread::sleep(Duration::from_micros(400));
                let s = Instant::now();
                f();
                stream.synchronize().expect("sync");
                if i >= 20 {
                    t.push(s.elapsed().as_secs_f64() * 1e6);
                }
            }
            let (m, p) = stats(t);
            println!("| {kib} | {name} | {m:.1} | {p:.1} |");
        };
        run("pageable (driver)".into(), &mut || unsafe {
            driver::memcpy_htod_async(dptr, &src[..], cs).expect("copy");
        });
        for (threads, pool) in &pools {
            for pieces in [1usize, 2, 4] {
                let piece = bytes.div_ceil(pieces).next_multiple_of(4096);
                run(
                    format!("staged, {threads} threads, {pieces} pieces"),
                    &mut || {
                        for (i, s) in src.chunks(piece).enumerate() {
                            let at = i * piece;
                            // SAFETY: the pinned range lies in the allocation; the previous
                            // call's copies have completed (synchronised).
                            let d = unsafe {
                                std::slice::from_raw_parts_mut((pin + at) as *mut u8, s.len())
                            };
                            let part = s.len().div_ceil(*threads).next_multiple_of(4096);
                            pool.install(|| {
                                d.par_chunks_mut(part)
                                    .zip(s.par_chunks(part))
                                    .for_each(|(d, s)| d.copy_from_slice(s))
                            });
                            unsafe { driver::memcpy_htod_async(dptr + at as u64, &*d, cs) }
                                .expect("copy");
                        }
                    },
                );
            }
        }
    }
}

//! How long an output's host buffers take to make, page-lock and unlock, by strategy (the
//! figures of `knn_core::pages::zeroed_huge`):
//! `output_pages MB_PER_BUFFER [REPEAT]` (two buffers, as ids and distances; medians).
use cudarc::driver::{sys, CudaContext};
use rayon::prelude::*;
use std::time::Instant;

extern "C" {
    fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
    fn mallopt(param: i32, value: i32) -> i32;
}
const MADV_HUGEPAGE: i32 = 14;
const MADV_POPULATE_WRITE: i32 = 23;

fn advise(v: &mut [u8], huge_from: usize) {
    if v.len() < huge_from {
        return;
    }
    const H: usize = 2 << 20;
    let s = (v.as_ptr() as usize).next_multiple_of(H);
    let e = (v.as_ptr() as usize + v.len()) & !(H - 1);
    if e > s {
        unsafe { madvise(s as *mut _, e - s, MADV_HUGEPAGE) };
    }
}

fn populate(v: &mut [u8], piece: usize) {
    v.par_chunks_mut(piece).for_each(|c| {
        let s = (c.as_ptr() as usize).next_multiple_of(4096);
        let e = (c.as_ptr() as usize + c.len()) & !4095;
        if e > s {
            unsafe { madvise(s as *mut _, e - s, MADV_POPULATE_WRITE) };
        }
    });
}

fn calloc(n: usize) -> Vec<u8> {
    vec![0u8; n]
}

fn uninit_zeroed_par(n: usize, piece: usize, huge_from: usize) -> Vec<u8> {
    let layout = std::alloc::Layout::array::<u8>(n).unwrap();
    let mut v = unsafe {
        let p = std::alloc::alloc(layout);
        Vec::from_raw_parts(p, n, n)
    };
    advise(&mut v, huge_from);
    v.par_chunks_mut(piece)
        .for_each(|c| unsafe { std::ptr::write_bytes(c.as_mut_ptr(), 0, c.len()) });
    v
}

fn med(mut x: Vec<f64>) -> f64 {
    x.sort_by(|a, b| a.partial_cmp(b).unwrap());
    x[x.len() / 2]
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let mb: f64 = a.get(1).map_or(4.0, |s| s.parse().unwrap());
    let reps: usize = a.get(2).map_or(15, |s| s.parse().unwrap());
    let n = (mb * 1e6) as usize;
    unsafe {
        mallopt(-3, 16 << 20); // M_MMAP_THRESHOLD, as the knn command sets it
        mallopt(-1, 32 << 20); // M_TRIM_THRESHOLD
    }
    let ctx = CudaContext::new(0).unwrap();
    ctx.bind_to_thread().unwrap();
    rayon::broadcast(|_| ());
    type Make = Box<dyn Fn() -> Vec<u8>>;
    let strategies: Vec<(&str, Make)> = vec![
        (
            "knn_core::pages::filled_huge (the live output)",
            Box::new(move || knn_core::pages::filled_huge(n, 0u8)),
        ),
        (
            "calloc + populate 4M pieces (before)",
            Box::new(move || {
                let mut v = calloc(n);
                advise(&mut v, 4 << 20);
                populate(&mut v, 4 << 20);
                v
            }),
        ),
        (
            "calloc + populate 256K pieces",
            Box::new(move || {
                let mut v = calloc(n);
                advise(&mut v, 4 << 20);
                populate(&mut v, 256 << 10);
                v
            }),
        ),
        (
            "calloc + huge from 1M + populate 256K",
            Box::new(move || {
                let mut v = calloc(n);
                advise(&mut v, 1 << 20);
                populate(&mut v, 256 << 10);
                v
            }),
        ),
        (
            "uninit + parallel zeros 256K",
            Box::new(move || uninit_zeroed_par(n, 256 << 10, 4 << 20)),
        ),
        (
            "uninit + huge from 1M + parallel zeros 256K",
            Box::new(move || uninit_zeroed_par(n, 256 << 10, 1 << 20)),
        ),
    ];
    println!("two buffers of {mb} MB, {reps} runs, medians (ms): make | lock | unlock | make+lock+unlock");
    for (name, make) in &strategies {
        let (mut tm, mut tl, mut tu, mut tt) = (vec![], vec![], vec![], vec![]);
        for _ in 0..reps {
            let t0 = Instant::now();
            let mut x = make();
            let mut y = make();
            let t1 = Instant::now();
            unsafe {
                assert_eq!(
                    sys::cuMemHostRegister_v2(x.as_mut_ptr().cast(), n, 0),
                    sys::CUresult::CUDA_SUCCESS
                );
                assert_eq!(
                    sys::cuMemHostRegister_v2(y.as_mut_ptr().cast(), n, 0),
                    sys::CUresult::CUDA_SUCCESS
                );
            }
            let t2 = Instant::now();
            unsafe {
                sys::cuMemHostUnregister(x.as_mut_ptr().cast());
                sys::cuMemHostUnregister(y.as_mut_ptr().cast());
            }
            let t3 = Instant::now();
            assert!(x[n / 2] == 0 && y[n - 1] == 0);
            drop((x, y));
            // something else on the heap between runs, as a search's other buffers
            let z = vec![1u8; 3 << 20];
            std::hint::black_box(&z);
            let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
            tm.push(ms(t0, t1));
            tl.push(ms(t1, t2));
            tu.push(ms(t2, t3));
            tt.push(ms(t0, t3));
        }
        println!(
            "{name:48} {:6.3} | {:6.3} | {:6.3} | {:6.3}",
            med(tm),
            med(tl),
            med(tu),
            med(tt)
        );
    }
}

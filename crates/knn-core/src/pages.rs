//! Large host buffers backed by 2 MiB pages: the first write to a fresh 4 KiB page costs a
//! page fault and a zeroed page, which bounds filling a large result (a device download into
//! fresh memory ran at ~4 GB/s on the GPU machine, ~2–3 GB/s here) far below the memory's
//! speed; with transparent huge pages one fault serves 512 times the bytes (~8 GB/s here).

/// Buffers smaller than this keep the default pages (the advice would not pay for its call).
const HUGE_FROM: usize = 4 << 20;

/// Buffers from this size on are zeroed in pieces on the rayon pool, smaller ones by `calloc`.
const ZEROED_IN_PIECES_FROM: usize = 1 << 20;

/// `len` zeros in memory the kernel is asked to back with transparent huge pages (Linux,
/// `madvise(MADV_HUGEPAGE)` on the whole 2 MiB pages inside it) before anything touches it.
/// The advice is only a hint: where the kernel declines it, the buffer is an ordinary one.
///
/// From 1 MiB the zeros are written as [`filled_huge`] writes, which also makes every page:
/// `calloc` zeroes a block it reuses from the heap with one thread's memset, and its fresh pages
/// are then made one fault at a time by whoever writes first. Two 4 MB buffers, a search's
/// output, on the GPU machine: 0.20 ms against 0.57 ms with `calloc` and `MADV_POPULATE_WRITE` (two
/// 41 MB buffers: 2.7 against 3.0 ms; two 0.3 MB ones: 0.08 against 0.05 ms, hence the floor).
pub fn zeroed_huge<T: Zeroable>(len: usize) -> Vec<T> {
    let bytes = len
        .checked_mul(std::mem::size_of::<T>())
        .expect("buffer size overflows");
    if bytes < ZEROED_IN_PIECES_FROM {
        return zeroed_vec(len);
    }
    // SAFETY: `T: Zeroable` is a plain number, for which all-zero bits are a valid value.
    filled_huge(len, unsafe { std::mem::zeroed::<T>() })
}

/// `len` copies of `value`, in memory advised to huge pages as for [`zeroed_huge`]; from 1 MiB
/// written in pieces on the rayon pool, which makes every page in the same pass (one write of
/// the buffer, not zeros first and the value after).
pub fn filled_huge<T: Copy + Send + Sync>(len: usize, value: T) -> Vec<T> {
    let bytes = len
        .checked_mul(std::mem::size_of::<T>())
        .expect("buffer size overflows");
    if bytes < ZEROED_IN_PIECES_FROM {
        return vec![value; len];
    }
    use rayon::prelude::*;
    const PIECE: usize = 256 << 10;
    let per = (PIECE / std::mem::size_of::<T>()).max(1);
    let mut v: Vec<T> = Vec::with_capacity(len);
    advise_range(v.as_mut_ptr() as usize, bytes);
    v.spare_capacity_mut()
        .par_chunks_mut(per)
        .for_each(|c| c.fill(std::mem::MaybeUninit::new(value)));
    // SAFETY: every element of the capacity's first `len` was written just above.
    unsafe { v.set_len(len) };
    v
}

/// Asks the C allocator (glibc) to serve every allocation of 16 MiB or more with fresh pages
/// of its own and to unmap them when freed (a fixed `M_MMAP_THRESHOLD`). By default glibc
/// raises that threshold to the size of the largest block freed so far (up to 32 MiB), and
/// the next large result then comes from the heap, where `calloc` zeroes it with a
/// single-threaded memset: a 64 MB graph output took 35–50 ms that way on the GPU machine,
/// every other run, against 8–14 ms as fresh pages made on every core. A fixed threshold also
/// stops glibc's matching rise of `M_TRIM_THRESHOLD`, whose default (128 KiB) then hands the
/// heap's free top back to the system at every turn: it is set to twice the threshold, as
/// glibc's own rule would (CPU Hellinger graph, 20 000 × 64: 197–199 ms without, 180–183 ms
/// with, 181–185 ms before either). Process-wide: for programs (the `knn` command calls it
/// first thing), not libraries. No effect elsewhere.
pub fn fresh_pages_for_large_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's tuning; any value is valid for these options.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 16 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 32 << 20);
    }
}

/// Plain numbers, for which all-zero bits are a valid value (zero).
pub trait Zeroable: Copy + Send + Sync + sealed::Sealed {}
mod sealed {
    pub trait Sealed {}
}
macro_rules! zeroable {
    ($($t:ty),*) => {$(impl sealed::Sealed for $t {} impl Zeroable for $t {})*};
}
zeroable!(u8, u32, u64, f32, f64);

/// `len` zeros through `alloc_zeroed` (calloc: large sizes come as fresh pages, untouched).
fn zeroed_vec<T: Zeroable>(len: usize) -> Vec<T> {
    let bytes = len
        .checked_mul(std::mem::size_of::<T>())
        .expect("buffer size overflows");
    if bytes == 0 {
        return Vec::new();
    }
    let layout = std::alloc::Layout::array::<T>(len).expect("buffer size overflows");
    // SAFETY: the layout has non-zero size; the memory is zeroed, and `T: Zeroable` is a plain
    // number, for which all-zero bits are a valid value; the Vec takes
    // ownership with the same layout (capacity `len` of `T`) the global allocator gave.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut T;
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Vec::from_raw_parts(p, len, len)
    }
}

/// Hints that the whole 2 MiB pages of the `bytes` bytes at address `at` be huge pages (no effect
/// off Linux or for fewer than [`HUGE_FROM`] bytes).
/// (Without the hint the output took 46–49 ms against 43–45 ms: knn-cuda's NOTES.md, stop 17.)
#[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
fn advise_range(at: usize, bytes: usize) {
    if bytes < HUGE_FROM {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = at.next_multiple_of(HUGE);
        let end = (at + bytes) & !(HUGE - 1);
        if end > start {
            // SAFETY: the range lies inside the caller's allocation; MADV_HUGEPAGE changes how its
            // pages are backed, never their contents. A refusal (THP off) is harmless.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_huge_is_zeros_of_the_length_asked() {
        for len in [0usize, 1, 1000, (5 << 20) / 4 + 3] {
            let v: Vec<u32> = zeroed_huge(len);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&x| x == 0));
            let f: Vec<f32> = zeroed_huge(len);
            assert!(f.iter().all(|&x| x.to_bits() == 0));
        }
    }

    #[test]
    fn filled_huge_holds_the_value_at_every_length() {
        for len in [0usize, 1, 1000, (1 << 20) / 4 - 1, (5 << 20) / 4 + 3] {
            let v: Vec<f32> = filled_huge(len, f32::NAN);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|x| x.is_nan()));
            let ids: Vec<u32> = filled_huge(len, 7);
            assert!(ids.iter().all(|&x| x == 7));
        }
    }

    /// Memory the allocator hands out again after it held other values is zeros too, at the
    /// sizes on either side of the pieces' floor and the piece size.
    #[test]
    fn zeroed_huge_is_zeros_in_reused_memory() {
        let sizes = [
            ZEROED_IN_PIECES_FROM - 1,
            ZEROED_IN_PIECES_FROM,
            ZEROED_IN_PIECES_FROM + (256 << 10) + 7,
            HUGE_FROM + 4093,
        ];
        for bytes in sizes {
            let mut dirty: Vec<u8> = zeroed_huge(bytes);
            dirty.iter_mut().for_each(|x| *x = 0xa5);
            drop(dirty);
            let v: Vec<u8> = zeroed_huge(bytes);
            assert_eq!(v.len(), bytes);
            assert!(v.iter().all(|&x| x == 0), "{bytes} bytes");
        }
    }
}

//! Large host buffers backed by 2 MiB pages: the first write to a fresh 4 KiB page costs a
//! page fault and a zeroed page, which bounds filling a large result (a device download into
//! fresh memory ran at ~4 GB/s on the GPU machine, ~2–3 GB/s here) far below the memory's
//! speed; with transparent huge pages one fault serves 512 times the bytes (~8 GB/s here).

/// Buffers smaller than this keep the default pages (the advice would not pay for its call).
const HUGE_FROM: usize = 4 << 20;

/// `len` zeros in memory the kernel is asked to back with transparent huge pages (Linux,
/// `madvise(MADV_HUGEPAGE)` on the whole 2 MiB pages inside it) before anything touches it.
/// The advice is only a hint: where the kernel declines it, the buffer is an ordinary one.
pub fn zeroed_huge<T: Zeroable>(len: usize) -> Vec<T> {
    let v = zeroed_vec::<T>(len);
    advise_huge(&v);
    v
}

/// Plain numbers, for which all-zero bits are a valid value (zero).
pub trait Zeroable: Copy + sealed::Sealed {}
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

/// Hints that `v`'s whole 2 MiB pages be huge pages (no effect off Linux or for small `v`;
/// `KNN_HUGE_PAGES=0` turns it off, for measurements).
fn advise_huge<T>(v: &[T]) {
    let bytes = std::mem::size_of_val(v);
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if bytes < HUGE_FROM
        || *OFF.get_or_init(|| std::env::var_os("KNN_HUGE_PAGES").is_some_and(|v| v == "0"))
    {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (v.as_ptr() as usize).next_multiple_of(HUGE);
        let end = (v.as_ptr() as usize + bytes) & !(HUGE - 1);
        if end > start {
            // SAFETY: the range lies inside `v`'s allocation; MADV_HUGEPAGE changes how its
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
}

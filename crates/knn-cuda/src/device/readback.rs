//! Device ranges read back to the host with one wait for all of them.
//!
//! A pageable download is a wait of its own: the driver waits for the stream, then bounces the
//! bytes through its buffer. A small search's two result rows and its summary, read that way
//! one after the other, kept the host ~180 µs after the last kernel of a 0.8 ms call (H200).
//! Queued behind the stream's work into page-locked memory the device keeps, they land with
//! one wait and are copied out on the host.

use super::{dev_err, Gpu};
use cudarc::driver::{DeviceRepr, PinnedHostSlice};
use knn_core::Result;
use std::marker::PhantomData;

/// Page-locked bytes a device keeps for its [`Readback`]s: the rows of an output below the
/// size whose pages are locked in place (2¹⁸ entries of an id and a distance, 2 MiB), and a
/// few words besides.
pub(super) const READBACK_BYTES: usize = (2 << 20) + 4096;

/// Reads queued behind a device's work into its kept page-locked memory
/// ([`Readback::queue`]), landed by one wait ([`Readback::wait`]) and then copied into their
/// destinations ([`Readback::take`]). One at a time per device (the memory is taken from the
/// device while the readback lives).
pub(crate) struct Readback<'g> {
    gpu: &'g Gpu,
    /// The memory (taken from the device, given back when dropped) and its address.
    mem: Option<(PinnedHostSlice<u8>, usize)>,
    /// Bytes given to queued reads.
    used: usize,
    /// Whether every queued read has landed.
    landed: bool,
}

/// A read queued in a [`Readback`]: `len` values of `T` at byte `at` of its memory.
#[must_use = "a queued read is only useful once taken"]
pub(crate) struct Queued<T> {
    at: usize,
    len: usize,
    _values: PhantomData<T>,
}

impl Gpu {
    /// A readback into this device's kept page-locked memory (made by the first read queued).
    pub fn readback(&self) -> Readback<'_> {
        Readback {
            gpu: self,
            mem: self.readback.take(),
            used: 0,
            landed: true,
        }
    }
}

impl Readback<'_> {
    /// Queues a copy of `len` values of `T` from device address `src`, behind the work queued
    /// so far on the device's stream; `None` when they do not fit in what is left of the
    /// memory (the caller then reads them another way).
    ///
    /// # Safety
    /// `src` must hold `len` values of `T` in memory of this device's context, alive until
    /// the stream has run the copy (freed in stream order, or after [`Readback::wait`]).
    pub unsafe fn queue<T: DeviceRepr + Copy>(
        &mut self,
        src: u64,
        len: usize,
    ) -> Result<Option<Queued<T>>> {
        let at = self
            .used
            .next_multiple_of(std::mem::align_of::<T>().max(16));
        let bytes = len * std::mem::size_of::<T>();
        if at + bytes > READBACK_BYTES {
            return Ok(None);
        }
        if bytes > 0 {
            let base = self.memory()?;
            // SAFETY: bytes `at..at + bytes` lie in the memory (checked above), which no
            // other read uses until this readback is dropped (the device's memory is taken
            // or made by it); the caller vouches for `src`.
            unsafe {
                let dst = std::slice::from_raw_parts_mut((base + at) as *mut u8, bytes);
                cudarc::driver::result::memcpy_dtoh_async(dst, src, self.gpu.stream.cu_stream())
            }
            .map_err(dev_err("copying from the device"))?;
            self.landed = false;
        }
        self.used = at + bytes;
        Ok(Some(Queued {
            at,
            len,
            _values: PhantomData,
        }))
    }

    /// The memory's address (made now if the device has none yet).
    fn memory(&mut self) -> Result<usize> {
        if self.mem.is_none() {
            // SAFETY: the memory is written by a copy before it is read (`take` checks that
            // the copies have landed).
            let mem = unsafe {
                self.gpu
                    .ctx
                    .alloc_pinned_with_flags::<u8>(READBACK_BYTES, 0)
            }
            .map_err(dev_err("allocating pinned host memory"))?;
            let at = mem.as_ptr().map_err(dev_err("pinned host memory"))? as usize;
            self.mem = Some((mem, at));
        }
        Ok(self.mem.as_ref().expect("made above").1)
    }

    /// Waits until every queued read has landed (with the device's work before it).
    pub fn wait(&mut self) -> Result<()> {
        if !self.landed {
            self.gpu.sync()?;
            self.landed = true;
        }
        Ok(())
    }

    /// The values of a landed read, copied into `dst` (of the read's length).
    ///
    /// Panics when reads are still in flight ([`Readback::wait`] first) or the lengths differ.
    pub fn take<T: Copy>(&self, read: Queued<T>, dst: &mut [T]) {
        assert!(self.landed, "a read taken before the readback's wait");
        assert_eq!(
            dst.len(),
            read.len,
            "a read taken into a buffer of another length"
        );
        let base = self.mem.as_ref().expect("made by the read's queueing").1;
        // SAFETY: the read's bytes lie in the memory, aligned for `T` (see `queue`), and the
        // copy into them has completed (`landed`); `T` is a plain number type.
        let src = unsafe { std::slice::from_raw_parts((base + read.at) as *const T, read.len) };
        dst.copy_from_slice(src);
    }
}

impl Drop for Readback<'_> {
    fn drop(&mut self) {
        // Copies still in flight write into the memory: they land before anyone reuses it.
        if !self.landed {
            let _ = self.gpu.sync();
        }
        self.gpu.readback.set(self.mem.take());
    }
}

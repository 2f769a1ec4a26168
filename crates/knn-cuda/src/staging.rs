//! Page-locked host staging for copies between host and device: the host fills (or drains)
//! one chunk on every core while the device copies another, at the bus's speed instead of the
//! driver's bounce through pageable memory.

use crate::device::{dev_err, Gpu};
use cudarc::driver::{CudaEvent, CudaStream, PinnedHostSlice};
use knn_core::Result;
use rayon::prelude::*;

/// Page-locked host memory for the copies: [`STAGE_SLOTS`] slots of [`STAGE_CHUNK`] bytes, each
/// with an event marking when the device is done with it, so the host fills (or drains) one slot
/// on every core while the device copies another.
pub(crate) struct Staging {
    mem: PinnedHostSlice<u8>,
    done: Vec<CudaEvent>,
    /// Threads of [`thread_copy`] (`CudaTuning::copy_threads`: one memcpy stream reaches
    /// about a third of the bus's speed).
    threads: usize,
}

/// 6 MiB: a multiple of the row size (4·d bytes) for d = 1, 2, 3, so rows never straddle chunks.
pub(crate) const STAGE_CHUNK: usize = 12 << 19;
const STAGE_SLOTS: usize = 4;
/// Bytes per task of the parallel host copies (also a multiple of every row size).
pub(crate) const PIECE: usize = 12 << 14;

/// The bytes of a slice of plain numbers.
pub(crate) fn bytes_of<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: u8 has alignment 1 and the range is the slice's own memory.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// The bytes of a mutable slice of numbers for which every bit pattern is valid (u32, f32, f64).
pub(crate) fn bytes_of_mut<T: Copy>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as above; callers only use types where any bytes form a valid value.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

/// `dst.copy_from_slice(src)` on `threads` scoped threads (this one among them).
fn thread_copy(dst: &mut [u8], src: &[u8], threads: usize) {
    let part = dst.len().div_ceil(threads.max(1)).max(1 << 16);
    std::thread::scope(|sc| {
        let mut pieces = dst.chunks_mut(part).zip(src.chunks(part));
        let first = pieces.next();
        for (d, s) in pieces {
            sc.spawn(move || d.copy_from_slice(s));
        }
        if let Some((d, s)) = first {
            d.copy_from_slice(s);
        }
    });
}

pub(crate) fn par_copy(dst: &mut [u8], src: &[u8]) {
    dst.par_chunks_mut(PIECE)
        .zip(src.par_chunks(PIECE))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

impl Staging {
    /// Staging memory of `gpu` whose host copies outside the rayon pool take `threads`.
    pub(crate) fn new(gpu: &Gpu, threads: usize) -> Result<Self> {
        // SAFETY: every slot is written (by the host or a copy) before it is read.
        let mem = unsafe {
            gpu.ctx
                .alloc_pinned_with_flags::<u8>(STAGE_CHUNK * STAGE_SLOTS, 0)
        }
        .map_err(dev_err("allocating pinned host memory"))?;
        let done = (0..STAGE_SLOTS)
            .map(|_| gpu.ctx.new_event(None))
            .collect::<std::result::Result<_, _>>()
            .map_err(dev_err("creating events"))?;
        Ok(Self { mem, done, threads })
    }

    /// Slot `s`, `len` bytes, once the device is done with it.
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn slot(&self, s: usize, len: usize) -> Result<&mut [u8]> {
        self.done[s]
            .synchronize()
            .map_err(dev_err("waiting for a copy"))?;
        let base = self.mem.as_ptr().map_err(dev_err("pinned host memory"))? as *mut u8;
        // SAFETY: the range lies in the pinned allocation; the device no longer touches it (its
        // last copy's event has completed) and the host uses one slot at a time.
        Ok(unsafe { std::slice::from_raw_parts_mut(base.add(s * STAGE_CHUNK), len) })
    }

    /// Copies `len` bytes to the device at `dst`, chunk by chunk: `fill(offset, chunk)` writes
    /// each chunk of the source into staging memory, and the device copies it on while the
    /// next is filled.
    fn upload_chunks(
        &self,
        gpu: &Gpu,
        len: usize,
        dst: u64,
        mut fill: impl FnMut(usize, &mut [u8]),
    ) -> Result<()> {
        for (i, off) in (0..len).step_by(STAGE_CHUNK).enumerate() {
            let s = i % STAGE_SLOTS;
            let buf = self.slot(s, (len - off).min(STAGE_CHUNK))?;
            fill(off, buf);
            // SAFETY: `dst` has room for `len` bytes (callers size it), the source is pinned
            // memory that stays untouched until the event recorded next has completed.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(
                    dst + off as u64,
                    &*buf,
                    gpu.stream.cu_stream(),
                )
            }
            .map_err(dev_err("copying to the device"))?;
            self.done[s]
                .record(&gpu.stream)
                .map_err(dev_err("recording an event"))?;
        }
        Ok(())
    }

    /// Copies `src` to the device at `dst`, folding each row-aligned piece of `src` into an
    /// accumulator on the way (`fold`, combined by `reduce`; the pieces on the rayon pool).
    pub(crate) fn upload<A: Send>(
        &self,
        gpu: &Gpu,
        src: &[u8],
        dst: u64,
        identity: impl Fn() -> A + Sync + Send,
        fold: impl Fn(A, &[u8]) -> A + Sync + Send,
        reduce: impl Fn(A, A) -> A + Sync + Send,
    ) -> Result<A> {
        let mut acc = Some(identity());
        self.upload_chunks(gpu, src.len(), dst, |off, buf| {
            let chunk = &src[off..off + buf.len()];
            let part = buf
                .par_chunks_mut(PIECE)
                .zip(chunk.par_chunks(PIECE))
                .fold(&identity, |a, (d, c)| {
                    d.copy_from_slice(c);
                    fold(a, c)
                })
                .reduce(&identity, &reduce);
            acc = acc.take().map(|a| reduce(a, part));
        })?;
        Ok(acc.expect("put back by every chunk"))
    }

    /// Copies `src` to the device at `dst`.
    pub(crate) fn upload_plain(&self, gpu: &Gpu, src: &[u8], dst: u64) -> Result<()> {
        self.upload(gpu, src, dst, || (), |(), _| (), |(), ()| ())
    }

    /// Copies `src` to the device at `dst`, the host copies on threads of its own (not the rayon
    /// pool: a caller holding a lock that other rayon tasks wait for must not help run them).
    pub(crate) fn upload_own_threads(&self, gpu: &Gpu, src: &[u8], dst: u64) -> Result<()> {
        self.upload_chunks(gpu, src.len(), dst, |off, buf| {
            thread_copy(buf, &src[off..off + buf.len()], self.threads)
        })
    }

    /// Copies `bytes` bytes from the device at `src`, handing each chunk to `sink(offset,
    /// bytes)` (in order) while the next ones are on their way.
    pub(crate) fn download(
        &self,
        gpu: &Gpu,
        src: u64,
        bytes: usize,
        sink: impl FnMut(usize, &[u8]),
    ) -> Result<()> {
        self.download_with(&gpu.stream, src, bytes, sink)
    }

    /// [`Staging::download`] on `stream`.
    fn download_with(
        &self,
        stream: &CudaStream,
        src: u64,
        bytes: usize,
        mut sink: impl FnMut(usize, &[u8]),
    ) -> Result<()> {
        let chunks = bytes.div_ceil(STAGE_CHUNK);
        let len = |i: usize| (bytes - i * STAGE_CHUNK).min(STAGE_CHUNK);
        let enqueue = |i: usize| -> Result<()> {
            let s = i % STAGE_SLOTS;
            let buf = self.slot(s, len(i))?;
            // SAFETY: the device range holds `len(i)` bytes at that offset (callers size it);
            // the pinned destination is read only after the event recorded next.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(
                    buf,
                    src + (i * STAGE_CHUNK) as u64,
                    stream.cu_stream(),
                )
            }
            .map_err(dev_err("copying from the device"))?;
            self.done[s]
                .record(stream)
                .map_err(dev_err("recording an event"))
        };
        for i in 0..chunks.min(STAGE_SLOTS) {
            enqueue(i)?;
        }
        for i in 0..chunks {
            sink(i * STAGE_CHUNK, self.slot(i % STAGE_SLOTS, len(i))?);
            if i + STAGE_SLOTS < chunks {
                enqueue(i + STAGE_SLOTS)?;
            }
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes from the device at `src` into `dst`.
    pub(crate) fn download_into(&self, gpu: &Gpu, src: u64, dst: &mut [u8]) -> Result<()> {
        self.download(gpu, src, dst.len(), |off, b| {
            par_copy(&mut dst[off..off + b.len()], b)
        })
    }

    /// `dst.len()` bytes from the device at `src` on `stream`, the host copies on threads of
    /// their own.
    pub(crate) fn download_on(&self, stream: &CudaStream, src: u64, dst: &mut [u8]) -> Result<()> {
        self.download_with(stream, src, dst.len(), |off, b| {
            thread_copy(&mut dst[off..off + b.len()], b, self.threads)
        })
    }

    /// [`Staging::download_into`] with the host copies on threads of its own (see
    /// [`Staging::upload_own_threads`]).
    pub(crate) fn download_own_threads(&self, gpu: &Gpu, src: u64, dst: &mut [u8]) -> Result<()> {
        self.download(gpu, src, dst.len(), |off, b| {
            thread_copy(&mut dst[off..off + b.len()], b, self.threads)
        })
    }
}

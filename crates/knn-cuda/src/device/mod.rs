//! Device state: context, stream, the NVRTC-compiled modules (machine code cached on disk, loaded once
//! per device and process) and their functions.

use crate::staging::{bytes_of, bytes_of_mut, Staging};
use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError,
    PinnedHostSlice,
};
use knn_core::{KnnError, Result};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

mod compile;
mod discovery;
mod locked;
mod pins;
mod readback;

use compile::{
    compiled_expr, compiled_main, compiled_sym, fnv1a, kernel_names, loaded, LoadedKernel, Names,
    EXPR, SOURCES, SYM,
};
pub(crate) use discovery::driver_device_count;
pub use discovery::{devices, DeviceInfo};
pub(crate) use locked::{HostVec, LockedPool};
use pins::keep_pool_memory;
pub(crate) use pins::{link_peers, HostPins};
pub(crate) use readback::{Queued, Readback};

/// Maps a driver error to the library's error (out-of-memory kept recognisable).
pub(crate) fn dev_err(what: &str) -> impl Fn(DriverError) -> KnnError + '_ {
    move |e| KnnError::Device(format!("{what}: {e}"))
}

/// `true` when a driver error is an allocation failure.
pub(crate) fn is_oom(e: &KnnError) -> bool {
    matches!(e, KnnError::Device(m) if m.contains("CUDA_ERROR_OUT_OF_MEMORY"))
}

/// One device, ready to launch: context, one stream, all kernels.
pub(crate) struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    pub sm_count: usize,
    pub max_smem_optin: usize,
    /// Compute capability, for compiling expression modules.
    arch: (i32, i32),
    /// This device's index of the kernels of every module in `modules` (each function keeps
    /// its module loaded).
    functions: HashMap<String, Arc<LoadedKernel>>,
    /// The modules whose kernels are in `functions`: "main", "sym", expression tags.
    modules: HashSet<String>,
    pub blas: Option<cudarc::cublas::CudaBlas>,
    /// Page-locked memory for large copies, made on first use.
    staging: std::cell::OnceCell<Staging>,
    /// Host threads of the staged copies outside the rayon pool (`CudaTuning::copy_threads`).
    copy_threads: usize,
    /// Whether the fused method times its kernels with CUDA events
    /// (`CudaEngine::with_kernel_timing`).
    pub kernel_timing: bool,
    /// A second stream, for downloads that overlap the main stream's kernels (made on first
    /// use; see [`Gpu::download_range_after`]).
    copies: std::cell::OnceCell<Arc<CudaStream>>,
    /// Page-locked host memory for small downloads (made on first use; see
    /// [`Gpu::read_small`]), and its address.
    small: std::cell::OnceCell<(PinnedHostSlice<u8>, usize)>,
    /// Page-locked host memory for [`Readback`]s (made on first use, taken while one lives),
    /// and its address.
    readback: std::cell::Cell<Option<(PinnedHostSlice<u8>, usize)>>,
    /// The free memory last read (see [`Gpu::mem_info`]).
    free_seen: std::cell::Cell<Option<usize>>,
    /// The event that orders this stream after a caller's (made on first use; see
    /// [`Gpu::follow_stream`]).
    join: std::cell::OnceCell<CudaEvent>,
    /// The stream-ordered allocator's pool (its handle's address: a driver object usable from
    /// any thread), when it keeps freed memory (see [`keep_pool_memory`]).
    pub pool: Option<usize>,
    /// Host memory of the caller's page-locked in place: copies into it skip the staging.
    pub pins: Arc<HostPins>,
}

/// Copies of at least this many bytes go through the page-locked staging memory. Below it the
/// driver's own pageable copy is faster: its bounce buffer needs no threads started (H200 host,
/// medians: 2 MiB up 162–166 µs pageable against 213–369 µs staged on 1–4 threads, 4 MiB
/// 305 against 408–446; at 8 MiB staged on 4 threads wins, 536 against 635 up and 664
/// against 839 down).
const STAGED_MIN: usize = 8 << 20;
/// Downloads of at most this many bytes go through [`Gpu::read_small`].
const SMALL_READ: usize = 4096;

impl Gpu {
    pub fn new(ordinal: usize) -> Result<Self> {
        let count = driver_device_count();
        if count == 0 {
            return Err(KnnError::Device(
                "no usable CUDA device (the driver library libcuda could not be loaded or reports no GPU)".into(),
            ));
        }
        if ordinal >= count {
            return Err(KnnError::Device(format!(
                "CUDA device {ordinal} does not exist ({count} found)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(dev_err("creating the CUDA context"))?;
        // SAFETY: this crate orders its streams itself (the copy stream waits for events
        // recorded behind its buffers' writers, `follow_stream` joins a caller's, and the host
        // waits for every copy before its buffer is dropped). cudarc's tracking would also make
        // two events with every buffer and destroy them with it: a small search allocates about
        // ten buffers, on the host's path before its first kernel.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(dev_err("compute capability"))?;
        let attr = |a| ctx.attribute(a).map_err(dev_err("device attribute"));
        let sm_count =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        let max_smem_optin =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
                as usize;
        let name = ctx.name().map_err(dev_err("device name"))?;
        let pool = keep_pool_memory(&ctx);
        // A stream of its own, not the context's legacy default stream: a copy from another
        // GPU (a shared graph's base rows, thresholds and lists) synchronises with the legacy
        // stream of the GPU it reads, so it waited for that GPU's running kernel. 2 H200s,
        // 64 MB from a GPU running a 150 ms kernel: done after 146 ms from legacy streams,
        // 0.3-1.9 ms from streams of their own (bench/gpu/pin_skew.py); a graph's parts then
        // started up to one thresholds pass (~134 ms) apart (knn-cuda NOTES, stop 57).
        let stream = ctx.new_stream().map_err(dev_err("creating a stream"))?;
        let functions = (*loaded(&ctx, ordinal, "main", || {
            let image = compiled_main(major, minor)?;
            Ok((
                image,
                SOURCES
                    .iter()
                    .flat_map(|s| kernel_names(s))
                    .map(|n| (n.clone(), n))
                    .collect(),
            ))
        })?)
        .clone();
        Ok(Self {
            ctx,
            stream,
            name,
            sm_count,
            max_smem_optin,
            arch: (major, minor),
            functions,
            modules: HashSet::from(["main".to_string()]),
            blas: None,
            staging: std::cell::OnceCell::new(),
            copy_threads: crate::tuning::COPY_THREADS,
            kernel_timing: false,
            copies: std::cell::OnceCell::new(),
            pins: HostPins::shared(),
            small: std::cell::OnceCell::new(),
            readback: std::cell::Cell::new(None),
            free_seen: Default::default(),
            join: std::cell::OnceCell::new(),
            pool,
        })
    }

    /// Loads the kernels of an expression program for rows of `values` floats (compiled by
    /// NVRTC, or from the disk cache) and returns their tag: `fused_{tag}_w32`, `tile_{tag}`,
    /// `filter_{tag}` are then [`Gpu::func`]s, used by the fused method in place of a built-in
    /// kernel's.
    pub fn expr_kernels(
        &mut self,
        program: &knn_core::EngineProgram,
        values: usize,
    ) -> Result<String> {
        let prelude = crate::expr::prelude(program, values);
        let tag = format!("expr_{:016x}", fnv1a(&[prelude.as_bytes()]));
        let (major, minor) = self.arch;
        self.load(&tag, || {
            let image = compiled_expr(&prelude, major, minor)?;
            let names = kernel_names(EXPR).into_iter();
            Ok((
                image,
                names
                    .map(|n| (n.clone(), n.replacen("expr", &tag, 1)))
                    .collect(),
            ))
        })?;
        Ok(tag)
    }

    /// Loads the symmetric self-join kernels (`sym_{tf32_}{tag}_w{32,64,128}`, see
    /// `kernels/sym.cu`; compiled by NVRTC or taken from the disk cache) as [`Gpu::func`]s.
    pub fn sym_kernels(&mut self) -> Result<()> {
        let (major, minor) = self.arch;
        self.load("sym", || {
            let image = compiled_sym(major, minor)?;
            Ok((
                image,
                kernel_names(SYM)
                    .into_iter()
                    .map(|n| (n.clone(), n))
                    .collect(),
            ))
        })
    }

    /// Adds the kernels of module `tag` (see [`loaded`]) to this device's functions.
    fn load(
        &mut self,
        tag: &str,
        compile: impl FnOnce() -> Result<(Vec<u8>, Names)>,
    ) -> Result<()> {
        if !self.modules.contains(tag) {
            let ordinal = self.ctx.ordinal();
            let kernels = loaded(&self.ctx, ordinal, tag, compile)?;
            self.functions
                .extend(kernels.iter().map(|(n, f)| (n.clone(), f.clone())));
            self.modules.insert(tag.to_string());
        }
        Ok(())
    }

    fn kernel(&self, name: &str) -> Result<&LoadedKernel> {
        self.functions
            .get(name)
            .map(|k| &**k)
            .ok_or_else(|| KnnError::Device(format!("kernel {name} missing from the module")))
    }

    pub fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.kernel(name).map(|k| &k.f)
    }

    /// Kernel `name`, allowed at least `smem` bytes of dynamic shared memory (see
    /// [`LoadedKernel::with_smem`]).
    pub fn func_with_smem(&self, name: &str, smem: usize) -> Result<&CudaFunction> {
        self.kernel(name)?.with_smem(smem)
    }

    /// Kernel `name` allowed `smem` bytes of dynamic shared memory (see
    /// [`Gpu::func_with_smem`]), and how many of its 256-thread blocks fit on one SM, counting
    /// at most 2 (the memory plans of the fused method assume it); asked of the driver once.
    pub fn blocks_per_sm(&self, name: &str, smem: usize) -> Result<(&CudaFunction, usize)> {
        let k = self.kernel(name)?;
        let f = k.with_smem(smem)?;
        let mut known = k.occupancy.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, n)) = known.iter().find(|o| o.0 == smem) {
            return Ok((f, n));
        }
        let n = f
            .occupancy_max_active_blocks_per_multiprocessor(256, smem, None)
            .unwrap_or(1)
            .clamp(1, 2) as usize;
        known.push((smem, n));
        Ok((f, n))
    }

    /// Registers / local bytes / static shared bytes of a few kernels.
    pub fn kernel_report(&self) -> String {
        use sys::CUfunction_attribute as A;
        let mut out = String::new();
        for n in [
            "fused_sql2_w32",
            "fused_sql2_w128",
            "fused_tf32_sql2_w32",
            "fused_tf32_sql2_w128",
            "filter_tf32_sql2",
            "fused_l1_w32",
            "tile_sql2",
            "select_topk",
        ] {
            if let Ok(f) = self.func(n) {
                let g = |a| f.get_attribute(a).unwrap_or(-1);
                out += &format!(
                    "{n}: {} regs, {} local bytes, {} static smem; ",
                    g(A::CU_FUNC_ATTRIBUTE_NUM_REGS),
                    g(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
                    g(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
                );
            }
        }
        out
    }

    /// (free, total) device bytes; free counts the memory our pool keeps unused. Read from
    /// the device (a call through the GPU's firmware: 15–29 µs on an H200) and kept (see
    /// [`Gpu::free_seen`]).
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        let (free, total) = self.ctx.mem_get_info().map_err(dev_err("memory info"))?;
        let free = free + self.pool_idle();
        self.free_seen.set(Some(free));
        Ok((free, total))
    }

    /// The free bytes [`Gpu::mem_info`] last read, if any.
    pub fn free_seen(&self) -> Option<usize> {
        self.free_seen.get()
    }

    /// Bytes the stream-ordered pool holds but no allocation uses.
    fn pool_idle(&self) -> usize {
        use cudarc::driver::result::mem_pool;
        let Some(pool) = self.pool else { return 0 };
        let pool = pool as sys::CUmemoryPool;
        let attr = |a| {
            let mut v = 0u64;
            // SAFETY: the pool is the device's own; these attributes are u64.
            unsafe { mem_pool::get_attribute(pool, a, &mut v as *mut u64 as *mut std::ffi::c_void) }
                .map(|_| v)
                .unwrap_or(0)
        };
        use sys::CUmemPool_attribute::{
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT as RESERVED,
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT as USED,
        };
        attr(RESERVED).saturating_sub(attr(USED)) as usize
    }

    /// Allocates `len` elements (contents undefined).
    pub fn alloc<T: cudarc::driver::DeviceRepr>(&self, len: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every buffer is written by a copy or a kernel before it is read.
        unsafe { self.stream.alloc::<T>(len.max(1)) }.map_err(dev_err("allocating device memory"))
    }

    /// Sets the host threads of the staged copies (the staging memory is made anew).
    pub fn set_copy_threads(&mut self, threads: usize) {
        if threads != self.copy_threads {
            self.copy_threads = threads;
            self.staging.take();
        }
    }

    /// The page-locked staging memory of this device's copies (made on first use).
    pub fn staging(&self) -> Result<&Staging> {
        if self.staging.get().is_none() {
            let s = Staging::new(self, self.copy_threads)?;
            let _ = self.staging.set(s);
        }
        Ok(self.staging.get().expect("set above"))
    }

    /// Copies `dst.len()` values from device address `src` into `dst`, after the work queued
    /// before on this stream; returns when the copy is done.
    ///
    /// # Safety
    /// `src` must hold `dst.len()` values of `T` in memory of this context.
    pub unsafe fn read_at<T: cudarc::driver::DeviceRepr + Copy>(
        &self,
        src: u64,
        dst: &mut [T],
    ) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: as the caller vouches; the stream is synchronised before `dst` is returned.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(dev_err("copying from the device"))?;
        self.sync()
    }

    /// Copies `src` to device address `dst`, after the work queued before on this stream;
    /// returns when the copy is done.
    ///
    /// # Safety
    /// `dst` must have room for `src.len()` values of `T` in memory of this context.
    pub unsafe fn write_at<T: cudarc::driver::DeviceRepr + Copy>(
        &self,
        src: &[T],
        dst: u64,
    ) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: as the caller vouches; `src` outlives the copy (synchronised below).
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(dev_err("copying to the device"))?;
        self.sync()
    }

    /// Orders this device's stream after the work queued so far on `stream`, a `CUstream` of
    /// this context (0: its legacy default stream), without waiting on the host: the same
    /// stream needs nothing, another is joined through an event (a host wait for the caller's
    /// stream took 25 µs of a 0.45 ms search, H200).
    ///
    /// # Safety
    /// `stream` must be 0 or a live stream of this context.
    pub unsafe fn follow_stream(&self, stream: u64) -> Result<()> {
        let theirs = stream as sys::CUstream;
        if theirs == self.stream.cu_stream() {
            return Ok(());
        }
        if self.join.get().is_none() {
            let e = self
                .ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(dev_err("creating an event"))?;
            let _ = self.join.set(e);
        }
        let e = self.join.get().expect("set above").cu_event();
        // SAFETY: the event is ours and live; the caller vouches for `stream`. A wait takes
        // the event's state at the time of the call, so the event may be recorded again.
        unsafe {
            cudarc::driver::result::event::record(e, theirs)
                .and_then(|()| {
                    cudarc::driver::result::stream::wait_event(
                        self.stream.cu_stream(),
                        e,
                        sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                    )
                })
                .map_err(dev_err("ordering after the caller's stream"))
        }
    }

    /// `dst.len()` bytes (at most [`SMALL_READ`]) from device address `src`, once the stream's
    /// work is done: copied into page-locked memory behind that work, so that one wait covers
    /// both (a pageable copy waits for the stream, then bounces through the driver's buffer).
    ///
    /// # Safety
    /// `src` must hold `dst.len()` bytes in this context.
    unsafe fn read_small(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        debug_assert!(dst.len() <= SMALL_READ);
        if self.small.get().is_none() {
            // SAFETY: the memory is written by a copy before it is read.
            let mem = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(SMALL_READ, 0) }
                .map_err(dev_err("allocating pinned host memory"))?;
            let at = mem.as_ptr().map_err(dev_err("pinned host memory"))? as usize;
            let _ = self.small.set((mem, at));
        }
        let at = self.small.get().expect("set above").1;
        // SAFETY: `at` holds SMALL_READ bytes of page-locked memory that only this device's
        // (locked) calls use, one at a time; the copy has completed after the sync.
        unsafe {
            let buf = std::slice::from_raw_parts_mut(at as *mut u8, dst.len());
            cudarc::driver::result::memcpy_dtoh_async(buf, src, self.stream.cu_stream())
                .map_err(dev_err("copying from the device"))?;
            self.sync()?;
            dst.copy_from_slice(buf);
        }
        Ok(())
    }

    /// A new device buffer holding `data` (large ones through the staging memory).
    pub fn upload<T: cudarc::driver::DeviceRepr + Copy>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        if data.is_empty() {
            return self.alloc(1);
        }
        if std::mem::size_of_val(data) >= STAGED_MIN {
            let dst = self.alloc::<T>(data.len())?;
            self.staging()?
                .upload_own_threads(self, bytes_of(data), self.ptr(&dst))?;
            return Ok(dst);
        }
        self.stream
            .clone_htod(data)
            .map_err(dev_err("copying to the device"))
    }

    /// The first `len` values of `src` (large ones through the staging memory). `T` is a plain
    /// number type (every bit pattern valid).
    pub fn download<T: cudarc::driver::DeviceRepr + Default + Copy>(
        &self,
        src: &CudaSlice<T>,
        len: usize,
    ) -> Result<Vec<T>> {
        let mut out = vec![T::default(); len];
        self.download_into(src, &mut out)?;
        Ok(out)
    }

    /// The first `dst.len()` values of `src` into `dst` (large ones through the staging
    /// memory, unless `dst` is page-locked). `T` is a plain number type (every bit pattern
    /// valid).
    pub fn download_into<T: cudarc::driver::DeviceRepr + Copy>(
        &self,
        src: &CudaSlice<T>,
        dst: &mut [T],
    ) -> Result<()> {
        let pinned = self.pins.contains(bytes_of(dst));
        if std::mem::size_of_val(dst) <= SMALL_READ && !dst.is_empty() {
            assert!(dst.len() <= src.len(), "a download past its buffer");
            // SAFETY: `src` holds at least `dst.len()` values (checked above).
            unsafe { self.read_small(self.ptr(src), bytes_of_mut(dst)) }?;
        } else if std::mem::size_of_val(dst) >= STAGED_MIN && !pinned {
            self.staging()?
                .download_own_threads(self, self.ptr(src), bytes_of_mut(dst))?;
        } else if !dst.is_empty() {
            self.stream
                .memcpy_dtoh(&src.slice(0..dst.len()), dst)
                .map_err(dev_err("copying from the device"))?;
            // Into pageable memory the copy has completed on return; into page-locked memory
            // it runs on.
            if pinned {
                self.stream
                    .synchronize()
                    .map_err(dev_err("copying from the device"))?;
            }
        }
        Ok(())
    }

    /// The stream of [`Gpu::download_range_after`].
    fn copy_stream(&self) -> Result<&Arc<CudaStream>> {
        if self.copies.get().is_none() {
            // (cudarc's event tracking is off: see `Gpu::new`.)
            let s = self
                .ctx
                .new_stream()
                .map_err(dev_err("creating a stream"))?;
            let _ = self.copies.set(s);
        }
        Ok(self.copies.get().expect("set above"))
    }

    /// `src[at..at + dst.len()]` into `dst`, on a stream of its own once the main stream's work
    /// recorded in `after` has completed: the main stream's later work goes on meanwhile.
    pub fn download_range_after<T: cudarc::driver::DeviceRepr + Copy>(
        &self,
        src: &CudaSlice<T>,
        at: usize,
        dst: &mut [T],
        after: &CudaEvent,
    ) -> Result<()> {
        let end = at + dst.len();
        if end > src.len() {
            return Err(KnnError::Device(format!(
                "download of {at}..{end} from a buffer of {}",
                src.len()
            )));
        }
        let copies = self.copy_stream()?;
        copies
            .wait(after)
            .map_err(dev_err("waiting for an event"))?;
        let from = self.ptr(src) + (at * std::mem::size_of::<T>()) as u64;
        if std::mem::size_of_val(dst) >= STAGED_MIN && !self.pins.contains(bytes_of(dst)) {
            self.staging()?
                .download_on(copies, from, bytes_of_mut(dst))?;
        } else if !dst.is_empty() {
            // SAFETY: the range lies in `src` (checked above); the copy (to pageable or
            // page-locked memory) has completed when the stream is synchronised below.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(
                    bytes_of_mut(dst),
                    from,
                    copies.cu_stream(),
                )
            }
            .map_err(dev_err("copying from the device"))?;
            copies
                .synchronize()
                .map_err(dev_err("copying from the device"))?;
        }
        Ok(())
    }

    pub fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(dev_err("kernel execution"))
    }

    /// The raw device address of a buffer (kernel arguments that may also be null).
    pub fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _sync) = s.device_ptr(&self.stream);
        p
    }

    /// Fills `n` u64 words at `p` with `v` (sentinels; 0xFF.. poisons outputs).
    pub fn fill_u64(&self, p: u64, n: usize, v: u64) -> Result<()> {
        use cudarc::driver::{LaunchConfig, PushKernelArg};
        if n == 0 {
            return Ok(());
        }
        let f = self.func("fill_u64")?;
        let n64 = n as i64;
        let blocks = n.div_ceil(256).min(65535) as u32;
        let mut b = self.stream.launch_builder(f);
        b.arg(&p).arg(&n64).arg(&v);
        // SAFETY: p points to at least n u64 words (callers pass their own buffers).
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(dev_err("fill"))?;
        Ok(())
    }

    /// Hellinger's centred roots of the `rows × d` given rows at `given` into `out` (bit for bit
    /// the host's [`knn_core::CentredRoots`]; `centre` a device address of `d` f64), and each
    /// row's norm rounded up into `norm_up`.
    pub fn hellinger_roots(
        &self,
        given: u64,
        rows: usize,
        d: usize,
        centre: u64,
        (out, norm_up): (u64, u64),
    ) -> Result<()> {
        use cudarc::driver::{LaunchConfig, PushKernelArg};
        if rows == 0 {
            return Ok(());
        }
        let f = self.func("hellinger_roots")?;
        let (r, dd) = (rows as i64, d as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(&given)
            .arg(&r)
            .arg(&dd)
            .arg(&centre)
            .arg(&out)
            .arg(&norm_up);
        // SAFETY: given and out hold rows×d floats, centre d doubles, norm_up rows floats.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: ((rows * 32).div_ceil(256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(dev_err("hellinger_roots"))?;
        Ok(())
    }

    /// Squared norms of `rows` rows of dimension `d` at `x`, into `out`.
    pub fn sq_norms(&self, x: u64, rows: usize, d: usize, out: u64) -> Result<()> {
        self.ready_rows(
            rows,
            d,
            ReadyRows {
                from: x,
                to: 0,
                centre: 0,
                norms: out,
                cut: 0,
            },
        )
    }

    /// [`Gpu::sq_norms`] of the rows centred in place first (`x -= centre`, row by row) when
    /// `centre` (a device address of `d` floats) is not 0.
    pub fn centre_sq_norms(
        &self,
        x: u64,
        rows: usize,
        d: usize,
        centre: u64,
        out: u64,
    ) -> Result<()> {
        let to = if centre == 0 { 0 } else { x };
        let r = ReadyRows {
            from: x,
            to,
            centre,
            norms: out,
            cut: 0,
        };
        self.ready_rows(rows, d, r)
    }

    /// `rows` rows of dimension `d` readied for the fused kernels in one launch (see
    /// [`ReadyRows`]).
    pub fn ready_rows(&self, rows: usize, d: usize, r: ReadyRows) -> Result<()> {
        use cudarc::driver::{LaunchConfig, PushKernelArg};
        if rows == 0 {
            return Ok(());
        }
        let f = self.func("sq_norms")?;
        let (n, dd) = (rows as i64, d as i32);
        let blocks = (rows * 32).div_ceil(256) as u32;
        let mut b = self.stream.launch_builder(f);
        b.arg(&r.from)
            .arg(&n)
            .arg(&dd)
            .arg(&r.centre)
            .arg(&r.to)
            .arg(&r.norms)
            .arg(&r.cut);
        // SAFETY: from (and to, when not null) hold rows×d floats, centre (or null) d floats,
        // norms rows floats, cut (or null) rows u64 words.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(dev_err("sq_norms"))?;
        Ok(())
    }
}

/// Device addresses of one [`Gpu::ready_rows`] launch: row r of `to` becomes row r of `from`
/// minus `centre` (one f32 rounding of the exact difference; `to` may be `from`: centred in
/// place), `norms[r]` its squared norm summed in f32 (error ≤ γ_d · exact), and `cut[r]`
/// `u64::MAX`, the fused kernels' empty cut. 0 for `to`: the centred rows are not kept (only
/// their norms); for `centre`: no centring; for `cut`: not filled.
#[derive(Clone, Copy, Debug)]
pub struct ReadyRows {
    /// The rows as given.
    pub from: u64,
    /// Where the centred rows go, or 0.
    pub to: u64,
    /// `d` floats, or 0.
    pub centre: u64,
    /// `rows` floats.
    pub norms: u64,
    /// `rows` u64 words, or 0.
    pub cut: u64,
}

#[cfg(test)]
mod tests;

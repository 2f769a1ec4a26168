//! Device state: context, stream, the NVRTC-compiled modules (PTX cached on disk, loaded once
//! per device and process) and their functions.

use crate::staging::{bytes_of, bytes_of_mut, Staging};
use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
    DriverError,
};
use cudarc::nvrtc::{CompileOptions, Ptx};
use knn_core::{KnnError, Result};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

const COMMON: &str = include_str!("../../kernels/common.cuh");
/// The fused method's key tiles, and its lists and entry points (one program, in this order).
const TILES: &str = include_str!("../../kernels/tiles.cu");
const FUSED: &str = include_str!("../../kernels/fused.cu");
/// The expression kernels, compiled per program (see [`Gpu::expr_kernels`]).
const EXPR: &str = include_str!("../../kernels/expr.cu");
/// The symmetric self-join kernels, a module of their own loaded on first use (see
/// [`Gpu::sym_kernels`]).
const SYM: &str = include_str!("../../kernels/sym.cu");

/// The kernel sources, concatenated in this order into one NVRTC program.
const SOURCES: [&str; 6] = [
    COMMON,
    TILES,
    FUSED,
    include_str!("../../kernels/select.cu"),
    include_str!("../../kernels/baseline.cu"),
    include_str!("../../kernels/grid.cu"),
];

/// What `knn info` shows for one CUDA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
}

/// `true` when the driver library loads and reports at least one device. Never panics.
pub(crate) fn driver_device_count() -> usize {
    std::panic::catch_unwind(|| {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { sys::is_culib_present() } {
            return 0;
        }
        CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
    })
    .unwrap_or(0)
}

/// Every CUDA device with its name, memory and compute capability (empty without a driver).
pub fn devices() -> Vec<DeviceInfo> {
    (0..driver_device_count())
        .filter_map(|i| {
            std::panic::catch_unwind(|| {
                let ctx = CudaContext::new(i).ok()?;
                let (major, minor) = ctx.compute_capability().ok()?;
                Some(DeviceInfo {
                    ordinal: i,
                    name: ctx.name().ok()?,
                    total_memory: ctx.total_mem().ok()? as u64,
                    compute_capability: (major as u32, minor as u32),
                    multiprocessors: ctx
                        .attribute(
                            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                        )
                        .ok()? as u32,
                })
            })
            .ok()
            .flatten()
        })
        .collect()
}

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
    functions: HashMap<String, CudaFunction>,
    /// The modules whose kernels are in `functions`: "main", "sym", expression tags.
    modules: HashSet<String>,
    pub blas: Option<cudarc::cublas::CudaBlas>,
    /// Page-locked memory for large copies, made on first use.
    staging: std::cell::OnceCell<Staging>,
    /// Host threads of the staged copies outside the rayon pool (`CudaTuning::copy_threads`).
    copy_threads: usize,
    /// A second stream, for downloads that overlap the main stream's kernels (made on first
    /// use; see [`Gpu::download_range_after`]).
    copies: std::cell::OnceCell<Arc<CudaStream>>,
    /// The stream-ordered allocator's pool (its handle's address: a driver object usable from
    /// any thread), when it keeps freed memory (see [`keep_pool_memory`]).
    pool: Option<usize>,
    /// Host memory of the caller's page-locked in place: copies into it skip the staging.
    pub pins: Arc<HostPins>,
}

/// Host ranges page-locked in place (`cuMemHostRegister`), as (address, bytes): shared by the
/// engine, which adds and removes them without holding the device, and the copies, which go
/// straight into them. Copies are correct whether or not a range is locked (the driver stages
/// pageable memory itself); locking only makes them run at the bus's speed.
#[derive(Default)]
pub(crate) struct HostPins(std::sync::Mutex<Vec<(usize, usize)>>);

impl HostPins {
    /// Page-locks every range of `ranges` in place (the context `ctx` is bound to the calling
    /// thread here), all or none: the lock, released when the guard is dropped, or `None`
    /// when one was refused (the copies into them are then staged).
    ///
    /// The caller keeps the ranges alive and in place until it drops the guard.
    pub fn pin_all(
        self: &Arc<Self>,
        ctx: &Arc<CudaContext>,
        ranges: &mut [&mut [u8]],
    ) -> Option<Pinned> {
        if ctx.bind_to_thread().is_err() {
            return None;
        }
        let mut guard = Pinned {
            ctx: ctx.clone(),
            pins: self.clone(),
            ranges: Vec::with_capacity(ranges.len()),
        };
        for bytes in ranges.iter_mut() {
            let (p, len) = (bytes.as_mut_ptr(), bytes.len());
            // SAFETY: the range is live memory of the caller's, which the guard unlocks when
            // dropped, before the caller frees or returns it (this function's contract).
            let r = unsafe { cudarc::driver::sys::cuMemHostRegister_v2(p.cast(), len, 0) };
            if len == 0 || r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
                return None; // (the guard unlocks those locked so far)
            }
            guard.ranges.push((p as usize, len));
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((p as usize, len));
        }
        Some(guard)
    }

    /// Whether `bytes` lie inside one locked range.
    pub fn contains(&self, bytes: &[u8]) -> bool {
        let (p, len) = (bytes.as_ptr() as usize, bytes.len());
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|&(a, n)| p >= a && p + len <= a + n)
    }
}

/// Host ranges locked by [`HostPins::pin_all`]: unlocked when dropped (copies into them have
/// completed by then: the host waits for each). Other ranges, maybe another call's, stay
/// locked.
pub(crate) struct Pinned {
    ctx: Arc<CudaContext>,
    pins: Arc<HostPins>,
    ranges: Vec<(usize, usize)>,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let bound = self.ctx.bind_to_thread().is_ok();
        let mut locked = self.pins.0.lock().unwrap_or_else(|e| e.into_inner());
        for key in self.ranges.drain(..) {
            if let Some(i) = locked.iter().position(|&r| r == key) {
                locked.swap_remove(i);
            }
            if bound {
                // SAFETY: registered by `pin_all`, unregistered only here, once.
                unsafe { cudarc::driver::sys::cuMemHostUnregister(key.0 as *mut std::ffi::c_void) };
            }
        }
    }
}

/// Makes the device's stream-ordered allocator keep freed memory across synchronisations (by
/// default it returns it to the driver at each one, and the next call's allocations map it
/// again: several per fused call, for buffers of up to hundreds of MB). Returns the pool.
fn keep_pool_memory(ctx: &CudaContext) -> Option<usize> {
    use cudarc::driver::result::{device, mem_pool};
    // SAFETY: the device comes from a live context; the attribute takes a u64.
    unsafe {
        let pool = device::get_default_mem_pool(ctx.cu_device()).ok()?;
        let mut keep = u64::MAX;
        mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut keep as *mut u64 as *mut std::ffi::c_void,
        )
        .ok()?;
        Some(pool as usize)
    }
}

/// Copies of at least this many bytes go through the page-locked staging memory.
const STAGED_MIN: usize = 1 << 20;

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
        let stream = ctx.default_stream();
        let functions = (*loaded(&ctx, ordinal, "main", || {
            let ptx = compiled_ptx(major, minor)?;
            Ok((
                ptx,
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
            copies: std::cell::OnceCell::new(),
            pins: Arc::default(),
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
            let ptx = compiled_expr_ptx(&prelude, major, minor)?;
            let names = kernel_names(EXPR).into_iter();
            Ok((
                ptx,
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
            let ptx = compiled_sym_ptx(major, minor)?;
            Ok((
                ptx,
                kernel_names(SYM)
                    .into_iter()
                    .map(|n| (n.clone(), n))
                    .collect(),
            ))
        })
    }

    /// Adds the kernels of module `tag` (see [`loaded`]) to this device's functions.
    fn load(&mut self, tag: &str, compile: impl FnOnce() -> Result<(Ptx, Names)>) -> Result<()> {
        if !self.modules.contains(tag) {
            let ordinal = self.ctx.ordinal();
            let kernels = loaded(&self.ctx, ordinal, tag, compile)?;
            self.functions
                .extend(kernels.iter().map(|(n, f)| (n.clone(), f.clone())));
            self.modules.insert(tag.to_string());
        }
        Ok(())
    }

    pub fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.functions
            .get(name)
            .ok_or_else(|| KnnError::Device(format!("kernel {name} missing from the module")))
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
            if let Some(f) = self.functions.get(n) {
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

    /// Free and total device memory in bytes.
    /// (free, total) device bytes; free counts the memory our pool keeps unused.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        let (free, total) = self.ctx.mem_get_info().map_err(dev_err("memory info"))?;
        Ok((free + self.pool_idle(), total))
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

    /// A new device buffer holding the `len` values at device address `src` (memory of this
    /// context, e.g. a caller's tensor), copied in stream order.
    pub fn copy_from_device<T: cudarc::driver::DeviceRepr>(
        &self,
        src: u64,
        len: usize,
    ) -> Result<CudaSlice<T>> {
        let dst = self.alloc::<T>(len)?;
        if len > 0 {
            // SAFETY: `dst` holds `len` values; the caller vouches for `src` (see
            // `CudaEngine::search_device`).
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    self.ptr(&dst),
                    src,
                    len * std::mem::size_of::<T>(),
                    self.stream.cu_stream(),
                )
            }
            .map_err(dev_err("copying on the device"))?;
        }
        Ok(dst)
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

    /// Waits (on the host) for the work queued on `stream`, a `CUstream` of this context (0:
    /// its legacy default stream).
    ///
    /// # Safety
    /// `stream` must be 0 or a live stream of this context.
    pub unsafe fn wait_for_stream(&self, stream: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        unsafe { cudarc::driver::result::stream::synchronize(stream as sys::CUstream) }
            .map_err(dev_err("waiting for the caller's stream"))
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
        if std::mem::size_of_val(dst) >= STAGED_MIN && !pinned {
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
            // SAFETY: this crate orders its streams itself: the copy stream only reads buffers
            // after waiting for an event recorded behind their writers, and every such copy
            // has completed (the host waits for it) before its buffer can be dropped.
            unsafe { self.ctx.disable_event_tracking() };
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
        self.centre_sq_norms(x, rows, d, 0, out)
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
        use cudarc::driver::{LaunchConfig, PushKernelArg};
        if rows == 0 {
            return Ok(());
        }
        let f = self.func("sq_norms")?;
        let (r, dd) = (rows as i64, d as i32);
        let blocks = (rows * 32).div_ceil(256) as u32;
        let mut b = self.stream.launch_builder(f);
        b.arg(&x).arg(&r).arg(&dd).arg(&centre).arg(&out);
        // SAFETY: x holds rows*d floats, centre (or null) d floats and out rows floats.
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

/// (name in the module, name callers use) of a module's kernels.
type Names = Vec<(String, String)>;

/// Kernels of one loaded module, by the name callers use.
type Kernels = Arc<HashMap<String, CudaFunction>>;

/// The kernels of module `tag` on device `ordinal`, loaded on first use by any engine of this
/// process and shared from then on. Loading JIT-compiles the whole PTX for the device, hundreds
/// of milliseconds for the main module, which every index built on the device (a Dask worker
/// builds one per base chunk) would otherwise pay again. Contexts are the device's primary one,
/// so the functions are valid in every engine's context; each keeps its module alive.
fn loaded(
    ctx: &Arc<CudaContext>,
    ordinal: usize,
    tag: &str,
    compile: impl FnOnce() -> Result<(Ptx, Names)>,
) -> Result<Kernels> {
    static LOADED: OnceLock<Mutex<HashMap<(usize, String), Kernels>>> = OnceLock::new();
    // Held while compiling, so that two engines opening at once compile and load only once.
    let mut all = LOADED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(k) = all.get(&(ordinal, tag.to_string())) {
        return Ok(k.clone());
    }
    let (ptx, names) = compile()?;
    let module: Arc<CudaModule> = ctx
        .load_module(ptx)
        .map_err(dev_err("loading the kernels"))?;
    let mut kernels = HashMap::new();
    for (name, call) in names {
        let f = module
            .load_function(&name)
            .map_err(dev_err("loading a kernel"))?;
        kernels.insert(call, f);
    }
    let kernels = Arc::new(kernels);
    all.insert((ordinal, tag.to_string()), kernels.clone());
    Ok(kernels)
}

/// `extern "C" __global__ void NAME(` and `FUSED(NAME,` / `FEW(NAME,` / `TILE(NAME,` /
/// `DIST(NAME,` / `FILTER(NAME,` entries.
fn kernel_names(src: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in src.lines() {
        let l = line.trim_start();
        for mac in [
            "FUSED(", "FEW(", "TILE(", "DIST(", "FILTER(", "MERGE(", "GRIDQ(", "SYM(", "COLLECT(",
        ] {
            if let Some(rest) = l.strip_prefix(mac) {
                if let Some(n) = rest.split(',').next() {
                    if n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !n.is_empty() {
                        names.push(n.to_string());
                        if mac == "COLLECT(" {
                            names.push(format!("{n}_thr"));
                        }
                    }
                }
            }
        }
    }
    let joined = src.replace('\n', " ");
    let mut rest = joined.as_str();
    while let Some(i) = rest.find("extern \"C\" __global__ void") {
        rest = &rest[i + "extern \"C\" __global__ void".len()..];
        let mut head = rest.trim_start();
        if let Some(args) = head.strip_prefix("__launch_bounds__(") {
            // Skip the bounds' balanced parentheses.
            let mut depth = 1;
            let end = args
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(args.len(), |(j, _)| j + 1);
            head = &args[end..];
        }
        let name: String = head
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && name != "NAME" {
            names.push(name);
        }
    }
    names
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("knn"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("knn"))
}

fn nvrtc_version() -> Result<(i32, i32)> {
    let r = std::panic::catch_unwind(|| {
        // SAFETY: probes the library, then calls a function with two valid out-pointers.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return None;
        }
        let (mut a, mut b) = (0, 0);
        unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b) };
        Some((a, b))
    });
    match r {
        Ok(Some(v)) => Ok(v),
        _ => Err(KnnError::Device(
            "NVRTC (libnvrtc.so, from the CUDA toolkit 12.x or 13.x) could not be loaded; it compiles the GPU kernels".into(),
        )),
    }
}

/// The PTX of all kernels for compute capability `major.minor`, from the disk cache or NVRTC.
fn compiled_ptx(major: i32, minor: i32) -> Result<Ptx> {
    compiled(&SOURCES.concat(), major, minor, &[])
}

/// The PTX of an expression module: the fused kernels with the generated `prelude` (see
/// `kernels/expr.cu`), only the expression kernels instantiated.
fn compiled_expr_ptx(prelude: &str, major: i32, minor: i32) -> Result<Ptx> {
    let src = [COMMON, prelude, TILES, FUSED, EXPR].concat();
    let only = [
        "-DKNN_MODULE_ONLY".to_string(),
        "-DKNN_EXPR_ONLY".to_string(),
    ];
    compiled(&src, major, minor, &only)
}

/// The PTX of the symmetric self-join module: the fused kernels' parts and `kernels/sym.cu`,
/// only the symmetric kernels instantiated.
fn compiled_sym_ptx(major: i32, minor: i32) -> Result<Ptx> {
    let src = [COMMON, TILES, FUSED, SYM].concat();
    compiled(&src, major, minor, &["-DKNN_MODULE_ONLY".to_string()])
}

/// `src` compiled for compute capability `major.minor` with `extra` options, from the disk
/// cache or NVRTC.
fn compiled(src: &str, major: i32, minor: i32, extra: &[String]) -> Result<Ptx> {
    let (vmaj, vmin) = nvrtc_version()?;
    let arch = format!("sm_{major}{minor}");
    let defines = extra.to_vec();
    let key = fnv1a(&[
        src.as_bytes(),
        arch.as_bytes(),
        format!("{vmaj}.{vmin}").as_bytes(),
        defines.concat().as_bytes(),
    ]);
    let file = cache_dir().map(|d| d.join(format!("kernels-{arch}-{key:016x}.ptx")));
    if let Some(f) = &file {
        if let Ok(text) = std::fs::read_to_string(f) {
            if text.contains(".entry") {
                return Ok(Ptx::from_src(text));
            }
        }
    }
    let opts = CompileOptions {
        options: vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".into(),
            "-lineinfo".into(),
        ]
        .into_iter()
        .chain(defines)
        .collect(),
        ..Default::default()
    };
    let ptx = std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(src, opts))
        .map_err(|_| KnnError::Device("NVRTC panicked while compiling the kernels".into()))?
        .map_err(|e| match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => KnnError::Device(format!(
                "NVRTC failed to compile the kernels for {arch}:\n{}",
                log.to_string_lossy()
            )),
            other => KnnError::Device(format!("NVRTC: {other}")),
        })?;
    if let Some(f) = &file {
        // A cache write failure only costs a recompile next time.
        if let Some(dir) = f.parent() {
            let _ = std::fs::create_dir_all(dir);
            let tmp = f.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, ptx.to_src()).is_ok() {
                let _ = std::fs::rename(&tmp, f);
            }
        }
    }
    Ok(ptx)
}

#[cfg(test)]
mod tests;

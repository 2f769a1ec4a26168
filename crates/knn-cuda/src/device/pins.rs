//! Host memory page-locked in place for the copies, the device's memory pool, and direct
//! access between GPUs.

use cudarc::driver::{sys, CudaContext};
use std::sync::Arc;

/// Host ranges page-locked in place (`cuMemHostRegister`, portable: locked for every context),
/// as (address, bytes): one list for the process ([`HostPins::shared`]), shared by the engines,
/// which add and remove them without holding a device, and the copies of every GPU, which go
/// straight into them (several GPUs finishing the rows of one output). Copies are correct
/// whether or not a range is locked (the driver stages pageable memory itself); locking only
/// makes them run at the bus's speed.
#[derive(Default)]
pub(crate) struct HostPins(std::sync::Mutex<Vec<(usize, usize)>>);

impl HostPins {
    /// The process's list.
    pub fn shared() -> Arc<HostPins> {
        static PINS: std::sync::OnceLock<Arc<HostPins>> = std::sync::OnceLock::new();
        PINS.get_or_init(Arc::default).clone()
    }

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
            if len == 0 {
                return None; // (the guard unlocks those locked so far)
            }
            // SAFETY: the range is live memory of the caller's, which the guard unlocks when
            // dropped, before the caller frees or returns it (this function's contract).
            let r = unsafe {
                sys::cuMemHostRegister_v2(p.cast(), len, sys::CU_MEMHOSTREGISTER_PORTABLE)
            };
            if r != sys::CUresult::CUDA_SUCCESS {
                return None;
            }
            guard.ranges.push((p as usize, len));
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((p as usize, len));
        }
        Some(guard)
    }

    /// Notes `bytes` bytes at `at`, allocated page-locked, as locked (until [`HostPins::forget`]).
    pub fn note(&self, at: usize, bytes: usize) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((at, bytes));
    }

    /// Forgets a range noted by [`HostPins::note`] (before its memory is freed).
    pub fn forget(&self, at: usize, bytes: usize) {
        let mut locked = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = locked.iter().position(|&r| r == (at, bytes)) {
            locked.swap_remove(i);
        }
    }

    /// Whether `bytes` lie inside one locked range.
    pub fn contains(&self, bytes: &[u8]) -> bool {
        self.covers(bytes.as_ptr() as usize, bytes.len())
    }

    /// Whether the `len` bytes at address `p` lie inside one locked range.
    pub fn covers(&self, p: usize, len: usize) -> bool {
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
                unsafe { sys::cuMemHostUnregister(key.0 as *mut std::ffi::c_void) };
            }
        }
    }
}

/// Makes the device's stream-ordered allocator keep freed memory across synchronisations (by
/// default it returns it to the driver at each one, and the next call's allocations map it
/// again: several per fused call, for buffers of up to hundreds of MB). Returns the pool.
pub(super) fn keep_pool_memory(ctx: &CudaContext) -> Option<usize> {
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

/// Lets every GPU of `gpus` (its context, and its stream-ordered pool's handle when known)
/// read and write the others' memory directly, where the devices can (NVLink, PCIe peer to
/// peer): peer access between the contexts, and to each pool's allocations, which the
/// context's peer access does not cover (the engines allocate from the pools). Copies between
/// GPUs are correct either way; without it the driver stages them (2 H200s over NV18, 64 MB
/// between pool allocations: 1.8 ms staged, 0.18 ms direct; bench/gpu/pin_skew.py).
pub(crate) fn link_peers(gpus: &[(Arc<CudaContext>, Option<usize>)]) {
    for (i, (ctx, _)) in gpus.iter().enumerate() {
        for (peer, pool) in gpus
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, g)| g)
        {
            let mut can = 0;
            // SAFETY: both devices come from live contexts; `can` is a live int.
            let r =
                unsafe { sys::cuDeviceCanAccessPeer(&mut can, ctx.cu_device(), peer.cu_device()) };
            if r != sys::CUresult::CUDA_SUCCESS || can != 1 || ctx.bind_to_thread().is_err() {
                continue;
            }
            // SAFETY: `ctx` is bound to this thread and `peer` is a live context. Enabled
            // already (another engine of the same GPUs) is as good.
            let _ = unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) };
            if let Some(pool) = pool {
                let access = sys::CUmemAccessDesc {
                    location: sys::CUmemLocation {
                        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                        id: ctx.cu_device(),
                    },
                    flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                };
                // SAFETY: the pool is the peer's live default pool (`keep_pool_memory`), the
                // descriptor a live value.
                let _ = unsafe { sys::cuMemPoolSetAccess(*pool as sys::CUmemoryPool, &access, 1) };
            }
        }
    }
}

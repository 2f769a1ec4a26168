//! Which CUDA devices there are, without opening them for work.

use cudarc::driver::{sys, CudaContext};

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

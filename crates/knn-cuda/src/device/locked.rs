//! Page-locked host blocks an engine keeps for its calls' candidate lists ([`LockedPool`]), and
//! the host buffers made of them or of ordinary memory ([`HostVec`]).
//!
//! A call's lists come down while it holds the device: staged through the copy threads, the
//! 2 × 14.6 MB of a round of a base split among 4 H200s took 3–10 ms of each ~185 ms call,
//! against ~0.3 ms each as DMA into page-locked memory. Locking memory for each call instead
//! (`cuMemHostRegister`) waits for the work of every GPU the lock maps it into: the same
//! search took twice as long. So the blocks are made once and reused.

use super::{dev_err, HostPins};
use cudarc::driver::{CudaContext, DeviceRepr, PinnedHostSlice};
use knn_core::Result;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

/// Largest block the pool makes: a round's lists take at most 64 MiB over the rounds in
/// flight (`CANDIDATE_BYTES_PER_ROUND` of the pipeline, shared by at least two), so one
/// buffer of a round is at most 32 MiB; larger buffers are ordinary memory.
pub(super) const BLOCK_MAX: usize = 32 << 20;
/// Blocks kept between calls: composites and exact keys of three rounds in flight (those of a
/// base split among GPUs).
const KEPT: usize = 6;

/// Page-locked blocks of one device's context, lent to its calls and given back when their
/// [`HostVec`]s are dropped. Each block's range is noted in the process's [`HostPins`], so the
/// device's downloads into it run as DMA.
pub(crate) struct LockedPool {
    ctx: Arc<CudaContext>,
    pins: Arc<HostPins>,
    blocks: Mutex<Vec<Block>>,
}

/// One page-locked block and its address.
pub(crate) struct Block {
    /// Owned for its memory (freed when dropped).
    _mem: PinnedHostSlice<u8>,
    at: usize,
    bytes: usize,
    pins: Arc<HostPins>,
}

impl Drop for Block {
    fn drop(&mut self) {
        // (`_mem` is freed after this, by its own drop.)
        self.pins.forget(self.at, self.bytes);
    }
}

impl LockedPool {
    /// An empty pool of `ctx`'s blocks, noted in `pins`.
    pub(crate) fn new(ctx: Arc<CudaContext>, pins: Arc<HostPins>) -> Arc<Self> {
        Arc::new(LockedPool {
            ctx,
            pins,
            blocks: Mutex::new(Vec::new()),
        })
    }

    /// `len` values of `T` in a page-locked block (a kept one large enough, else a new one),
    /// holding whatever the block held before; `None` when they are larger than a block may
    /// be or the memory was refused.
    pub(crate) fn take<T: DeviceRepr + Copy>(self: &Arc<Self>, len: usize) -> Option<HostVec<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?;
        if bytes == 0 || bytes > BLOCK_MAX {
            return None;
        }
        let kept = {
            let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
            let fit = (blocks.iter().enumerate())
                .filter(|(_, b)| b.bytes >= bytes)
                .min_by_key(|(_, b)| b.bytes)
                .map(|(i, _)| i);
            fit.map(|i| blocks.swap_remove(i))
        };
        let block = match kept {
            Some(b) => b,
            None => self.block(bytes).ok()?,
        };
        Some(HostVec::Locked {
            block: Some(block),
            len,
            pool: self.clone(),
        })
    }

    /// A new block of `bytes`.
    fn block(&self, bytes: usize) -> Result<Block> {
        self.ctx
            .bind_to_thread()
            .map_err(dev_err("binding the context"))?;
        // SAFETY: the block is plain bytes; every value read from it was written by a download
        // or a previous call (any bit pattern is a valid `T` of `HostVec`'s users).
        let mem = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }
            .map_err(dev_err("allocating pinned host memory"))?;
        let at = mem.as_ptr().map_err(dev_err("pinned host memory"))? as usize;
        self.pins.note(at, bytes);
        Ok(Block {
            _mem: mem,
            at,
            bytes,
            pins: self.pins.clone(),
        })
    }

    /// Keeps `block` for later calls (the largest [`KEPT`], the rest freed).
    fn give_back(&self, block: Block) {
        let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        blocks.push(block);
        if blocks.len() > KEPT {
            let smallest = (blocks.iter().enumerate())
                .min_by_key(|(_, b)| b.bytes)
                .map(|(i, _)| i)
                .expect("not empty");
            let freed = blocks.swap_remove(smallest);
            drop(blocks);
            drop(freed);
        }
    }
}

/// A host buffer of `T` (plain numbers): ordinary memory, or a block lent by a
/// [`LockedPool`] (given back when dropped).
pub(crate) enum HostVec<T> {
    Heap(Vec<T>),
    Locked {
        block: Option<Block>,
        len: usize,
        pool: Arc<LockedPool>,
    },
}

impl<T> Default for HostVec<T> {
    fn default() -> Self {
        HostVec::Heap(Vec::new())
    }
}

impl<T: Copy> HostVec<T> {
    /// The values as a `Vec` (copied out of a lent block, which goes back to its pool).
    pub(crate) fn into_vec(mut self) -> Vec<T> {
        match &mut self {
            HostVec::Heap(v) => std::mem::take(v),
            HostVec::Locked { .. } => self.to_vec(),
        }
    }
}

impl<T> Deref for HostVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            HostVec::Heap(v) => v,
            HostVec::Locked { block, len, .. } => {
                let b = block.as_ref().expect("held until dropped");
                // SAFETY: the block holds at least `len` values of `T` (see `take`), page-aligned,
                // and this buffer alone uses it until dropped.
                unsafe { std::slice::from_raw_parts(b.at as *const T, *len) }
            }
        }
    }
}

impl<T> DerefMut for HostVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            HostVec::Heap(v) => v,
            HostVec::Locked { block, len, .. } => {
                let b = block.as_mut().expect("held until dropped");
                // SAFETY: as in `deref`; `&mut self` makes the view unique.
                unsafe { std::slice::from_raw_parts_mut(b.at as *mut T, *len) }
            }
        }
    }
}

impl<T> Drop for HostVec<T> {
    fn drop(&mut self) {
        if let HostVec::Locked { block, pool, .. } = self {
            if let Some(b) = block.take() {
                pool.give_back(b);
            }
        }
    }
}

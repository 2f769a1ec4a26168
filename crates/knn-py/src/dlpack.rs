//! DLPack (<https://dmlc.github.io/dlpack/latest/>) both ways, for arrays of libraries whose
//! GPU arrays are read-only to others (JAX): rows read from a capsule such a library's
//! `__dlpack__` gives, and results made here, in device memory of our own, which the library
//! adopts with its `from_dlpack` (the memory is freed when the last array using it goes).
//! Only the unversioned `"dltensor"` capsule (DLPack 0.x), which JAX makes and takes.

use knn::DeviceMemory;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};
use std::sync::Arc;

/// The capsule's name while no consumer has taken it.
const DLTENSOR: &CStr = c"dltensor";
/// `kDLCUDA`: memory of a CUDA device.
pub const KDL_CUDA: i32 = 2;
/// `kDLInt`, `kDLUInt`, `kDLFloat`: the type codes of [`DLDataType`].
const KDL_INT: u8 = 0;
const KDL_FLOAT: u8 = 2;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    /// Null for a compact row-major tensor.
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// A 2-D array as a DLPack capsule describes it.
#[pyclass(module = "knn._knn", frozen, get_all)]
pub struct CapsuleRows {
    /// Device address of the first value (the data pointer plus the byte offset).
    pub ptr: u64,
    /// Number of rows.
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
    /// `(DLDeviceType, device id)`.
    pub device: (i32, i32),
    /// `"float32"`, `"float64"`, or another type's name as `{kind}{bits}`.
    pub dtype: String,
}

/// The 2-D array a DLPack capsule holds: where, what shape, what type. Refuses capsules that
/// are not 2-D or not compact row-major (the engine reads rows as one block). The address is
/// valid while the capsule lives (an untaken capsule owns its tensor): keep it until done.
pub fn read_capsule(capsule: &Bound<'_, PyAny>, what: &str) -> PyResult<CapsuleRows> {
    // SAFETY: `PyCapsule_GetPointer` checks the object and its name and sets an error when
    // either is wrong; the tensor it points to lives as long as the capsule.
    let managed = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), DLTENSOR.as_ptr()) };
    if managed.is_null() {
        let cause = PyErr::take(capsule.py()).map_or_else(String::new, |e| format!(": {e}"));
        return Err(PyValueError::new_err(format!(
            "{what}: not an unused DLPack capsule (\"dltensor\"){cause}"
        )));
    }
    // SAFETY: a "dltensor" capsule holds a `DLManagedTensor` (the DLPack contract).
    let t = unsafe { &(*(managed as *const DLManagedTensor)).dl_tensor };
    if t.ndim != 2 {
        return Err(PyValueError::new_err(format!(
            "{what}: expected a 2-D array (rows x dimension), got {}-D",
            t.ndim
        )));
    }
    // SAFETY: `shape` (and `strides` when not null) hold `ndim` values.
    let shape = unsafe { std::slice::from_raw_parts(t.shape, 2) };
    let (rows, cols) = (shape[0].max(0) as usize, shape[1].max(0) as usize);
    if !t.strides.is_null() {
        let strides = unsafe { std::slice::from_raw_parts(t.strides, 2) };
        // Row-major and compact; a stride along an axis of length 1 is never used.
        let compact = (rows <= 1 || strides[0] == cols as i64) && (cols <= 1 || strides[1] == 1);
        if !compact {
            return Err(PyValueError::new_err(format!(
                "{what}: the array is not C-contiguous (strides {strides:?}); make a \
                 contiguous copy first"
            )));
        }
    }
    let kind = match t.dtype.code {
        KDL_INT => "int",
        1 => "uint",
        KDL_FLOAT => "float",
        _ => "type",
    };
    let dtype = if t.dtype.lanes == 1 {
        format!("{kind}{}", t.dtype.bits)
    } else {
        format!("{kind}{}x{}", t.dtype.bits, t.dtype.lanes)
    };
    Ok(CapsuleRows {
        ptr: t.data as u64 + t.byte_offset,
        rows,
        cols,
        device: (t.device.device_type, t.device.device_id),
        dtype,
    })
}

/// What a capsule made here points to: the DLPack tensor first (its address is the
/// capsule's pointer and the deleter's argument), then what it refers to.
#[repr(C)]
struct Exported {
    managed: DLManagedTensor,
    shape: [i64; 2],
    _memory: Arc<DeviceMemory>,
}

/// Frees what [`DeviceArray::__dlpack__`] made: called by the consumer when its array goes,
/// or by the capsule's destructor when no one took it. Touches no Python state (a consumer
/// may call it on any thread).
unsafe extern "C" fn delete_exported(managed: *mut DLManagedTensor) {
    if !managed.is_null() {
        // SAFETY: `manager_ctx` is the `Box<Exported>` leaked by `__dlpack__`, freed once.
        drop(unsafe { Box::from_raw((*managed).manager_ctx as *mut Exported) });
    }
}

/// The capsule's destructor: frees the tensor unless a consumer took it (and renamed the
/// capsule "used_dltensor", taking on the call of the deleter).
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: `PyCapsule_IsValid` sets no error; a valid "dltensor" capsule of ours holds
    // an `Exported`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr());
            delete_exported(managed as *mut DLManagedTensor);
        }
    }
}

/// A `rows × cols` array in a GPU's memory, allocated for results and filled by a search,
/// handed to a library through DLPack (`jax.dlpack.from_dlpack(array)`); several consumers
/// may share it, and the memory goes when the last of them (and this object) does. A
/// search's distances and ids are two such arrays in one allocation (see [`DeviceArray::pair`]).
#[pyclass(module = "knn._knn", frozen)]
pub struct DeviceArray {
    memory: Arc<DeviceMemory>,
    /// Bytes from the allocation's start to the first value (a multiple of [`ALIGN`]).
    offset: usize,
    rows: usize,
    cols: usize,
    dtype: DLDataType,
}

/// Alignment of each array in an allocation: XLA adopts only aligned buffers (it copies the
/// others), and the driver's allocations start on 256 bytes.
const ALIGN: usize = 256;

const FLOAT32: DLDataType = DLDataType {
    code: KDL_FLOAT,
    bits: 32,
    lanes: 1,
};

impl DeviceArray {
    /// Bytes of the results of `rows × k` neighbours: float32 distances, then ids (int64 with
    /// `ids_i64`, else int32) from the next multiple of [`ALIGN`].
    pub fn pair_bytes(rows: usize, k: usize, ids_i64: bool) -> Option<usize> {
        let n = rows.checked_mul(k)?;
        let ids_at = n.checked_mul(4)?.checked_next_multiple_of(ALIGN)?;
        ids_at.checked_add(n.checked_mul(if ids_i64 { 8 } else { 4 })?)
    }

    /// `(distances, ids)` of `rows × k` neighbours in `memory` (of [`DeviceArray::pair_bytes`]).
    pub fn pair(
        memory: DeviceMemory,
        rows: usize,
        k: usize,
        ids_i64: bool,
    ) -> (DeviceArray, DeviceArray) {
        debug_assert!(Self::pair_bytes(rows, k, ids_i64).is_some_and(|b| b <= memory.len()));
        let memory = Arc::new(memory);
        let ids_at = (rows * k * 4).next_multiple_of(ALIGN);
        let array = |offset, dtype| DeviceArray {
            memory: memory.clone(),
            offset,
            rows,
            cols: k,
            dtype,
        };
        let ids = DLDataType {
            code: KDL_INT,
            bits: if ids_i64 { 64 } else { 32 },
            lanes: 1,
        };
        (array(0, FLOAT32), array(ids_at, ids))
    }
}

#[pymethods]
impl DeviceArray {
    /// Device address of the first value.
    #[getter]
    fn ptr(&self) -> u64 {
        self.memory.ptr() + self.offset as u64
    }

    /// `(kDLCUDA, device ordinal)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (KDL_CUDA, self.memory.ordinal() as i32)
    }

    /// A DLPack capsule of the array. The package hands this object to a consumer only once
    /// the search that fills it has returned, and a search returns once its values are
    /// written: every stream may read them, so `stream` asks for nothing. `copy=True` is
    /// refused (the consumer copies if it must).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (stream, max_version);
        if dl_device.is_some_and(|d| d != self.__dlpack_device__()) {
            return Err(PyBufferError::new_err(
                "results of knn live on the GPU that computed them; copy them there",
            ));
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "copy=True: this producer does not copy",
            ));
        }
        let exported = Box::new(Exported {
            managed: DLManagedTensor {
                dl_tensor: DLTensor {
                    data: self.ptr() as *mut c_void,
                    device: DLDevice {
                        device_type: KDL_CUDA,
                        device_id: self.memory.ordinal() as i32,
                    },
                    ndim: 2,
                    dtype: self.dtype,
                    shape: std::ptr::null_mut(),
                    strides: std::ptr::null_mut(),
                    byte_offset: 0,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_exported),
            },
            shape: [self.rows as i64, self.cols as i64],
            _memory: self.memory.clone(),
        });
        let raw = Box::into_raw(exported);
        // SAFETY: `raw` is a live, leaked box; its first field is the `DLManagedTensor`, whose
        // shape and context point into the box itself (set through `raw`, after the move).
        unsafe {
            (*raw).managed.dl_tensor.shape = std::ptr::addr_of_mut!((*raw).shape).cast();
            (*raw).managed.manager_ctx = raw as *mut c_void;
            let capsule = ffi::PyCapsule_New(
                raw as *mut c_void,
                DLTENSOR.as_ptr(),
                Some(capsule_destructor),
            );
            if capsule.is_null() {
                delete_exported(raw as *mut DLManagedTensor);
            }
            Bound::from_owned_ptr_or_err(py, capsule)
        }
    }
}

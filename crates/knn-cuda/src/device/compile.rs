//! The kernel sources, their NVRTC compilation (the device's machine code, cached on disk under
//! the source's hash) and the loaded modules' kernels by name.

use super::dev_err;
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use knn_core::{KnnError, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

pub(super) const COMMON: &str = include_str!("../../kernels/common.cuh");
/// The fused method's key tiles, and its lists and entry points (one program, in this order).
const TILES: &str = include_str!("../../kernels/tiles.cu");
const FUSED: &str = include_str!("../../kernels/fused.cu");
/// The few-queries kernels (after the fused ones, whose list primitives they use).
const FEW: &str = include_str!("../../kernels/few.cu");
/// The expression kernels, compiled per program (see [`Gpu::expr_kernels`]).
pub(super) const EXPR: &str = include_str!("../../kernels/expr.cu");
/// The symmetric self-join kernels, a module of their own loaded on first use (see
/// [`Gpu::sym_kernels`]).
pub(super) const SYM: &str = include_str!("../../kernels/sym.cu");

/// The kernel sources, concatenated in this order into one NVRTC program.
pub(super) const SOURCES: [&str; 7] = [
    COMMON,
    TILES,
    FUSED,
    FEW,
    include_str!("../../kernels/select.cu"),
    include_str!("../../kernels/baseline.cu"),
    include_str!("../../kernels/grid.cu"),
];

/// (name in the module, name callers use) of a module's kernels.
pub(super) type Names = Vec<(String, String)>;

/// A loaded kernel, shared by every engine of the process on its device (see [`loaded`]).
pub(crate) struct LoadedKernel {
    pub(crate) f: CudaFunction,
    /// The dynamic shared memory the kernel is allowed, only ever raised (see
    /// `LoadedKernel::with_smem`): engines on one device share the function, so one lowering it
    /// would break another's launch.
    pub(super) smem: Mutex<usize>,
    /// Blocks of 256 threads that fit on one SM, by dynamic shared memory (see
    /// `Gpu::blocks_per_sm`): asked of the driver once per size.
    pub(super) occupancy: Mutex<Vec<(usize, usize)>>,
}

impl LoadedKernel {
    /// The kernel, allowed at least `smem` bytes of dynamic shared memory: the driver is told
    /// once per larger size (a call of several µs, on the path of every small search).
    pub(crate) fn with_smem(&self, smem: usize) -> Result<&CudaFunction> {
        let mut allowed = self.smem.lock().unwrap_or_else(|e| e.into_inner());
        if *allowed < smem {
            self.f
                .set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
                .map_err(dev_err("shared memory limit"))?;
            *allowed = smem;
        }
        Ok(&self.f)
    }
}

/// Kernels of one loaded module, by the name callers use.
type Kernels = Arc<HashMap<String, Arc<LoadedKernel>>>;

/// The kernels of module `tag` on device `ordinal`, loaded on first use by any engine of this
/// process and shared from then on (every index built on the device, a Dask worker builds one
/// per base chunk, would otherwise load it again). Contexts are the device's primary one,
/// so the functions are valid in every engine's context; each keeps its module alive.
pub(super) fn loaded(
    ctx: &Arc<CudaContext>,
    ordinal: usize,
    tag: &str,
    compile: impl FnOnce() -> Result<(Vec<u8>, Names)>,
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
    let (image, names) = compile()?;
    let module: Arc<CudaModule> = ctx
        .load_module(Ptx::from_binary(image))
        .map_err(dev_err("loading the kernels"))?;
    let mut kernels = HashMap::new();
    for (name, call) in names {
        let f = module
            .load_function(&name)
            .map_err(dev_err("loading a kernel"))?;
        let kernel = LoadedKernel {
            f,
            smem: Mutex::new(0),
            occupancy: Mutex::default(),
        };
        kernels.insert(call, Arc::new(kernel));
    }
    let kernels = Arc::new(kernels);
    all.insert((ordinal, tag.to_string()), kernels.clone());
    Ok(kernels)
}

/// `extern "C" __global__ void NAME(` and `FUSED(NAME,` / `FEW(NAME,` / `TILE(NAME,` /
/// `DIST(NAME,` / `FILTER(NAME,` entries.
pub(super) fn kernel_names(src: &str) -> Vec<String> {
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

pub(super) fn fnv1a(parts: &[&[u8]]) -> u64 {
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

pub(super) fn nvrtc_version() -> Result<(i32, i32)> {
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

/// The module of all kernels for compute capability `major.minor`, from the disk cache or NVRTC.
pub(super) fn compiled_main(major: i32, minor: i32) -> Result<Vec<u8>> {
    compiled(&SOURCES.concat(), major, minor, &[])
}

/// An expression module: the fused kernels with the generated `prelude` (see
/// `kernels/expr.cu`), only the expression kernels instantiated.
pub(super) fn compiled_expr(prelude: &str, major: i32, minor: i32) -> Result<Vec<u8>> {
    let src = [COMMON, prelude, TILES, FUSED, EXPR].concat();
    let only = [
        "-DKNN_MODULE_ONLY".to_string(),
        "-DKNN_EXPR_ONLY".to_string(),
    ];
    compiled(&src, major, minor, &only)
}

/// The symmetric self-join module: the fused kernels' parts and `kernels/sym.cu`,
/// only the symmetric kernels instantiated.
pub(super) fn compiled_sym(major: i32, minor: i32) -> Result<Vec<u8>> {
    let src = [COMMON, TILES, FUSED, SYM].concat();
    compiled(&src, major, minor, &["-DKNN_MODULE_ONLY".to_string()])
}

/// `src` compiled for compute capability `major.minor` with `extra` options, from the disk
/// cache or NVRTC: the device's machine code (SASS in a CUBIN), which the driver loads as it
/// is. PTX made the driver compile it again at every load: 62 s for all modules in the first
/// process on a fresh 4-H100 machine, hundreds of milliseconds in each later one.
pub(super) fn compiled(src: &str, major: i32, minor: i32, extra: &[String]) -> Result<Vec<u8>> {
    let (vmaj, vmin) = nvrtc_version()?;
    let arch = format!("sm_{major}{minor}");
    let defines = extra.to_vec();
    let key = fnv1a(&[
        src.as_bytes(),
        arch.as_bytes(),
        format!("{vmaj}.{vmin}").as_bytes(),
        defines.concat().as_bytes(),
    ]);
    let file = cache_dir().map(|d| d.join(format!("kernels-{arch}-{key:016x}.cubin")));
    if let Some(f) = &file {
        if let Ok(image) = std::fs::read(f) {
            // An ELF image (a file cut short by a full disk is compiled again).
            if image.len() > 64 && image.starts_with(b"\x7fELF") {
                return Ok(image);
            }
        }
    }
    let options: Vec<String> = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "-lineinfo".into(),
    ]
    .into_iter()
    .chain(defines)
    .collect();
    let image = std::panic::catch_unwind(|| nvrtc_cubin(src, &options))
        .map_err(|_| KnnError::Device("NVRTC panicked while compiling the kernels".into()))?
        .map_err(|log| {
            KnnError::Device(format!(
                "NVRTC failed to compile the kernels for {arch}:\n{log}"
            ))
        })?;
    if let Some(f) = &file {
        // A cache write failure only costs a recompile next time.
        if let Some(dir) = f.parent() {
            let _ = std::fs::create_dir_all(dir);
            let tmp = f.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, &image).is_ok() {
                let _ = std::fs::rename(&tmp, f);
            }
        }
    }
    Ok(image)
}

/// `src` compiled by NVRTC with `options` (a real `--gpu-architecture=sm_XY`) to a CUBIN image;
/// the compiler's log on failure.
fn nvrtc_cubin(src: &str, options: &[String]) -> std::result::Result<Vec<u8>, String> {
    use cudarc::nvrtc::{result, sys};
    let code = std::ffi::CString::new(src).map_err(|_| "a NUL byte in the source".to_string())?;
    let prog = result::create_program(&code, None).map_err(|e| format!("NVRTC: {e:?}"))?;
    // SAFETY: `prog` is a live program until destroyed below; the buffers are sized by NVRTC.
    let out = unsafe {
        match result::compile_program(prog, options) {
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| {
                        std::ffi::CStr::from_ptr(l.as_ptr())
                            .to_string_lossy()
                            .into_owned()
                    })
                    .unwrap_or_default();
                Err(format!("{e:?}\n{log}"))
            }
            Ok(()) => {
                let mut size = 0usize;
                if sys::nvrtcGetCUBINSize(prog, &mut size) != sys::nvrtcResult::NVRTC_SUCCESS
                    || size == 0
                {
                    Err("NVRTC made no CUBIN (the architecture must be a real sm_XY)".into())
                } else {
                    let mut image = vec![0u8; size];
                    match sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast()) {
                        sys::nvrtcResult::NVRTC_SUCCESS => Ok(image),
                        e => Err(format!("NVRTC: getting the CUBIN: {e:?}")),
                    }
                }
            }
        }
    };
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

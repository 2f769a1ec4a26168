//! Writing files safely. A new or regular file is written into a temporary file next to it and
//! renamed over it only once everything was written and synced, so a failure never leaves a
//! half-written output and never destroys an existing file; behind a symbolic link, the file
//! the link leads to is replaced and the link kept. A device, pipe or socket (`/dev/stdout`, a
//! terminal, a FIFO), or a file reached through a process's open descriptors (`/dev/fd/N`,
//! `/proc/self/fd/N`, which is what `/dev/stdout` is), is written through in place.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{csv_text, npy, vecs, Format, IoError, Table};

/// Buffer size of the writer, and bytes encoded before each `write` call.
const WRITE_BUFFER_BYTES: usize = 1 << 20;

/// Symbolic links followed when looking for an open-descriptor path, as the system does.
const MAX_LINKS: usize = 40;

/// Distinguishes temporary files of concurrent writes from one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// What writing to a path does to what is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputTarget {
    /// Nothing is there yet (the folder exists): a new file is created.
    New,
    /// A regular file is there, at the path given (`PathBuf`) once symbolic links are
    /// followed: writing replaces that file (links to it stay links).
    Replace(PathBuf),
    /// A device, pipe, socket or an open descriptor of this process (`/dev/stdout`,
    /// `/dev/fd/N`): written through in place, nothing is replaced.
    Stream,
}

/// Whether `path` itself is a symbolic link.
fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Whether `path`, or a symbolic link on the way from it, is an open descriptor of the process
/// (`/dev/fd/N`, `/proc/self/fd/N`, `/proc/PID/fd/N`): what is written there goes to whatever
/// the descriptor holds (a redirection of the shell), which must not be replaced.
fn through_descriptor(path: &Path) -> bool {
    let mut at = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        let dir = at.parent().map(Path::to_path_buf).unwrap_or_default();
        if dir.ends_with("fd") && (dir.starts_with("/proc") || dir.starts_with("/dev")) {
            return true;
        }
        match std::fs::read_link(&at) {
            Ok(next) => at = dir.join(next),
            Err(_) => return false,
        }
    }
    false
}

/// The folder a new file at `path` goes into.
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// What writing to `path` would do, or why it cannot: `path` is a folder, a symbolic link to
/// nothing, or in a folder that does not exist. Nothing is changed.
pub fn output_target(path: &Path) -> Result<OutputTarget, IoError> {
    let name = path.display().to_string();
    if path.as_os_str().is_empty() {
        return Err(IoError::invalid(&name, "an output needs a file name"));
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(IoError::invalid(
            &name,
            format!(
                "is a folder; name a file in it (e.g. {})",
                path.join("nn.npy").display()
            ),
        )),
        Ok(_) if through_descriptor(path) => Ok(OutputTarget::Stream),
        Ok(m) if m.is_file() => {
            let real = if is_symlink(path) {
                std::fs::canonicalize(path).map_err(|e| IoError::io(&name, e))?
            } else {
                path.to_path_buf()
            };
            Ok(OutputTarget::Replace(real))
        }
        Ok(_) => Ok(OutputTarget::Stream),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if is_symlink(path) {
                let to = std::fs::read_link(path).unwrap_or_default();
                return Err(IoError::invalid(
                    &name,
                    format!(
                        "is a symbolic link to {}, which does not exist; name the file itself, \
                         or remove the link",
                        to.display()
                    ),
                ));
            }
            let dir = folder_of(path);
            match std::fs::metadata(dir) {
                Ok(d) if d.is_dir() => Ok(OutputTarget::New),
                Ok(_) => Err(IoError::invalid(
                    &name,
                    format!("{} is not a folder", dir.display()),
                )),
                Err(_) => Err(IoError::invalid(
                    &name,
                    format!(
                        "the folder {} does not exist (create it first, e.g. mkdir -p {})",
                        dir.display(),
                        dir.display()
                    ),
                )),
            }
        }
        Err(e) => Err(IoError::io(&name, e)),
    }
}

/// Removes the temporary file unless the write was committed.
struct TempFile {
    path: PathBuf,
    committed: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: the file may already be gone.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Creates a fresh temporary file in the directory of `path`.
fn create_temp(path: &Path, name: &str) -> Result<(File, TempFile), IoError> {
    let file_name = path
        .file_name()
        .ok_or_else(|| IoError::invalid(name, "the output path does not name a file".to_owned()))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut last_error = None;
    for _ in 0..16 {
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(file_name);
        temp_name.push(format!(
            ".{}.{}.tmp",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let temp_path = dir.join(temp_name);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp_path)
        {
            Ok(f) => {
                return Ok((
                    f,
                    TempFile {
                        path: temp_path,
                        committed: false,
                    },
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last_error = Some(e),
            Err(e) => {
                return Err(IoError::io(
                    name,
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot create a temporary file in {}: {e}", dir.display()),
                    ),
                ));
            }
        }
    }
    Err(IoError::io(
        name,
        last_error.unwrap_or_else(|| std::io::Error::other("no temporary file name was free")),
    ))
}

/// Writes `path` through `body`: a new or regular file atomically (it appears complete or not
/// at all; behind symbolic links, the file they lead to is replaced), a device, pipe or open
/// descriptor in place (see [`output_target`]).
pub(crate) fn write_atomically(
    path: &Path,
    name: &str,
    body: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), IoError> {
    let io = |e| IoError::io(name, e);
    let real = match output_target(path)? {
        OutputTarget::Stream => {
            let file = OpenOptions::new().write(true).open(path).map_err(io)?;
            let mut w = BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);
            body(&mut w).map_err(io)?;
            return w.flush().map_err(io);
        }
        OutputTarget::Replace(real) => real,
        OutputTarget::New => path.to_path_buf(),
    };
    let (file, mut temp) = create_temp(&real, name)?;
    let mut w = BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);
    body(&mut w).map_err(io)?;
    let file = w.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&temp.path, &real).map_err(io)?;
    temp.committed = true;
    Ok(())
}

/// Writes `bytes` to `path` as the table writers write files: a new or regular file
/// atomically, a device, pipe or open descriptor through (see [`output_target`]).
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<(), IoError> {
    let name = path.display().to_string();
    write_atomically(path, &name, |w| w.write_all(bytes))
}

/// Checks that `t` can be written as `f32` values in `format`.
pub(crate) fn check_f32(t: &Table<f32>, format: Format, name: &str) -> Result<(), IoError> {
    crate::check_consistent(t, name)?;
    match format {
        Format::Fvecs => vecs::check_writable(t, format, name),
        Format::Ivecs | Format::Bvecs => Err(IoError::invalid(
            name,
            format!("format {format} cannot hold f32 values"),
        )),
        Format::Npy => Ok(()),
        Format::Csv => crate::check_csv_writable(t, name),
    }
}

/// Encodes `t` (checked by [`check_f32`]) as `format` into `w`.
pub(crate) fn encode_f32(
    w: &mut impl Write,
    t: &Table<f32>,
    format: Format,
) -> std::io::Result<()> {
    match format {
        Format::Fvecs => vecs::write(w, t, f32::to_le_bytes),
        Format::Npy => npy::write_f32(w, t),
        Format::Csv => csv_text::write_f32(w, t),
        Format::Ivecs | Format::Bvecs => unreachable!("refused by check_f32"),
    }
}

/// Checks that `t` can be written as `f64` values in `format`: npy (`<f8`) and CSV only (the
/// record formats hold no `f64`).
pub(crate) fn check_f64(t: &Table<f64>, format: Format, name: &str) -> Result<(), IoError> {
    crate::check_consistent(t, name)?;
    match format {
        Format::Fvecs | Format::Ivecs | Format::Bvecs => Err(IoError::invalid(
            name,
            format!("format {format} cannot hold f64 values (npy and csv can)"),
        )),
        Format::Npy => Ok(()),
        Format::Csv => crate::check_csv_writable(t, name),
    }
}

/// Encodes `t` (checked by [`check_f64`]) as `format` into `w`.
pub(crate) fn encode_f64(
    w: &mut impl Write,
    t: &Table<f64>,
    format: Format,
) -> std::io::Result<()> {
    match format {
        Format::Npy => npy::write_f64(w, t),
        Format::Csv => csv_text::write_f64(w, t),
        Format::Fvecs | Format::Ivecs | Format::Bvecs => unreachable!("refused by check_f64"),
    }
}

/// Checks that `t` can be written as integers in `format` (ivecs: every value in `i32`).
pub(crate) fn check_i64(t: &Table<i64>, format: Format, name: &str) -> Result<(), IoError> {
    crate::check_consistent(t, name)?;
    match format {
        Format::Ivecs => {
            vecs::check_writable(t, format, name)?;
            match t.data.iter().position(|&v| i32::try_from(v).is_err()) {
                Some(k) => Err(IoError::invalid(
                    name,
                    format!(
                        "row {}, column {}: value {} does not fit in i32 (format ivecs)",
                        k / t.cols,
                        k % t.cols,
                        t.data[k]
                    ),
                )),
                None => Ok(()),
            }
        }
        Format::Fvecs | Format::Bvecs => Err(IoError::invalid(
            name,
            format!("format {format} cannot hold i64 values"),
        )),
        Format::Npy => Ok(()),
        Format::Csv => crate::check_csv_writable(t, name),
    }
}

/// Encodes `t` (checked by [`check_i64`]) as `format` into `w`.
pub(crate) fn encode_i64(
    w: &mut impl Write,
    t: &Table<i64>,
    format: Format,
) -> std::io::Result<()> {
    match format {
        Format::Ivecs => vecs::write(w, t, |v| (v as i32).to_le_bytes()),
        Format::Npy => npy::write_i64(w, t),
        Format::Csv => csv_text::write_i64(w, t),
        Format::Fvecs | Format::Bvecs => unreachable!("refused by check_i64"),
    }
}

/// Writes `t` as `f32` rows in `format` into `w` (standard output, a buffer): the bytes
/// [`write_f32`](crate::write_f32) puts in a file. `name_for_errors` starts every error.
pub fn write_f32_to(
    w: &mut impl Write,
    format: Format,
    t: &Table<f32>,
    name_for_errors: &str,
) -> Result<(), IoError> {
    check_f32(t, format, name_for_errors)?;
    let mut w = BufWriter::with_capacity(WRITE_BUFFER_BYTES, w);
    encode_f32(&mut w, t, format)
        .and_then(|()| w.flush())
        .map_err(|e| IoError::io(name_for_errors, e))
}

/// Writes `t` as `f64` rows in `format` (npy or CSV) into `w`: the bytes
/// [`write_f64`](crate::write_f64) puts in a file. `name_for_errors` starts every error.
pub fn write_f64_to(
    w: &mut impl Write,
    format: Format,
    t: &Table<f64>,
    name_for_errors: &str,
) -> Result<(), IoError> {
    check_f64(t, format, name_for_errors)?;
    let mut w = BufWriter::with_capacity(WRITE_BUFFER_BYTES, w);
    encode_f64(&mut w, t, format)
        .and_then(|()| w.flush())
        .map_err(|e| IoError::io(name_for_errors, e))
}

/// Writes `t` as integer rows in `format` into `w`: the bytes [`write_i64`](crate::write_i64)
/// puts in a file. `name_for_errors` starts every error.
pub fn write_i64_to(
    w: &mut impl Write,
    format: Format,
    t: &Table<i64>,
    name_for_errors: &str,
) -> Result<(), IoError> {
    check_i64(t, format, name_for_errors)?;
    let mut w = BufWriter::with_capacity(WRITE_BUFFER_BYTES, w);
    encode_i64(&mut w, t, format)
        .and_then(|()| w.flush())
        .map_err(|e| IoError::io(name_for_errors, e))
}

/// Writes every value of `values` as the bytes `encode` gives, in bulk.
pub(crate) fn write_encoded<T: Copy, const N: usize>(
    w: &mut impl Write,
    values: &[T],
    encode: impl Fn(T) -> [u8; N],
) -> std::io::Result<()> {
    let per_chunk = (WRITE_BUFFER_BYTES / N).max(1);
    let mut buf = Vec::with_capacity(per_chunk * N);
    for chunk in values.chunks(per_chunk) {
        buf.clear();
        for &v in chunk {
            buf.extend_from_slice(&encode(v));
        }
        w.write_all(&buf)?;
    }
    Ok(())
}

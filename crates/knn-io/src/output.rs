//! Writing files safely: into a temporary file next to the target, renamed over it only once
//! everything was written and synced, so a failure never leaves a half-written output and
//! never destroys an existing file.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::IoError;

/// Buffer size of the writer, and bytes encoded before each `write` call.
const WRITE_BUFFER_BYTES: usize = 1 << 20;

/// Distinguishes temporary files of concurrent writes from one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

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
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last_error = Some(e),
            Err(e) => {
                return Err(IoError::io(
                    name,
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot create a temporary file in {}: {e}", dir.display()),
                    ),
                ))
            }
        }
    }
    Err(IoError::io(
        name,
        last_error.unwrap_or_else(|| std::io::Error::other("no temporary file name was free")),
    ))
}

/// Writes `path` through `body`, atomically: the output appears complete or not at all.
pub(crate) fn write_atomically(
    path: &Path,
    name: &str,
    body: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), IoError> {
    let (file, mut temp) = create_temp(path, name)?;
    let io = |e| IoError::io(name, e);
    let mut w = BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);
    body(&mut w).map_err(io)?;
    let file = w.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&temp.path, path).map_err(io)?;
    temp.committed = true;
    Ok(())
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

//! Opening input files: as a buffered stream of known length (binary formats), or as all of
//! their bytes (text, and anything that is not a regular file).

use std::fs::{File, Metadata};
use std::io::{BufReader, Read};
use std::path::Path;

use memmap2::Mmap;

use crate::IoError;

/// Opens `path` for reading, with its metadata; a directory is refused.
fn open_file(path: &Path, name: &str) -> Result<(File, Metadata), IoError> {
    let io = |e| IoError::io(name, e);
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if meta.is_dir() {
        return Err(IoError::invalid(name, "is a directory, not a file"));
    }
    Ok((file, meta))
}

/// Everything left to read in `file` (pipes, devices, files the system refuses to map).
fn read_all(mut file: File, name: &str) -> Result<Vec<u8>, IoError> {
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| IoError::io(name, e))?;
    Ok(bytes)
}

/// The whole contents of an input file.
pub(crate) enum FileBytes {
    Mapped(Mmap),
    Read(Vec<u8>),
}

impl FileBytes {
    /// Maps `path` (regular, non-empty files), or reads it through (pipes, devices, and any
    /// file the system refuses to map).
    pub(crate) fn open(path: &Path, name: &str) -> Result<FileBytes, IoError> {
        let (file, meta) = open_file(path, name)?;
        if meta.is_file() && meta.len() > 0 {
            // SAFETY: the map is only read, and lives no longer than this `FileBytes`. Like every
            // memory-mapped reader, we rely on no other process truncating or rewriting the file
            // while it is being read; our own writers never do (they replace files by rename).
            if let Ok(map) = unsafe { Mmap::map(&file) } {
                return Ok(FileBytes::Mapped(map));
            }
        }
        read_all(file, name).map(FileBytes::Read)
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(m) => m,
            FileBytes::Read(v) => v,
        }
    }
}

/// Read-ahead of the stream readers: large enough that per-call costs vanish, small next to
/// any output worth streaming.
const STREAM_BUFFER_BYTES: usize = 1 << 20;

/// An input file opened for the binary readers.
pub(crate) enum Input {
    /// A regular file, read as a stream; `len` is its size when opened.
    File { reader: BufReader<File>, len: usize },
    /// Everything else (pipes, devices): its whole contents.
    Bytes(Vec<u8>),
}

impl Input {
    pub(crate) fn open(path: &Path, name: &str) -> Result<Input, IoError> {
        let (file, meta) = open_file(path, name)?;
        if meta.is_file() {
            if let Ok(len) = usize::try_from(meta.len()) {
                let reader = BufReader::with_capacity(STREAM_BUFFER_BYTES, file);
                return Ok(Input::File { reader, len });
            }
        }
        read_all(file, name).map(Input::Bytes)
    }
}

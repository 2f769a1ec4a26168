//! Getting a file's bytes: memory-mapped when it is a regular file, read otherwise.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use memmap2::Mmap;

use crate::IoError;

/// The whole contents of an input file.
pub(crate) enum FileBytes {
    Mapped(Mmap),
    Read(Vec<u8>),
}

impl FileBytes {
    /// Maps `path` (regular, non-empty files), or reads it through (pipes, devices, and any
    /// file the system refuses to map).
    pub(crate) fn open(path: &Path, name: &str) -> Result<FileBytes, IoError> {
        let io = |e| IoError::io(name, e);
        let mut file = File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if meta.is_dir() {
            return Err(IoError::invalid(name, "is a directory, not a file"));
        }
        if meta.is_file() && meta.len() > 0 {
            // SAFETY: the map is only read, and lives no longer than this `FileBytes`. Like every
            // memory-mapped reader, we rely on no other process truncating or rewriting the file
            // while it is being read; our own writers never do (they replace files by rename).
            if let Ok(map) = unsafe { Mmap::map(&file) } {
                return Ok(FileBytes::Mapped(map));
            }
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        Ok(FileBytes::Read(bytes))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(m) => m,
            FileBytes::Read(v) => v,
        }
    }
}

//! How many dimensions an array file has: an npy file says (1-D or 2-D); the other formats
//! always hold rows of values.

use std::io::BufReader;
use std::path::Path;

use crate::{npy, resolve, Format, IoError};

/// The number of dimensions of the array in `path` when its format records it (npy: `Some(1)`
/// for a 1-D array, `Some(2)` for a 2-D one), `None` for formats that always hold rows
/// (fvecs, ivecs, bvecs, CSV), for anything that is not a regular file, and for an npy file
/// whose header is broken (the readers then say what is wrong with it).
pub fn array_dims(path: &Path, format: Option<Format>) -> Result<Option<usize>, IoError> {
    if resolve(path, format)? != Format::Npy {
        return Ok(None);
    }
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| IoError::io(&name, e))?;
    let meta = file.metadata().map_err(|e| IoError::io(&name, e))?;
    let Ok(len) = usize::try_from(meta.len()) else {
        return Ok(None);
    };
    if !meta.is_file() {
        return Ok(None);
    }
    let layout = npy::layout(&mut BufReader::new(file), len, &name);
    Ok(layout.ok().map(|l| if l.one_d { 1 } else { 2 }))
}

/// [`array_dims`] for the bytes of a file held in memory, in `format`.
pub fn array_dims_from_bytes(bytes: &[u8], format: Format, name_for_errors: &str) -> Option<usize> {
    if format != Format::Npy {
        return None;
    }
    let layout = npy::layout(&mut &bytes[..], bytes.len(), name_for_errors);
    layout.ok().map(|l| if l.one_d { 1 } else { 2 })
}

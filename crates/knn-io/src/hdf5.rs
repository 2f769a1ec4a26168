//! HDF5 files, read with the pure-Rust `hdf5-reader` crate (no libhdf5 to install).
//!
//! The layout of ann-benchmarks is the one in mind: datasets `train` (base points), `test`
//! (queries), `neighbors` (true ids, int32 or int64) and `distances`, and a file attribute
//! `distance` (`euclidean`, `angular`, ...). Any dataset can be named: `FILE.hdf5:NAME`, with
//! `NAME` a path inside the file (`group/data`). Datasets of 1 or 2 dimensions and of any
//! integer or floating-point type are read, contiguous, compact or chunked, compressed with
//! deflate or shuffled; values follow the crate's conversion rules (see the crate docs).

use std::path::{Path, PathBuf};

use hdf5_reader::{ByteOrder, Datatype, Hdf5File, OpenOptions};

use crate::dtype::{read_elements, DType, Element, ReadError, Scalar};
use crate::{IoError, Table};

/// File name extensions read as HDF5 (any case).
pub const EXTENSIONS: [&str; 3] = ["hdf5", "h5", "he5"];

/// The first bytes of every HDF5 file (at offset 0 unless a user block comes first).
const SIGNATURE: &[u8; 8] = b"\x89HDF\r\n\x1a\n";

/// Deflate expands by at most 1032 times, so no dataset of a file holds more than about this
/// many times the file's bytes; a header claiming more is malformed and is refused before
/// anything is allocated for it. A dataset never written (its fill value only) is caught too.
const MAX_EXPANSION: u64 = 1100;

/// An HDF5 input as a command line names it: the file, and the dataset after `:` if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hdf5Path {
    /// The HDF5 file.
    pub file: PathBuf,
    /// The dataset named after the file (`data.hdf5:test`), if one is.
    pub dataset: Option<String>,
}

fn has_hdf5_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

/// Whether the file at `path` starts with the HDF5 signature.
fn has_signature(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| &head == SIGNATURE)
}

/// Whether the file at `path` is an HDF5 file: its name ends in `.hdf5`, `.h5` or `.he5`, or,
/// for other names, its first bytes are the HDF5 signature.
pub fn is_hdf5(path: &Path) -> bool {
    has_hdf5_extension(path) || (crate::Format::from_path(path).is_err() && has_signature(path))
}

/// Reads `path` as an HDF5 input: `FILE.hdf5` (or any HDF5 file, see [`is_hdf5`]) or
/// `FILE.hdf5:NAME` when no file is called that. `None` for every other path.
pub fn parse(path: &Path) -> Option<Hdf5Path> {
    if path.is_file() || !path.exists() && has_hdf5_extension(path) {
        return is_hdf5(path).then(|| Hdf5Path {
            file: path.to_path_buf(),
            dataset: None,
        });
    }
    let text = path.to_str()?;
    let (file, dataset) = text.rsplit_once(':')?;
    let file = Path::new(file);
    (!dataset.is_empty() && (has_hdf5_extension(file) || file.is_file() && is_hdf5(file))).then(
        || Hdf5Path {
            file: file.to_path_buf(),
            dataset: Some(dataset.to_owned()),
        },
    )
}

/// An open HDF5 file and the name its errors start with.
struct Opened {
    file: Hdf5File,
    name: String,
}

impl Opened {
    fn invalid(&self, message: impl Into<String>) -> IoError {
        IoError::invalid(&self.name, message)
    }

    /// The datasets and groups at the file's top level, for messages.
    fn listing(&self) -> String {
        match self.file.root_group().and_then(|g| g.member_names()) {
            Ok((groups, datasets)) if !groups.is_empty() || !datasets.is_empty() => {
                let mut all = datasets;
                all.extend(groups.into_iter().map(|g| format!("{g}/")));
                all.join(", ")
            }
            Ok(_) => "nothing".to_owned(),
            Err(_) => "(unreadable)".to_owned(),
        }
    }

    /// The dataset `wanted`, or the only one at the top level when `None`.
    fn dataset(&self, wanted: Option<&str>) -> Result<hdf5_reader::Dataset, IoError> {
        let Some(wanted) = wanted else {
            let only = self
                .file
                .root_group()
                .and_then(|g| g.member_names())
                .ok()
                .and_then(|(_, datasets)| <[String; 1]>::try_from(datasets).ok());
            return match only {
                Some([name]) => self.dataset(Some(&name)),
                None => Err(self.invalid(format!(
                    "which dataset? The file holds {}; name one as {}:NAME",
                    self.listing(),
                    self.name
                ))),
            };
        };
        self.file.dataset(wanted).map_err(|e| match root_cause(&e) {
            hdf5_reader::error::Error::DatasetNotFound(_)
            | hdf5_reader::error::Error::GroupNotFound(_) => self.invalid(format!(
                "no dataset '{wanted}' (the file holds {}; name one as {}:NAME)",
                self.listing(),
                self.name
            )),
            _ => self.invalid(format!("dataset '{wanted}': {e}")),
        })
    }
}

/// The error under the object paths `hdf5-reader` wraps around it.
fn root_cause(e: &hdf5_reader::error::Error) -> &hdf5_reader::error::Error {
    match e {
        hdf5_reader::error::Error::Context { source, .. } => root_cause(source),
        e => e,
    }
}

/// Reader limits from the file's size: nothing a damaged header claims can make a read
/// allocate more than the file could hold (see [`MAX_EXPANSION`]).
fn options(file_len: u64) -> OpenOptions {
    let limit = read_limit(file_len);
    let mut options = OpenOptions::default()
        .with_max_read_bytes(limit)
        .with_max_chunk_bytes(limit.min(hdf5_reader::DEFAULT_MAX_CHUNK_BYTES));
    // No object header is larger than the file.
    options.max_object_header_bytes = options
        .max_object_header_bytes
        .min(usize::try_from(file_len).unwrap_or(usize::MAX).max(1 << 12));
    options
}

fn open(path: &Path, file_len: u64) -> Result<Opened, IoError> {
    let name = path.display().to_string();
    let options = options(file_len);
    let file = match std::fs::metadata(path) {
        Err(e) => return Err(IoError::io(&name, e)),
        Ok(m) if m.is_dir() => return Err(IoError::invalid(&name, "is a directory, not a file")),
        Ok(_) => Hdf5File::open_with_options(path, options),
    };
    let file = file.map_err(|e| unreadable(&name, e))?;
    Ok(Opened { file, name })
}

fn open_bytes(bytes: &[u8], name: &str) -> Result<Opened, IoError> {
    let file = Hdf5File::from_bytes_with_options(bytes, options(bytes.len() as u64))
        .map_err(|e| unreadable(name, e))?;
    Ok(Opened {
        file,
        name: name.to_owned(),
    })
}

fn read_limit(file_len: u64) -> usize {
    usize::try_from(file_len.saturating_mul(MAX_EXPANSION).max(1 << 20)).unwrap_or(usize::MAX)
}

fn unreadable(name: &str, e: hdf5_reader::error::Error) -> IoError {
    match e {
        hdf5_reader::error::Error::Io(e) => IoError::io(name, e),
        hdf5_reader::error::Error::Context { source, .. } => unreadable(name, *source),
        hdf5_reader::error::Error::InvalidMagic => IoError::invalid(
            name,
            "not an HDF5 file (its first bytes are not the HDF5 signature)",
        ),
        e => IoError::invalid(name, format!("not a readable HDF5 file: {e}")),
    }
}

/// Our element type for an HDF5 numeric datatype; `None` for strings, compounds and others.
fn scalar_type(t: &Datatype) -> Option<DType> {
    let (scalar, order) = match *t {
        Datatype::FixedPoint {
            size,
            signed,
            byte_order,
        } => {
            let scalar = match (size, signed) {
                (1, true) => Scalar::I8,
                (2, true) => Scalar::I16,
                (4, true) => Scalar::I32,
                (8, true) => Scalar::I64,
                (1, false) => Scalar::U8,
                (2, false) => Scalar::U16,
                (4, false) => Scalar::U32,
                (8, false) => Scalar::U64,
                _ => return None,
            };
            (scalar, byte_order)
        }
        Datatype::FloatingPoint { size, byte_order } => {
            let scalar = match size {
                2 => Scalar::F16,
                4 => Scalar::F32,
                8 => Scalar::F64,
                _ => return None,
            };
            (scalar, byte_order)
        }
        _ => return None,
    };
    Some(DType {
        scalar,
        big_endian: matches!(order, ByteOrder::BigEndian),
    })
}

/// What a datatype is, in a user's words.
fn describe(t: &Datatype) -> &'static str {
    match t {
        Datatype::String { .. } => "text",
        Datatype::VarLen { .. } => "variable-length values",
        Datatype::Compound { .. } => "records (a compound type)",
        Datatype::Enum { .. } => "enumerated values",
        Datatype::Array { .. } => "arrays in each element",
        Datatype::Reference { .. } => "references",
        Datatype::Opaque { .. } => "opaque bytes",
        _ => "values of an unusual width",
    }
}

fn read_dataset<T: Element>(
    h: &Opened,
    wanted: Option<&str>,
    file_len: u64,
) -> Result<Table<T>, IoError> {
    let ds = h.dataset(wanted)?;
    let label = ds.name().trim_start_matches('/').to_owned();
    let bad = |m: String| h.invalid(format!("dataset '{label}': {m}"));
    let (rows, cols) = match *ds.shape() {
        [n] => (n, 1),
        [rows, cols] => (rows, cols),
        ref s => {
            return Err(bad(format!(
                "has {} dimensions ({s:?}); points are a 2-D array (one row per point) or 1-D",
                s.len()
            )))
        }
    };
    let dtype = scalar_type(ds.dtype())
        .ok_or_else(|| bad(format!("holds {}, not numbers", describe(ds.dtype()))))?;
    if !T::accepts(dtype.scalar) {
        return Err(bad(format!(
            "holds floating-point values; reading {} needs integers",
            T::WHAT
        )));
    }
    let size = dtype.scalar.size() as u64;
    let bytes = rows.checked_mul(cols).and_then(|n| n.checked_mul(size));
    let limit = file_len.saturating_mul(MAX_EXPANSION).max(1 << 20);
    let (count, bytes) = match bytes {
        Some(b) if b <= limit => (rows * cols, b),
        _ => {
            return Err(bad(format!(
                "its header claims {rows} x {cols} values, more than a file of {file_len} bytes \
                 can hold (the file is damaged)"
            )))
        }
    };
    let (count, bytes, rows, cols) = (
        usize::try_from(count).map_err(|_| bad("too large for this machine".into()))?,
        usize::try_from(bytes).map_err(|_| bad("too large for this machine".into()))?,
        usize::try_from(rows).map_err(|_| bad("too large for this machine".into()))?,
        usize::try_from(cols).map_err(|_| bad("too large for this machine".into()))?,
    );
    let fail = |e: hdf5_reader::error::Error| bad(e.to_string());
    let mut out: Vec<T> = Vec::new();
    if T::native_bytes(dtype, &mut []).is_some() {
        // Stored as the output holds it: decoded straight into the output, no second copy.
        out = vec![T::ZERO; count];
        let dst = T::native_bytes(dtype, &mut out).expect("checked above");
        ds.read_raw_bytes_into(dst).map_err(fail)?;
    } else {
        let raw = ds.read_raw_bytes().map_err(fail)?;
        if raw.len() != bytes {
            return Err(bad(format!(
                "decoded {} bytes, expected {bytes}",
                raw.len()
            )));
        }
        let mut scratch = Vec::new();
        read_elements(&mut raw.as_slice(), dtype, count, &mut out, &mut scratch).map_err(|e| {
            match e {
                ReadError::Io(e) => IoError::io(&h.name, e),
                ReadError::Bad(k, v) => bad(format!("element [{}, {}]: {v}", k / cols, k % cols)),
            }
        })?;
    }
    Ok(Table::new(out, rows, cols))
}

/// Reads a dataset of the HDF5 file at `path`: `dataset`, or the file's only dataset when
/// `None`. Errors name the file and the dataset, and list the datasets when one is missing.
pub(crate) fn read<T: Element>(path: &Path, dataset: Option<&str>) -> Result<Table<T>, IoError> {
    let len = std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| IoError::io(&path.display().to_string(), e))?;
    let h = open(path, len)?;
    read_dataset(&h, dataset, len)
}

/// [`read`] into the precision the dataset stores: `f64` for float64 datasets, `f32` for
/// every other type (see [`crate::Values`]).
pub(crate) fn read_values(path: &Path, dataset: Option<&str>) -> Result<crate::Values, IoError> {
    let len = std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| IoError::io(&path.display().to_string(), e))?;
    let h = open(path, len)?;
    values_of(&h, dataset, len)
}

fn values_of(h: &Opened, dataset: Option<&str>, len: u64) -> Result<crate::Values, IoError> {
    let ds = h.dataset(dataset)?;
    let f64_stored = scalar_type(ds.dtype()).is_some_and(|t| t.scalar == Scalar::F64);
    drop(ds);
    Ok(if f64_stored {
        crate::Values::F64(read_dataset(h, dataset, len)?)
    } else {
        crate::Values::F32(read_dataset(h, dataset, len)?)
    })
}

/// Reads `dataset` (or the only one) of an HDF5 file held in memory in the precision it
/// stores (see [`crate::Values`]); `name_for_errors` starts every message.
pub fn read_values_from_bytes(
    bytes: &[u8],
    dataset: Option<&str>,
    name_for_errors: &str,
) -> Result<crate::Values, IoError> {
    let h = open_bytes(bytes, name_for_errors)?;
    values_of(&h, dataset, bytes.len() as u64)
}

fn read_bytes<T: Element>(
    bytes: &[u8],
    dataset: Option<&str>,
    name: &str,
) -> Result<Table<T>, IoError> {
    let h = open_bytes(bytes, name)?;
    read_dataset(&h, dataset, bytes.len() as u64)
}

/// Reads `dataset` (or the only one) of an HDF5 file held in memory as `f32`, as
/// [`read_f32`](crate::read_f32) reads a path; `name_for_errors` starts every message.
pub fn read_f32_from_bytes(
    bytes: &[u8],
    dataset: Option<&str>,
    name_for_errors: &str,
) -> Result<Table<f32>, IoError> {
    read_bytes(bytes, dataset, name_for_errors)
}

/// Reads `dataset` (or the only one) of an HDF5 file held in memory as `f64`, every type
/// converted exactly (see the crate docs).
pub fn read_f64_from_bytes(
    bytes: &[u8],
    dataset: Option<&str>,
    name_for_errors: &str,
) -> Result<Table<f64>, IoError> {
    read_bytes(bytes, dataset, name_for_errors)
}

/// Reads `dataset` (or the only one) of an HDF5 file held in memory as `i64` ids.
pub fn read_i64_from_bytes(
    bytes: &[u8],
    dataset: Option<&str>,
    name_for_errors: &str,
) -> Result<Table<i64>, IoError> {
    read_bytes(bytes, dataset, name_for_errors)
}

/// Whether the HDF5 file at `path` has a top-level dataset called `dataset`.
pub fn has_dataset(path: &Path, dataset: &str) -> Result<bool, IoError> {
    let len = std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| IoError::io(&path.display().to_string(), e))?;
    let h = open(path, len)?;
    Ok(h.file.dataset(dataset).is_ok())
}

/// The text of the file attribute `attribute` of the HDF5 file at `path` (ann-benchmarks
/// keeps the metric in `distance`); `None` when the file has no such attribute.
pub fn file_attribute(path: &Path, attribute: &str) -> Result<Option<String>, IoError> {
    let len = std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| IoError::io(&path.display().to_string(), e))?;
    let h = open(path, len)?;
    let root = h.file.root_group().map_err(|e| unreadable(&h.name, e))?;
    let Ok(attr) = root.attribute(attribute) else {
        return Ok(None);
    };
    attr.read_string()
        .map(|s| Some(s.trim_end_matches('\0').trim().to_owned()))
        .map_err(|e| h.invalid(format!("attribute '{attribute}' is not text: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_a_dataset() {
        let p = parse(Path::new("/nonexistent/glove.hdf5:test")).unwrap();
        assert_eq!(p.file, Path::new("/nonexistent/glove.hdf5"));
        assert_eq!(p.dataset.as_deref(), Some("test"));
        let p = parse(Path::new("x.H5")).unwrap();
        assert_eq!((p.file.as_path(), p.dataset), (Path::new("x.H5"), None));
        assert_eq!(parse(Path::new("x.npy")), None);
        assert_eq!(parse(Path::new("x.npy:train")), None);
        assert_eq!(parse(Path::new("x.hdf5:")), None);
    }
}

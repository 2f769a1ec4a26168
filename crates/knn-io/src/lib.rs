//! Reading and writing the vector file formats users of a kNN engine have.
//!
//! | call | use |
//! |---|---|
//! | [`read_f32`]`(path, None)` | a data or query matrix, as `f32` rows |
//! | [`read_values_with`]`(path, &options)` | a data matrix in the precision the file stores: `f64` for float64 npy/HDF5 and for text, `f32` otherwise ([`Values`]) |
//! | [`read_f64`]`(path, None)` | any numbers as `f64`, exactly |
//! | [`read_i64`]`(path, None)` | ground-truth ids or class labels |
//! | [`write_f32`]`(path, None, &table)` | distances, generated data |
//! | [`write_f64`]`(path, None, &table)` | distances of float64 inputs (npy `<f8`, CSV) |
//! | [`write_i64`]`(path, None, &table)` | neighbour ids, labels |
//! | [`read_f32_from_bytes`], [`read_i64_from_bytes`] | the same parsers on bytes in memory |
//! | [`read_f32_with`]`(path, &options)`, [`read_i64_with`] | with a CSV header / delimiter, an HDF5 dataset |
//!
//! `None` picks the [`Format`] from the extension; `Some(format)` overrides it. Results are
//! a row-major [`Table`]. Path readers read fvecs, ivecs, bvecs and npy files as a stream,
//! straight into the output when the stored bytes are its representation (fvecs and `<f4` npy
//! into `f32`, `<i8` npy into `i64`) and through a small buffer otherwise, so the output is the
//! only copy of the data in memory (peak memory = output, not file + output); CSV files are
//! memory-mapped and parsed in place. Writers write a temporary file in the
//! target's directory and rename it into place once complete, so a failed write leaves no partial
//! output and keeps any existing file; a successful one replaces it (callers that must not
//! overwrite check first).
//!
//! # Formats
//! - **fvecs / ivecs / bvecs** (TEXMEX, as in ANN_SIFT1M): records of a little-endian `i32`
//!   dimension `d >= 1` followed by `d` values, `f32` / `i32` / `u8`, all little-endian. Every
//!   record must have the first record's `d`. An empty file reads as a 0 x 0 table (callers
//!   decide whether that is an error). Errors give the record (from 0) and its byte offset:
//!   `data.fvecs: record 17 at byte 8772: dimension 64 differs from the first record's 128`,
//!   `data.fvecs: truncated: record 3 at byte 1040 needs 516 bytes, 200 remain`.
//! - **npy** (NumPy, versions 1.0, 2.0, 3.0): the header dict is parsed as a Python literal.
//!   Element types `b1`, `i1` `i2` `i4` `i8`, `u1` `u2` `u4` `u8`, `f2` `f4` `f8`, little- or
//!   big-endian. A 1-D array of `n` reads as `n` rows of 1 column, a 2-D array as it is; other
//!   ranks are an error. `fortran_order: True` is read correctly (transposed into row-major).
//!   The header's shape is checked against the file length before anything is allocated; data
//!   that is short or has bytes left over is an error with the expected and actual byte counts.
//!   An empty file is an error (an npy file always has a header). Written files are 2-D,
//!   C order, version 1.0, `<f4` for `f32`, `<f8` for `f64` and `<i8` for `i64`.
//! - **CSV** (`.csv`, `.txt`): numbers separated by commas, tabs, semicolons or runs of
//!   spaces (NumPy's `savetxt`), detected from the first lines unless [`CsvOptions`] names the
//!   [`Delimiter`]; one row per line, optional spaces or quotes around values, `\n` or `\r\n`
//!   line ends. The first line is a header (skipped) only when none of its cells is a number
//!   (so `1,NA` is data, and an error), or when [`Header`] says. Blank lines are skipped. Every
//!   row must have as many cells as the first. `NaN`, `inf`, `-inf` (any case) are read as
//!   those values (refused with [`CsvOptions::finite_only`]); cells that do not parse are
//!   errors with line and column (both from 1): `x.csv: line 5, column 3: 'abc' is not a
//!   number`, with the delimiter to give when the cell holds several numbers. An input without
//!   data lines reads as 0 rows. Written files have no header; `f32` and `f64` values are
//!   written in the shortest form that reads back to the same value (of that type). Text holds
//!   decimal numbers, not binary ones: [`read_values_with`] reads it in `f64`, the nearest
//!   binary value to each decimal that the types here hold.
//! - **HDF5** (`.hdf5`, `.h5`, or any file that starts with the HDF5 signature; read only,
//!   see [`hdf5`]): a 1-D or 2-D dataset of any integer or floating-point type, contiguous or
//!   chunked, deflate- or shuffle-compressed: the one named as `FILE.hdf5:NAME`, else
//!   [`ReadOptions::dataset`], else the file's only dataset. ann-benchmarks files hold `train`,
//!   `test`, `neighbors`, `distances` and a `distance` attribute ([`hdf5::file_attribute`]).
//!
//! # Value conversions
//! - Into `f32` ([`read_f32`]): `f32` and `f16` exactly; `f64` rounded to nearest, values beyond
//!   the `f32` range are an error naming the element (NaN and ±inf pass through: the engine
//!   rejects them later with row and column); `u8`, `i8`, `u16`, `i16`, bool exactly; `i32`,
//!   `u32`, `i64`, `u64` (ivecs included) exactly when `|v| <= 2^24`, otherwise an error.
//! - Into `f64` ([`read_f64`]): every float type exactly (`f32` and `f16` widened); integers
//!   exactly when `|v| <= 2^53`, otherwise an error; CSV cells parsed as `f64` (a finite
//!   number beyond the `f64` range is an error).
//! - Into `i64` ([`read_i64`]): every integer type, `u64` above `i64::MAX` an error; ivecs and
//!   bvecs; CSV cells must be decimal integers. Floating-point data is refused.
//!
//! Sizes use 64-bit, overflow-checked arithmetic: tables with `rows * cols` beyond 2^31 work.
//! No input panics; every error is an [`IoError`] whose message starts with the file name.
//!
//! # Example
//! ```
//! use knn_io::{read_f32_from_bytes, Format};
//!
//! let t = read_f32_from_bytes(b"x,y\n1,2\n3,4.5\n", Format::Csv, "points.csv")?;
//! assert_eq!((t.rows, t.cols), (2, 2));
//! assert_eq!(t.row(1), [3.0, 4.5]);
//!
//! let e = read_f32_from_bytes(b"1,2\n3,abc\n", Format::Csv, "points.csv").unwrap_err();
//! assert_eq!(e.to_string(), "points.csv: line 2, column 2: 'abc' is not a number");
//! # Ok::<(), knn_io::IoError>(())
//! ```

#![warn(missing_docs)]

mod csv_text;
mod dtype;
mod error;
mod format;
pub mod hdf5;
mod input;
mod labels;
mod npy;
mod output;
mod shape;
mod vecs;

use std::path::Path;

pub use csv_text::{CsvOptions, Delimiter, Header, ParseDelimiterError};
pub use error::{IoError, ParseFormatError};
pub use format::Format;
pub use labels::{
    read_labels, read_labels_from_bytes, read_labels_from_bytes_with, read_labels_with,
    write_labels, write_labels_to, Labels,
};
pub use output::{
    output_target, write_bytes, write_f32_to, write_f64_to, write_i64_to, OutputTarget,
};
pub use shape::{array_dims, array_dims_from_bytes};

use dtype::Element;
use input::{FileBytes, Input};
use output::write_atomically;

/// A dense row-major table: `rows` records of `cols` values each, `data.len() == rows * cols`;
/// value `(i, j)` is `data[i * cols + j]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Table<T> {
    /// The values, row after row.
    pub data: Vec<T>,
    /// Number of rows (records, points).
    pub rows: usize,
    /// Number of values per row (the dimension).
    pub cols: usize,
}

impl<T> Table<T> {
    pub(crate) fn new(data: Vec<T>, rows: usize, cols: usize) -> Table<T> {
        debug_assert_eq!(Some(data.len()), rows.checked_mul(cols));
        Table { data, rows, cols }
    }

    /// Row `i` as a slice of `cols` values. Panics if `i >= rows` or the table is inconsistent,
    /// like slice indexing.
    pub fn row(&self, i: usize) -> &[T] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }

    /// Whether `data.len() == rows * cols` (the fields are public, so a table built by hand
    /// may not be; the writers check this and return an error).
    pub fn is_consistent(&self) -> bool {
        self.rows.checked_mul(self.cols) == Some(self.data.len())
    }
}

/// A matrix of numbers in the precision its file stores them in: `f64` for float64 data (npy
/// `f8`, HDF5 float64 datasets) and for text (CSV cells are decimal numbers, read as the
/// nearest `f64`); `f32` for every other type (float32 and float16, fvecs, bvecs, and integers,
/// converted by the `f32` rules of the crate docs).
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// Values stored in 32 bits or fewer.
    F32(Table<f32>),
    /// Values stored as float64, or written as decimal text.
    F64(Table<f64>),
}

impl Values {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        match self {
            Values::F32(t) => t.rows,
            Values::F64(t) => t.rows,
        }
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        match self {
            Values::F32(t) => t.cols,
            Values::F64(t) => t.cols,
        }
    }

    /// Whether the values are `f64`.
    pub fn is_f64(&self) -> bool {
        matches!(self, Values::F64(_))
    }
}

/// The format to use: the one given, else the one the extension names.
fn resolve(path: &Path, format: Option<Format>) -> Result<Format, IoError> {
    match format {
        Some(f) => Ok(f),
        None => Format::from_path(path),
    }
}

fn read_from_bytes<T: Element + csv_text::CsvCell>(
    bytes: &[u8],
    format: Format,
    name: &str,
    csv: &CsvOptions,
) -> Result<Table<T>, IoError> {
    match format {
        Format::Csv => csv_text::read(bytes, name, csv),
        _ => read_binary(&mut &bytes[..], bytes.len(), format, name, csv),
    }
}

/// Any format from a source of `len` bytes; the binary ones as a stream.
fn read_binary<T: Element + csv_text::CsvCell>(
    src: &mut impl std::io::Read,
    len: usize,
    format: Format,
    name: &str,
    csv: &CsvOptions,
) -> Result<Table<T>, IoError> {
    match format {
        Format::Fvecs | Format::Ivecs | Format::Bvecs => vecs::read(src, len, format, name),
        Format::Npy => npy::read(src, len, name),
        Format::Csv => {
            let mut bytes = Vec::with_capacity(len);
            src.read_to_end(&mut bytes)
                .map_err(|e| IoError::io(name, e))?;
            csv_text::read(&bytes, name, csv)
        }
    }
}

fn read_path<T: Element + csv_text::CsvCell>(
    path: &Path,
    options: &ReadOptions,
) -> Result<Table<T>, IoError> {
    if options.format.is_none() {
        if let Some(h) = hdf5::parse(path) {
            let dataset = h.dataset.as_deref().or(options.dataset.as_deref());
            return hdf5::read(&h.file, dataset);
        }
    }
    let format = resolve(path, options.format)?;
    let name = path.display().to_string();
    if format == Format::Csv {
        let file = FileBytes::open(path, &name)?;
        return read_from_bytes(file.bytes(), format, &name, &options.csv);
    }
    match Input::open(path, &name)? {
        Input::File { reader, len } => {
            read_binary(&mut { reader }, len, format, &name, &options.csv)
        }
        Input::Bytes(bytes) => read_from_bytes(&bytes, format, &name, &options.csv),
    }
}

/// [`read_path`] into the precision the file stores (see [`Values`]).
fn read_values_path(path: &Path, options: &ReadOptions) -> Result<Values, IoError> {
    if options.format.is_none() {
        if let Some(h) = hdf5::parse(path) {
            let dataset = h.dataset.as_deref().or(options.dataset.as_deref());
            return hdf5::read_values(&h.file, dataset);
        }
    }
    let format = resolve(path, options.format)?;
    let name = path.display().to_string();
    match format {
        Format::Csv => {
            let file = FileBytes::open(path, &name)?;
            csv_text::read(file.bytes(), &name, &options.csv).map(Values::F64)
        }
        Format::Npy => match Input::open(path, &name)? {
            Input::File { reader, len } => npy::read_values(&mut { reader }, len, &name),
            Input::Bytes(bytes) => npy::read_values(&mut &bytes[..], bytes.len(), &name),
        },
        _ => read_path(path, options).map(Values::F32),
    }
}

/// How to read an input beyond its path: everything a command line can say about it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// The format; `None` takes the one the extension names (and HDF5 by its name or
    /// signature, see [`hdf5::is_hdf5`]).
    pub format: Option<Format>,
    /// For text files: header, delimiter, and whether NaN and infinities are refused.
    pub csv: CsvOptions,
    /// For HDF5 files named without a dataset (`data.hdf5`, not `data.hdf5:NAME`): the dataset
    /// to read (`train`, `test`); `None` reads the file's only dataset.
    pub dataset: Option<String>,
}

impl ReadOptions {
    /// Options that only name the format (`None`: from the extension).
    pub fn format(format: Option<Format>) -> ReadOptions {
        ReadOptions {
            format,
            ..ReadOptions::default()
        }
    }
}

/// Reads a matrix of numbers as `f32` from `path`, in `format` or (when `None`) the format
/// named by the extension.
///
/// fvecs as is; bvecs `u8` converted; ivecs `i32` converted exactly when `|v| <= 2^24`, else an
/// error; npy of any numeric dtype (see the crate docs for the range rules); CSV numbers; the
/// only dataset of an HDF5 file, or the one named as `FILE.hdf5:NAME`.
/// An empty fvecs/ivecs/bvecs or CSV file is `Ok` with 0 rows.
pub fn read_f32(path: &Path, format: Option<Format>) -> Result<Table<f32>, IoError> {
    read_path(path, &ReadOptions::format(format))
}

/// Reads integer ids or labels as `i64` from `path`: ivecs, bvecs, npy of any integer dtype
/// (range-checked), CSV of decimal integers, or an HDF5 dataset of integers. fvecs and
/// floating-point npy are refused.
pub fn read_i64(path: &Path, format: Option<Format>) -> Result<Table<i64>, IoError> {
    read_path(path, &ReadOptions::format(format))
}

/// [`read_f32`] with everything [`ReadOptions`] can say.
pub fn read_f32_with(path: &Path, options: &ReadOptions) -> Result<Table<f32>, IoError> {
    read_path(path, options)
}

/// [`read_i64`] with everything [`ReadOptions`] can say.
pub fn read_i64_with(path: &Path, options: &ReadOptions) -> Result<Table<i64>, IoError> {
    read_path(path, options)
}

/// Reads a matrix of numbers from `path` in the precision the file stores them in: `f64` for
/// float64 npy files and HDF5 datasets and for text (decimal numbers), `f32` for the rest (see
/// [`Values`]), with everything [`ReadOptions`] can say. Nothing is rounded that the file
/// holds more precisely than `f32`.
pub fn read_values_with(path: &Path, options: &ReadOptions) -> Result<Values, IoError> {
    read_values_path(path, options)
}

/// [`read_values_with`] on the bytes of a file held in memory (standard input), in `format`
/// (text with the header, delimiter and finiteness of `csv`).
pub fn read_values_from_bytes(
    bytes: &[u8],
    format: Format,
    csv: &CsvOptions,
    name_for_errors: &str,
) -> Result<Values, IoError> {
    match format {
        Format::Csv => csv_text::read(bytes, name_for_errors, csv).map(Values::F64),
        Format::Npy => npy::read_values(&mut &bytes[..], bytes.len(), name_for_errors),
        _ => read_from_bytes(bytes, format, name_for_errors, csv).map(Values::F32),
    }
}

/// Reads a matrix of numbers as `f64` from `path`: every type exactly (float32 widened,
/// integers within 2^53), CSV cells as the nearest `f64`; formats as [`read_f32`].
pub fn read_f64(path: &Path, format: Option<Format>) -> Result<Table<f64>, IoError> {
    read_path(path, &ReadOptions::format(format))
}

/// [`read_f64`] with everything [`ReadOptions`] can say.
pub fn read_f64_with(path: &Path, options: &ReadOptions) -> Result<Table<f64>, IoError> {
    read_path(path, options)
}

/// [`read_f64`] on the bytes of a file already in memory; `name_for_errors` starts every
/// error message.
pub fn read_f64_from_bytes(
    bytes: &[u8],
    format: Format,
    name_for_errors: &str,
) -> Result<Table<f64>, IoError> {
    read_from_bytes(bytes, format, name_for_errors, &CsvOptions::default())
}

/// [`read_f32`] on the bytes of a file already in memory; `name_for_errors` starts every error
/// message. This is the parser the path readers use, for tests, fuzzing and non-file sources.
pub fn read_f32_from_bytes(
    bytes: &[u8],
    format: Format,
    name_for_errors: &str,
) -> Result<Table<f32>, IoError> {
    read_from_bytes(bytes, format, name_for_errors, &CsvOptions::default())
}

/// [`read_i64`] on the bytes of a file already in memory; `name_for_errors` starts every error
/// message.
pub fn read_i64_from_bytes(
    bytes: &[u8],
    format: Format,
    name_for_errors: &str,
) -> Result<Table<i64>, IoError> {
    read_from_bytes(bytes, format, name_for_errors, &CsvOptions::default())
}

/// [`read_f32_from_bytes`] for text, with the header, delimiter and finiteness of `csv`.
pub fn read_csv_f32_from_bytes(
    bytes: &[u8],
    csv: &CsvOptions,
    name_for_errors: &str,
) -> Result<Table<f32>, IoError> {
    csv_text::read(bytes, name_for_errors, csv)
}

fn check_consistent<T>(t: &Table<T>, name: &str) -> Result<(), IoError> {
    if t.is_consistent() {
        Ok(())
    } else {
        Err(IoError::invalid(
            name,
            format!(
                "cannot write a table of {} x {} with {} values",
                t.rows,
                t.cols,
                t.data.len()
            ),
        ))
    }
}

fn check_csv_writable<T>(t: &Table<T>, name: &str) -> Result<(), IoError> {
    if t.rows > 0 && t.cols == 0 {
        return Err(IoError::invalid(
            name,
            "format csv cannot hold rows of 0 values".to_owned(),
        ));
    }
    Ok(())
}

/// Writes `t` to `path` as `f32` rows: fvecs, npy (`<f4`, 2-D) or CSV (no header).
/// bvecs and ivecs cannot hold `f32` and are an error. A new or regular file is replaced
/// atomically (temporary file and rename; behind symbolic links, the file they lead to); on
/// error nothing at `path` changes. Devices, pipes and `/dev/stdout` are written through.
pub fn write_f32(path: &Path, format: Option<Format>, t: &Table<f32>) -> Result<(), IoError> {
    let format = resolve(path, format)?;
    let name = path.display().to_string();
    output::check_f32(t, format, &name)?;
    write_atomically(path, &name, |w| output::encode_f32(w, t, format))
}

/// Writes `t` to `path` as `f64` rows: npy (`<f8`, 2-D) or CSV (no header; the shortest text
/// that reads back to the same `f64`). fvecs, ivecs and bvecs cannot hold `f64` and are an
/// error. Written as [`write_f32`] writes.
pub fn write_f64(path: &Path, format: Option<Format>, t: &Table<f64>) -> Result<(), IoError> {
    let format = resolve(path, format)?;
    let name = path.display().to_string();
    output::check_f64(t, format, &name)?;
    write_atomically(path, &name, |w| output::encode_f64(w, t, format))
}

/// Writes `t` to `path` as integer rows: ivecs (every value must fit in `i32`, else an error
/// naming its row and column, counted from 0), npy (`<i8`, 2-D) or CSV (no header). fvecs and
/// bvecs are an error. Written as [`write_f32`] writes.
pub fn write_i64(path: &Path, format: Option<Format>, t: &Table<i64>) -> Result<(), IoError> {
    let format = resolve(path, format)?;
    let name = path.display().to_string();
    output::check_i64(t, format, &name)?;
    write_atomically(path, &name, |w| output::encode_i64(w, t, format))
}

/// A float32 matrix used in place in a memory-mapped file: no copy, and the system may drop
/// and re-read its pages, so inputs larger than memory can be searched.
pub struct MappedF32 {
    map: memmap2::Mmap,
    offset: usize,
    rows: usize,
    cols: usize,
}

impl MappedF32 {
    /// The values, row-major (`rows × cols`).
    pub fn values(&self) -> &[f32] {
        let bytes = &self.map[self.offset..self.offset + self.rows * self.cols * 4];
        // SAFETY: `map_f32` checked that the data starts 4-byte aligned and holds exactly
        // rows·cols little-endian f32 on a little-endian machine; every bit pattern is an f32.
        unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const f32, self.rows * self.cols) }
    }
    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }
}

/// Reads an fvecs, ivecs or bvecs file as float32 into an unnamed temporary file in `dir`
/// (removed by the system once unmapped) and maps that: one sequential pass, then the values
/// are used in place like a mapped `.npy`, so files larger than memory can be searched. The
/// records are checked as [`read_f32`] checks them (same errors). `Ok(None)` for other
/// formats and for an empty file.
pub fn spill_f32(
    path: &Path,
    format: Option<Format>,
    dir: &Path,
) -> Result<Option<MappedF32>, IoError> {
    let format = resolve(path, format)?;
    if !matches!(format, Format::Fvecs | Format::Ivecs | Format::Bvecs) {
        return Ok(None);
    }
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| IoError::io(&name, e))?;
    let len = file.metadata().map_err(|e| IoError::io(&name, e))?.len() as usize;
    if len == 0 {
        return Ok(None);
    }
    use std::io::Write;
    let spill_name = format!("{name} (temporary copy in {})", dir.display());
    let spill = make_spill_file(dir).map_err(|e| IoError::io(&spill_name, e))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 22, &spill);
    let mut put = |values: &[f32]| -> std::io::Result<()> {
        let mut bytes = Vec::with_capacity(values.len() * 4);
        for v in values {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        out.write_all(&bytes)
    };
    let shape = vecs::read_records::<f32>(
        &mut std::io::BufReader::with_capacity(1 << 22, file),
        len,
        format,
        &name,
        Some(&mut put),
    )?;
    out.flush().map_err(|e| IoError::io(&spill_name, e))?;
    drop(out);
    // SAFETY: the file is unnamed and ours alone: nothing else can change it while mapped.
    let map = unsafe { memmap2::Mmap::map(&spill) }.map_err(|e| IoError::io(&spill_name, e))?;
    if map.len() != shape.rows * shape.cols * 4 {
        return Err(IoError::invalid(&spill_name, "short temporary copy"));
    }
    Ok(Some(MappedF32 {
        map,
        offset: 0,
        rows: shape.rows,
        cols: shape.cols,
    }))
}

/// An unnamed file in `dir` (O_TMPFILE where the system has it), else a named one removed at
/// once: either way, nothing is left behind.
fn make_spill_file(dir: &Path) -> std::io::Result<std::fs::File> {
    let path = dir.join(format!(
        ".knn-spill-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

/// Maps `path` when it is an `.npy` file (by `format`, else its extension) of little-endian
/// float32 in C order, 1-D or 2-D, with at least one row: the values can then be used in
/// place. `Ok(None)` for every other file (read those with [`read_f32`], which also names what
/// is wrong with a bad file); an error only when the file cannot be opened.
pub fn map_f32(path: &Path, format: Option<Format>) -> Result<Option<MappedF32>, IoError> {
    if format.is_none() && hdf5::parse(path).is_some() {
        return Ok(None);
    }
    if !cfg!(target_endian = "little") || resolve(path, format)? != Format::Npy {
        return Ok(None);
    }
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| IoError::io(&name, e))?;
    if !file.metadata().is_ok_and(|m| m.is_file() && m.len() > 0) {
        return Ok(None);
    }
    // SAFETY: the map is only read. Like every memory-mapped reader we rely on no other process
    // truncating or rewriting the file while it is in use; our writers replace files by rename.
    let Ok(map) = (unsafe { memmap2::Mmap::map(&file) }) else {
        return Ok(None);
    };
    let Ok(lay) = npy::layout(&mut &map[..], map.len(), &name) else {
        return Ok(None);
    };
    let c_order = !lay.fortran_order || lay.rows <= 1 || lay.cols <= 1;
    let aligned = (map.as_ptr() as usize + lay.data_start) % 4 == 0;
    if lay.dtype != dtype::DType::le(dtype::Scalar::F32) || !c_order || !aligned || lay.rows == 0 {
        return Ok(None);
    }
    Ok(Some(MappedF32 {
        offset: lay.data_start,
        rows: lay.rows,
        cols: lay.cols,
        map,
    }))
}

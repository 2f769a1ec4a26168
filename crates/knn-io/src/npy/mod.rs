//! NumPy `.npy` files (format versions 1.0, 2.0, 3.0).
//!
//! Layout: the magic `\x93NUMPY`, one byte major and one byte minor version, the header length
//! (little-endian `u16` in version 1, `u32` in versions 2 and 3), the header (a Python dict
//! literal with `descr`, `fortran_order` and `shape`, see [`header`]), then the raw elements.

mod header;

use std::io::{Read, Write};

use crate::dtype::{read_elements, DType, Element, ReadError, Scalar};
use crate::output::write_encoded;
use crate::{IoError, Table};

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Side of the square blocks used to transpose Fortran-order data.
const TRANSPOSE_BLOCK: usize = 64;

/// Where and how an npy file of `len` bytes holds its array, read from the file's start: the
/// preamble and header are parsed and the data size checked against `len`, so nothing is
/// allocated for the data before the file is known to hold it.
pub(crate) struct Layout {
    pub(crate) dtype: DType,
    pub(crate) fortran_order: bool,
    pub(crate) one_d: bool,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// Byte offset of the first element.
    pub(crate) data_start: usize,
    /// Data bytes already read with the preamble (robustness for tiny headers).
    leftover: Vec<u8>,
}

pub(crate) fn layout(src: &mut impl Read, len: usize, name: &str) -> Result<Layout, IoError> {
    let invalid = |msg: String| IoError::invalid(name, msg);
    let io = |e| IoError::io(name, e);
    if len == 0 {
        return Err(invalid(
            "file is empty, but an npy file starts with a header".to_owned(),
        ));
    }
    // The preamble: magic, version, header length (12 bytes at most).
    let mut pre = [0u8; 12];
    let pre_len = len.min(pre.len());
    src.read_exact(&mut pre[..pre_len]).map_err(io)?;
    let bytes = &pre[..pre_len];
    let magic_len = bytes.len().min(MAGIC.len());
    if bytes[..magic_len] != MAGIC[..magic_len] {
        return Err(invalid(
            "not an npy file (it does not start with \\x93NUMPY)".to_owned(),
        ));
    }
    let (major, minor) = match (bytes.get(6), bytes.get(7)) {
        (Some(&a), Some(&b)) => (a, b),
        _ => {
            return Err(invalid(format!(
                "truncated: the npy preamble needs 10 bytes, {len} remain"
            )));
        }
    };
    let (header_len, header_start) = match (major, minor) {
        (1, 0) => match bytes.get(8..10) {
            Some(b) => (usize::from(u16::from_le_bytes([b[0], b[1]])), 10usize),
            None => {
                return Err(invalid(format!(
                    "truncated: the npy 1.0 preamble needs 10 bytes, {len} remain"
                )));
            }
        },
        (2 | 3, 0) => match bytes.get(8..12) {
            Some(b) => {
                let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                let n = usize::try_from(n)
                    .map_err(|_| invalid(format!("npy header length {n} is too large")))?;
                (n, 12usize)
            }
            None => {
                return Err(invalid(format!(
                    "truncated: the npy {major}.0 preamble needs 12 bytes, {len} remain"
                )));
            }
        },
        _ => {
            return Err(invalid(format!(
                "npy format version {major}.{minor} is not supported (1.0, 2.0 and 3.0 are)"
            )));
        }
    };
    let remaining = len - header_start;
    if header_len > remaining {
        return Err(invalid(format!(
            "truncated: the npy header at byte {header_start} needs {header_len} bytes, \
             {remaining} remain"
        )));
    }
    let data_start = header_start + header_len;
    // The header: the preamble bytes read past `header_start`, then the rest (bounded by `len`).
    let mut head = bytes[header_start.min(pre_len)..pre_len.min(data_start)].to_vec();
    let have = head.len();
    head.resize(header_len, 0);
    src.read_exact(&mut head[have..]).map_err(io)?;
    let hd = header::parse(&head).map_err(|e| invalid(format!("bad npy header: {e}")))?;
    drop(head);
    let (rows, cols) = match hd.shape[..] {
        [n] => (n, 1),
        [r, c] => (r, c),
        _ => {
            return Err(invalid(format!(
                "the array has {} dimensions (shape {:?}); only 1-D and 2-D arrays can be read",
                hd.shape.len(),
                hd.shape
            )));
        }
    };
    let shape_text = if hd.shape.len() == 1 {
        format!("({rows},)")
    } else {
        format!("({rows}, {cols})")
    };
    let too_large = || invalid(format!("shape {shape_text} is too large for this machine"));
    let rows = usize::try_from(rows).map_err(|_| too_large())?;
    let cols = usize::try_from(cols).map_err(|_| too_large())?;
    let size = hd.dtype.scalar.size();
    let count = rows.checked_mul(cols).ok_or_else(too_large)?;
    let needed = count.checked_mul(size).ok_or_else(too_large)?;
    let data_len = len - data_start;
    // Checked before allocating: the output is bounded by the file, whatever the header says.
    if data_len < needed {
        return Err(invalid(format!(
            "truncated: data of shape {shape_text} and dtype '{}' at byte {data_start} needs \
             {needed} bytes, {data_len} remain",
            hd.dtype,
        )));
    }
    if data_len > needed {
        return Err(invalid(format!(
            "{} unexpected bytes after the data (shape {shape_text} and dtype '{}' at byte \
             {data_start} need {needed} bytes)",
            data_len - needed,
            hd.dtype
        )));
    }
    Ok(Layout {
        dtype: hd.dtype,
        fortran_order: hd.fortran_order,
        one_d: hd.shape.len() == 1,
        rows,
        cols,
        data_start,
        leftover: bytes[data_start.min(pre_len)..].to_vec(),
    })
}

/// Reads a 1-D (`n` rows of 1) or 2-D `.npy` array of `len` bytes from `src` into `T`. The
/// header is read and checked against `len` first; the elements then go straight into the
/// output (or through a small buffer when they need converting), so the only copy of the data
/// held in memory is the output (two for Fortran order, which is transposed).
pub(crate) fn read<T: Element>(
    src: &mut impl Read,
    len: usize,
    name: &str,
) -> Result<Table<T>, IoError> {
    let lay = layout(src, len, name)?;
    read_data(lay, src, name)
}

/// [`read`] into the precision the file stores: `f64` for `f8` arrays, `f32` for every other
/// dtype (see [`crate::Values`]).
pub(crate) fn read_values(
    src: &mut impl Read,
    len: usize,
    name: &str,
) -> Result<crate::Values, IoError> {
    let lay = layout(src, len, name)?;
    Ok(if lay.dtype.scalar == Scalar::F64 {
        crate::Values::F64(read_data(lay, src, name)?)
    } else {
        crate::Values::F32(read_data(lay, src, name)?)
    })
}

/// The elements of an npy file whose preamble and header `lay` were read from `src`.
fn read_data<T: Element>(
    lay: Layout,
    src: &mut impl Read,
    name: &str,
) -> Result<Table<T>, IoError> {
    let invalid = |msg: String| IoError::invalid(name, msg);
    let io = |e| IoError::io(name, e);
    let Layout {
        dtype,
        fortran_order,
        one_d,
        rows,
        cols,
        data_start,
        ..
    } = lay;
    let size = dtype.scalar.size();
    let count = rows * cols;
    if !T::accepts(dtype.scalar) {
        return Err(invalid(format!(
            "dtype '{}' holds floating-point values; reading {} needs an integer dtype",
            dtype,
            T::WHAT
        )));
    }
    let at = |i: usize, j: usize, k: usize| {
        let index = if one_d {
            format!("[{i}]")
        } else {
            format!("[{i}, {j}]")
        };
        format!("element {index} at byte {}", data_start + k * size)
    };
    let file_order_is_c = !fortran_order || rows <= 1 || cols <= 1;
    // Bytes of the 12-byte preamble read past the header (a header under 2 bytes, which the
    // parser refuses, so this is for robustness only) come first.
    let mut src = lay.leftover.as_slice().chain(src);
    let mut scratch = Vec::new();
    let mut out = Vec::new();
    if file_order_is_c {
        read_elements(&mut src, dtype, count, &mut out, &mut scratch).map_err(|e| match e {
            ReadError::Io(e) => io(e),
            ReadError::Bad(k, bad) => invalid(format!("{}: {bad}", at(k / cols, k % cols, k))),
        })?;
        return Ok(Table::new(out, rows, cols));
    }
    // Fortran order: the file holds column 0, then column 1, ...; convert, then transpose.
    let mut by_column = Vec::new();
    read_elements(&mut src, dtype, count, &mut by_column, &mut scratch).map_err(|e| match e {
        ReadError::Io(e) => io(e),
        ReadError::Bad(k, bad) => invalid(format!("{}: {bad}", at(k % rows, k / rows, k))),
    })?;
    out.extend_from_slice(&by_column);
    for jb in (0..cols).step_by(TRANSPOSE_BLOCK) {
        for ib in (0..rows).step_by(TRANSPOSE_BLOCK) {
            for j in jb..(jb + TRANSPOSE_BLOCK).min(cols) {
                for i in ib..(ib + TRANSPOSE_BLOCK).min(rows) {
                    out[i * cols + j] = by_column[j * rows + i];
                }
            }
        }
    }
    Ok(Table::new(out, rows, cols))
}

/// Writes the preamble and header of a 2-D C-order array: version 1.0, padded with spaces
/// and a newline so the data starts at a multiple of 64 bytes, as numpy does.
fn write_header(w: &mut impl Write, dtype: DType, rows: usize, cols: usize) -> std::io::Result<()> {
    write_dict(w, &header::format_dict(dtype, rows, cols))
}

/// Writes the preamble and header of a C-order array of any `descr` (`<i8`, `<f8`, `<U7`) and
/// shape (`[n]` for 1-D, `[rows, cols]` for 2-D).
pub(crate) fn write_array_header(
    w: &mut impl Write,
    descr: &str,
    shape: &[usize],
) -> std::io::Result<()> {
    let dims = match shape {
        [n] => format!("({n},)"),
        _ => {
            let parts: Vec<String> = shape.iter().map(usize::to_string).collect();
            format!("({})", parts.join(", "))
        }
    };
    write_dict(
        w,
        &format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}"),
    )
}

/// The preamble, then `dict` padded as numpy pads it.
fn write_dict(w: &mut impl Write, dict: &str) -> std::io::Result<()> {
    // Preamble of 10 bytes (version 1.0) or 12 (2.0, for headers over 65535 bytes).
    let padded = |preamble: usize| (preamble + dict.len() + 1).div_ceil(64) * 64 - preamble;
    let (version, preamble) = if padded(10) <= usize::from(u16::MAX) {
        (1u8, 10)
    } else {
        (2u8, 12)
    };
    let header_len = padded(preamble);
    let mut head = Vec::with_capacity(preamble + header_len);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&[version, 0]);
    if version == 1 {
        head.extend_from_slice(&(header_len as u16).to_le_bytes());
    } else {
        head.extend_from_slice(&(header_len as u32).to_le_bytes());
    }
    head.extend_from_slice(dict.as_bytes());
    head.resize(preamble + header_len - 1, b' ');
    head.push(b'\n');
    w.write_all(&head)
}

/// Writes `t` as a 2-D little-endian `<f4` array.
pub(crate) fn write_f32(w: &mut impl Write, t: &Table<f32>) -> std::io::Result<()> {
    write_header(w, DType::le(Scalar::F32), t.rows, t.cols)?;
    write_encoded(w, &t.data, f32::to_le_bytes)
}

/// Writes `t` as a 2-D little-endian `<f8` array.
pub(crate) fn write_f64(w: &mut impl Write, t: &Table<f64>) -> std::io::Result<()> {
    write_header(w, DType::le(Scalar::F64), t.rows, t.cols)?;
    write_encoded(w, &t.data, f64::to_le_bytes)
}

/// Writes `t` as a 2-D little-endian `<i8` (int64) array.
pub(crate) fn write_i64(w: &mut impl Write, t: &Table<i64>) -> std::io::Result<()> {
    write_header(w, DType::le(Scalar::I64), t.rows, t.cols)?;
    write_encoded(w, &t.data, i64::to_le_bytes)
}

/// The header of the npy file held in `bytes`, its dtype as written (`<U5` included), and the
/// byte offset of the data. For readers of small arrays held in memory (labels).
pub(crate) fn raw_header(bytes: &[u8], name: &str) -> Result<(header::RawHeader, usize), IoError> {
    let invalid = |msg: String| IoError::invalid(name, msg);
    if !bytes.starts_with(MAGIC) {
        return Err(invalid(
            "not an npy file (it does not start with \\x93NUMPY)".to_owned(),
        ));
    }
    let (len_bytes, start) = match bytes.get(6..8) {
        Some([1, 0]) => (2, 10usize),
        Some([2 | 3, 0]) => (4, 12),
        Some([major, minor]) => {
            return Err(invalid(format!(
                "npy format version {major}.{minor} is not supported (1.0, 2.0 and 3.0 are)"
            )));
        }
        _ => {
            return Err(invalid(
                "truncated: the npy preamble is incomplete".to_owned(),
            ));
        }
    };
    let Some(field) = bytes.get(8..8 + len_bytes) else {
        return Err(invalid(
            "truncated: the npy preamble is incomplete".to_owned(),
        ));
    };
    let header_len = field
        .iter()
        .rev()
        .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
    let Some(text) = bytes.get(start..start.saturating_add(header_len)) else {
        return Err(invalid(format!(
            "truncated: the npy header at byte {start} needs {header_len} bytes, {} remain",
            bytes.len() - start.min(bytes.len())
        )));
    };
    let raw = header::parse_raw(text).map_err(|e| invalid(format!("bad npy header: {e}")))?;
    Ok((raw, start + header_len))
}

/// Parses a numeric `descr` (`<f4`, `>i8`, ...).
pub(crate) fn header_descr(descr: &str) -> Result<DType, String> {
    header::parse_descr(descr)
}

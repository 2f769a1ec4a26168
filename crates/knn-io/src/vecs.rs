//! fvecs, ivecs and bvecs: the TEXMEX / ANN_SIFT1M record formats.
//!
//! Each record is a little-endian `i32` dimension `d` followed by `d` values: `f32` (fvecs),
//! `i32` (ivecs) or `u8` (bvecs). All records of a file have the same `d >= 1`.

use std::io::{Read, Write};

use crate::dtype::{read_elements, DType, Element, ReadError, Scalar};
use crate::{Format, IoError, Table};

/// Bytes buffered before a `write` call while encoding records.
const WRITE_CHUNK_BYTES: usize = 1 << 20;

/// The element type a vecs format stores.
fn scalar_of(format: Format) -> Scalar {
    match format {
        Format::Ivecs => Scalar::I32,
        Format::Bvecs => Scalar::U8,
        _ => Scalar::F32,
    }
}

/// Reads a whole fvecs/ivecs/bvecs file of `len` bytes from `src`, record by record, so the
/// only copy of the values held in memory is the output. An empty input is a 0 x 0 table.
pub(crate) fn read<T: Element>(
    src: &mut impl Read,
    len: usize,
    format: Format,
    name: &str,
) -> Result<Table<T>, IoError> {
    read_records(src, len, format, name, None)
}

/// Values handed to a [`read_records`] sink at a time (a few MB).
const SINK_VALUES: usize = 1 << 20;

/// Where [`read_records`] hands the values it reads, in order.
pub(crate) type Sink<'a, T> = &'a mut dyn FnMut(&[T]) -> std::io::Result<()>;

/// [`read`], with the values handed to `sink` (when given) in order, about [`SINK_VALUES`] at
/// a time, instead of kept: the table returned then holds no data, only the shape.
pub(crate) fn read_records<T: Element>(
    src: &mut impl Read,
    len: usize,
    format: Format,
    name: &str,
    mut sink: Option<Sink<'_, T>>,
) -> Result<Table<T>, IoError> {
    let scalar = scalar_of(format);
    if !T::accepts(scalar) {
        return Err(IoError::invalid(
            name,
            format!(
                "format {format} holds floating-point values; {} need ivecs, bvecs, an \
                 integer npy or CSV",
                T::WHAT
            ),
        ));
    }
    if len == 0 {
        return Ok(Table::new(Vec::new(), 0, 0));
    }
    let io = |e| IoError::io(name, e);
    let elem = scalar.size();
    let mut dim = [0u8; 4];
    if len < 4 {
        return Err(IoError::invalid(
            name,
            format!("truncated: record 0 at byte 0 needs at least 4 bytes, {len} remain"),
        ));
    }
    src.read_exact(&mut dim).map_err(io)?;
    let first = i32::from_le_bytes(dim);
    if first < 1 {
        return Err(IoError::invalid(
            name,
            format!("record 0 at byte 0: dimension {first} is not positive"),
        ));
    }
    // d <= i32::MAX, so 4 + d * 8 cannot overflow a 64-bit usize; checked for 32-bit targets.
    let cols = first as usize;
    let record = cols
        .checked_mul(elem)
        .and_then(|n| n.checked_add(4))
        .ok_or_else(|| {
            IoError::invalid(
                name,
                format!("record 0 at byte 0: dimension {first} is too large for this machine"),
            )
        })?;
    let rows = len / record;
    let tail = len % record;
    // rows * cols * elem <= len: the allocation is bounded by the input.
    let mut data = Vec::with_capacity(if sink.is_some() {
        SINK_VALUES + cols
    } else {
        rows * cols
    });
    let mut scratch = Vec::new();
    let dtype = DType::le(scalar);
    for r in 0..rows {
        let offset = r * record;
        if r > 0 {
            src.read_exact(&mut dim).map_err(io)?;
            let d = i32::from_le_bytes(dim);
            if d != first {
                return Err(dimension_mismatch(name, r, offset, d, first));
            }
        }
        read_elements(src, dtype, cols, &mut data, &mut scratch).map_err(|e| match e {
            ReadError::Io(e) => io(e),
            ReadError::Bad(i, bad) => IoError::invalid(
                name,
                format!(
                    "record {r} at byte {offset}, element {i} (byte {}): {bad}",
                    offset + 4 + i * elem
                ),
            ),
        })?;
        if let Some(f) = sink.as_mut() {
            if data.len() >= SINK_VALUES || r + 1 == rows {
                f(&data).map_err(io)?;
                data.clear();
            }
        }
    }
    if tail != 0 {
        let offset = rows * record;
        // A dimension that differs says more than "truncated"; the first record's was read.
        if tail >= 4 && rows > 0 {
            src.read_exact(&mut dim).map_err(io)?;
            let d = i32::from_le_bytes(dim);
            if d != first {
                return Err(dimension_mismatch(name, rows, offset, d, first));
            }
        }
        return Err(IoError::invalid(
            name,
            format!(
                "truncated: record {rows} at byte {offset} needs {record} bytes, {tail} remain"
            ),
        ));
    }
    if sink.is_some() {
        return Ok(Table { data, rows, cols });
    }
    Ok(Table::new(data, rows, cols))
}

fn dimension_mismatch(name: &str, r: usize, offset: usize, d: i32, first: i32) -> IoError {
    IoError::invalid(
        name,
        format!(
            "record {r} at byte {offset}: dimension {d} differs from the first record's {first}"
        ),
    )
}

/// Checks that `t` can be stored as records: a 0-row table is an empty file; otherwise every
/// record needs a dimension in `1..=i32::MAX`.
pub(crate) fn check_writable<T>(t: &Table<T>, format: Format, name: &str) -> Result<(), IoError> {
    if t.rows > 0 && (t.cols == 0 || i32::try_from(t.cols).is_err()) {
        return Err(IoError::invalid(
            name,
            format!(
                "format {format} cannot hold rows of {} values (the dimension must be 1..=2^31-1)",
                t.cols
            ),
        ));
    }
    Ok(())
}

/// Writes `t` as records, each value encoded by `encode`. `check_writable` must have passed.
pub(crate) fn write<T: Copy, const N: usize>(
    w: &mut impl Write,
    t: &Table<T>,
    encode: impl Fn(T) -> [u8; N],
) -> std::io::Result<()> {
    if t.rows == 0 || t.cols == 0 {
        return Ok(());
    }
    let dim = (t.cols as u32).to_le_bytes();
    let mut buf: Vec<u8> = Vec::with_capacity(WRITE_CHUNK_BYTES + 4 + N * 1024);
    for row in t.data.chunks_exact(t.cols) {
        buf.extend_from_slice(&dim);
        for part in row.chunks(1024) {
            for &v in part {
                buf.extend_from_slice(&encode(v));
            }
            if buf.len() >= WRITE_CHUNK_BYTES {
                w.write_all(&buf)?;
                buf.clear();
            }
        }
    }
    w.write_all(&buf)
}

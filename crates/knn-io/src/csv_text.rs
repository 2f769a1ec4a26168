//! CSV: one row of comma-separated numbers per line.
//!
//! Spaces and tabs around values are ignored, values may be enclosed in double quotes (which
//! may not contain commas or line breaks: cells hold numbers), line ends may be `\n` or
//! `\r\n`, a UTF-8 byte order mark is skipped, blank lines are skipped. If the first line has a
//! cell that is neither empty nor a number it is a header and is skipped. Every other line must
//! have as many cells as the first data line.

use std::io::Write;

use crate::{IoError, Table};

/// Longest cell text quoted in an error message.
const MAX_QUOTED_CELL: usize = 40;

/// How a CSV cell becomes a value.
pub(crate) trait CsvCell: Sized + Copy {
    /// Parses a trimmed cell; on failure says why (`"is not a number"`), to follow the text.
    fn parse_cell(text: &str) -> Result<Self, &'static str>;
}

impl CsvCell for f32 {
    fn parse_cell(text: &str) -> Result<f32, &'static str> {
        match text.parse::<f32>() {
            Ok(v) if v.is_infinite() && !is_infinity_literal(text) => {
                Err("is beyond the f32 range")
            }
            Ok(v) => Ok(v),
            Err(_) => Err("is not a number"),
        }
    }
}

impl CsvCell for i64 {
    fn parse_cell(text: &str) -> Result<i64, &'static str> {
        use std::num::IntErrorKind;
        match text.parse::<i64>() {
            Ok(v) => Ok(v),
            Err(e)
                if matches!(
                    e.kind(),
                    IntErrorKind::PosOverflow | IntErrorKind::NegOverflow
                ) =>
            {
                Err("does not fit in i64")
            }
            Err(_) if text.parse::<f64>().is_ok() => Err("is not an integer"),
            Err(_) => Err("is not a number"),
        }
    }
}

/// `inf`, `infinity` with optional sign, any case: the texts that mean an infinite value.
fn is_infinity_literal(text: &str) -> bool {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    unsigned.eq_ignore_ascii_case("inf") || unsigned.eq_ignore_ascii_case("infinity")
}

fn is_number(cell: &[u8]) -> bool {
    std::str::from_utf8(cell).is_ok_and(|s| s.parse::<f64>().is_ok())
}

fn quoted(text: &str) -> String {
    if text.chars().count() <= MAX_QUOTED_CELL {
        format!("'{text}'")
    } else {
        let head: String = text.chars().take(MAX_QUOTED_CELL).collect();
        format!("'{head}...'")
    }
}

/// Whitespace around a cell, then one pair of enclosing double quotes, are removed.
fn clean_cell(cell: &[u8]) -> &[u8] {
    match cell.trim_ascii() {
        [b'"', inner @ .., b'"'] => inner.trim_ascii(),
        trimmed => trimmed,
    }
}

/// Reads a CSV table. An input with no data lines is 0 rows of `c` columns, `c` being the
/// header's cell count (0 when there is no header).
pub(crate) fn read<T: CsvCell>(bytes: &[u8], name: &str) -> Result<Table<T>, IoError> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let mut data = Vec::new();
    let mut rows = 0usize;
    let mut header_cols = 0usize;
    // Column count and line number of the first data line.
    let mut shape: Option<(usize, usize)> = None;
    let mut first_line = true;
    for (index, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let line_no = index + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(|&b| b == b' ' || b == b'\t') {
            continue;
        }
        let cells = line.split(|&b| b == b',').map(clean_cell);
        if std::mem::take(&mut first_line) && cells.clone().any(|c| !c.is_empty() && !is_number(c))
        {
            header_cols = cells.count();
            continue;
        }
        let count = cells.clone().count();
        match shape {
            None => shape = Some((count, line_no)),
            Some((cols, first)) if cols != count => {
                return Err(IoError::invalid(
                    name,
                    format!(
                        "line {line_no}: {count} columns, but the first data line ({first}) has \
                         {cols}"
                    ),
                ))
            }
            Some(_) => {}
        }
        for (j, cell) in cells.enumerate() {
            let at = || format!("line {line_no}, column {}", j + 1);
            let text = std::str::from_utf8(cell)
                .map_err(|_| IoError::invalid(name, format!("{}: not valid UTF-8", at())))?;
            let value = T::parse_cell(text).map_err(|reason| {
                IoError::invalid(name, format!("{}: {} {reason}", at(), quoted(text)))
            })?;
            data.push(value);
        }
        rows += 1;
    }
    let cols = shape.map_or(header_cols, |(c, _)| c);
    Ok(Table::new(data, rows, cols))
}

/// Writes rows of values separated by commas, `\n` after each row, no header.
fn write_rows<T: Copy>(
    w: &mut impl Write,
    t: &Table<T>,
    mut put: impl FnMut(&mut Vec<u8>, T),
) -> std::io::Result<()> {
    if t.cols == 0 {
        return Ok(());
    }
    let mut buf = Vec::with_capacity(1 << 20);
    for row in t.data.chunks_exact(t.cols) {
        for (j, &v) in row.iter().enumerate() {
            if j > 0 {
                buf.push(b',');
            }
            put(&mut buf, v);
        }
        buf.push(b'\n');
        if buf.len() >= 1 << 20 {
            w.write_all(&buf)?;
            buf.clear();
        }
    }
    w.write_all(&buf)
}

/// Writes `f32` values in the shortest text that reads back to the same value
/// (`NaN`, `inf`, `-inf` for the non-finite ones).
pub(crate) fn write_f32(w: &mut impl Write, t: &Table<f32>) -> std::io::Result<()> {
    let mut fmt = ryu::Buffer::new();
    write_rows(w, t, |buf, v| {
        if v.is_finite() {
            buf.extend_from_slice(fmt.format_finite(v).as_bytes());
        } else if v.is_nan() {
            buf.extend_from_slice(b"NaN");
        } else if v > 0.0 {
            buf.extend_from_slice(b"inf");
        } else {
            buf.extend_from_slice(b"-inf");
        }
    })
}

/// Writes integers in decimal.
pub(crate) fn write_i64(w: &mut impl Write, t: &Table<i64>) -> std::io::Result<()> {
    let mut fmt = itoa::Buffer::new();
    write_rows(w, t, |buf, v| {
        buf.extend_from_slice(fmt.format(v).as_bytes())
    })
}

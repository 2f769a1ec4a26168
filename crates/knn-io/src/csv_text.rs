//! CSV and other delimited text: one row of numbers per line.
//!
//! Values are separated by a comma, a tab, a semicolon or runs of spaces (NumPy's `savetxt`
//! default), detected from the first lines unless [`CsvOptions::delimiter`] says which.
//! Spaces and tabs around values are ignored, values may be enclosed in double quotes (which
//! may not contain the delimiter or line breaks: cells hold numbers), line ends may be `\n` or
//! `\r\n`, a UTF-8 byte order mark is skipped, blank lines are skipped. The first line is a
//! header (skipped) when none of its cells is a number, or when [`Header::Present`] says so.
//! Every other line must have as many cells as the first data line. Positions in messages are
//! `line L, column C`, both counted from 1 as editors count them.

use std::fmt;
use std::io::Write;
use std::str::FromStr;

use crate::{IoError, Table};

/// Longest cell text quoted in an error message.
const MAX_QUOTED_CELL: usize = 40;

/// Lines looked at to detect the delimiter.
const SNIFF_LINES: usize = 32;

/// Whether the first line of a text file is a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Header {
    /// A header when none of its cells is a number (`x,y` is one; `1,NA` is data, and an error).
    #[default]
    Auto,
    /// The first line is a header, whatever it holds.
    Present,
    /// The first line is data.
    Absent,
}

/// What separates the values of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delimiter {
    /// One byte: `,` `;` tab, `|` ...; two in a row make an empty (invalid) cell.
    Byte(u8),
    /// Runs of spaces and tabs, as NumPy's `savetxt` writes by default.
    Whitespace,
}

impl Delimiter {
    /// The delimiters detected when none is given, in the order they are preferred.
    const DETECTED: [Delimiter; 4] = [
        Delimiter::Byte(b','),
        Delimiter::Byte(b'\t'),
        Delimiter::Byte(b';'),
        Delimiter::Whitespace,
    ];

    /// How to write this delimiter as a `--delimiter` value.
    pub fn flag_value(self) -> String {
        match self {
            Delimiter::Byte(b'\t') => "tab".to_owned(),
            Delimiter::Byte(b' ') | Delimiter::Whitespace => "space".to_owned(),
            Delimiter::Byte(b) => format!("'{}'", b as char),
        }
    }

    /// Splits a line into its cells (trimmed, enclosing quotes removed) into `cells`.
    fn split<'a>(self, line: &'a [u8], cells: &mut Vec<&'a [u8]>) {
        cells.clear();
        match self {
            Delimiter::Byte(d) => cells.extend(line.split(move |&b| b == d).map(clean_cell)),
            Delimiter::Whitespace => cells.extend(
                line.split(|&b| b == b' ' || b == b'\t')
                    .filter(|c| !c.is_empty())
                    .map(clean_cell),
            ),
        }
    }
}

impl fmt::Display for Delimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Delimiter::Byte(b'\t') => f.write_str("tab"),
            Delimiter::Byte(b) => write!(f, "'{}'", *b as char),
            Delimiter::Whitespace => f.write_str("spaces"),
        }
    }
}

/// A delimiter that names none.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "'{given}' is not a delimiter: give one character (',' ';' '|' ...), tab, or space (runs \
     of spaces and tabs)"
)]
pub struct ParseDelimiterError {
    /// The text that was given.
    pub given: String,
}

impl FromStr for Delimiter {
    type Err = ParseDelimiterError;

    /// One ASCII character other than a digit, letter, `.`, `+`, `-` or quote (`,` `;` `|`),
    /// `tab` or `\t`, `space` or `whitespace` (runs of spaces and tabs), `comma`, `semicolon`.
    fn from_str(s: &str) -> Result<Delimiter, ParseDelimiterError> {
        let err = || ParseDelimiterError {
            given: s.to_owned(),
        };
        match s.to_ascii_lowercase().as_str() {
            "tab" | "\\t" | "\t" => Ok(Delimiter::Byte(b'\t')),
            "space" | "spaces" | "whitespace" | " " => Ok(Delimiter::Whitespace),
            "comma" => Ok(Delimiter::Byte(b',')),
            "semicolon" => Ok(Delimiter::Byte(b';')),
            other => match other.as_bytes() {
                [b] if b.is_ascii_punctuation() && !matches!(b, b'.' | b'+' | b'-' | b'"') => {
                    Ok(Delimiter::Byte(*b))
                }
                _ => Err(err()),
            },
        }
    }
}

/// How to read a text file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CsvOptions {
    /// Whether the first line is a header.
    pub header: Header,
    /// The delimiter; `None` detects it from the first lines.
    pub delimiter: Option<Delimiter>,
    /// Refuse NaN and infinite values, naming their line and column (data points need finite
    /// coordinates; distances read back may be infinite).
    pub finite_only: bool,
}

/// How a CSV cell becomes a value.
pub(crate) trait CsvCell: Sized + Copy {
    /// Parses a trimmed cell; on failure says why (`"is not a number"`), to follow the text.
    fn parse_cell(text: &str) -> Result<Self, &'static str>;
    /// Whether the value is finite (integers always are).
    fn is_finite(self) -> bool;
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
    fn is_finite(self) -> bool {
        f32::is_finite(self)
    }
}

impl CsvCell for f64 {
    fn parse_cell(text: &str) -> Result<f64, &'static str> {
        match text.parse::<f64>() {
            Ok(v) if v.is_infinite() && !is_infinity_literal(text) => {
                Err("is beyond the f64 range")
            }
            Ok(v) => Ok(v),
            Err(_) => Err("is not a number"),
        }
    }
    fn is_finite(self) -> bool {
        f64::is_finite(self)
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
    fn is_finite(self) -> bool {
        true
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

/// The non-blank lines of a text, with their line numbers (from 1), `\r` removed.
fn lines(bytes: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .map(|(i, line)| (i + 1, line.strip_suffix(b"\r").unwrap_or(line)))
        .filter(|(_, line)| !line.iter().all(|&b| b == b' ' || b == b'\t'))
}

/// The delimiter of a text, from its first lines: of comma, tab, semicolon and runs of spaces,
/// the first that splits every data line sampled into the same number (two or more) of cells,
/// preferring one whose cells are all numbers. A file of one column reads as comma-separated.
fn detect(bytes: &[u8]) -> Delimiter {
    let sample: Vec<&[u8]> = lines(bytes).take(SNIFF_LINES).map(|(_, l)| l).collect();
    // The first line may be a header with other cells than the data; judge by the data lines.
    let data = if sample.len() > 1 {
        &sample[1..]
    } else {
        &sample[..]
    };
    let mut cells = Vec::new();
    let mut consistent = None;
    for d in Delimiter::DETECTED {
        let mut count = None;
        let mut numbers = true;
        let mut same = true;
        for line in data {
            d.split(line, &mut cells);
            numbers &= cells.iter().all(|c| is_number(c));
            same &= *count.get_or_insert(cells.len()) == cells.len();
        }
        if same && count.is_some_and(|c| c >= 2) {
            if numbers {
                return d;
            }
            consistent = consistent.or(Some(d));
        }
    }
    consistent.unwrap_or(Delimiter::Byte(b','))
}

/// A hint for a cell that is not a number but holds several numbers separated by another
/// delimiter: the delimiter to give.
fn delimiter_hint(cell: &[u8], used: Delimiter) -> String {
    let mut parts = Vec::new();
    for d in Delimiter::DETECTED {
        if d == used || matches!((d, used), (Delimiter::Whitespace, Delimiter::Byte(b'\t'))) {
            continue;
        }
        d.split(cell, &mut parts);
        if parts.len() >= 2 && parts.iter().all(|p| is_number(p)) {
            return format!(
                " (it holds {} numbers separated by {d}: is that the delimiter? Say so with \
                 --delimiter {})",
                parts.len(),
                d.flag_value()
            );
        }
    }
    String::new()
}

/// Reads a delimited text table. An input with no data lines is 0 rows of `c` columns, `c`
/// being the header's cell count (0 when there is no header).
pub(crate) fn read<T: CsvCell>(
    bytes: &[u8],
    name: &str,
    options: &CsvOptions,
) -> Result<Table<T>, IoError> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let delimiter = options.delimiter.unwrap_or_else(|| detect(bytes));
    let mut data = Vec::new();
    let mut rows = 0usize;
    let mut header_cols = 0usize;
    // Column count and line number of the first data line.
    let mut shape: Option<(usize, usize)> = None;
    let mut first_line = true;
    let mut cells = Vec::new();
    for (line_no, line) in lines(bytes) {
        delimiter.split(line, &mut cells);
        if std::mem::take(&mut first_line) {
            let header = match options.header {
                Header::Present => true,
                Header::Absent => false,
                // A cell of numbers in another delimiter (`1;2` read with commas) counts as
                // numbers: the line is data, and its error names the delimiter.
                Header::Auto => {
                    cells.iter().any(|c| !c.is_empty())
                        && !cells
                            .iter()
                            .any(|c| is_number(c) || !delimiter_hint(c, delimiter).is_empty())
                }
            };
            if header {
                header_cols = cells.len();
                continue;
            }
        }
        let count = cells.len();
        match shape {
            None => shape = Some((count, line_no)),
            Some((cols, first)) if cols != count => {
                return Err(IoError::invalid(
                    name,
                    format!(
                        "line {line_no}: {count} columns, but the first data line ({first}) has \
                         {cols} (delimiter: {delimiter})"
                    ),
                ))
            }
            Some(_) => {}
        }
        for (j, cell) in cells.iter().enumerate() {
            let at = || format!("line {line_no}, column {}", j + 1);
            let text = std::str::from_utf8(cell)
                .map_err(|_| IoError::invalid(name, format!("{}: not valid UTF-8", at())))?;
            let value = T::parse_cell(text).map_err(|reason| {
                let hint = if reason == "is not a number" {
                    delimiter_hint(cell, delimiter)
                } else {
                    String::new()
                };
                IoError::invalid(name, format!("{}: {} {reason}{hint}", at(), quoted(text)))
            })?;
            if options.finite_only && !value.is_finite() {
                return Err(IoError::invalid(
                    name,
                    format!(
                        "{}: {} is not a finite number (points need finite coordinates)",
                        at(),
                        quoted(text)
                    ),
                ));
            }
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
    write_floats(w, t)
}

/// Writes `f64` values in the shortest text that reads back to the same `f64` (up to 17
/// significant digits), as [`write_f32`] does for `f32`.
pub(crate) fn write_f64(w: &mut impl Write, t: &Table<f64>) -> std::io::Result<()> {
    write_floats(w, t)
}

/// A float type written as text: `f32` or `f64`.
trait FloatText: ryu::Float + Copy {
    fn class(self) -> FloatClass;
}

enum FloatClass {
    Finite,
    Nan,
    PosInf,
    NegInf,
}

impl FloatText for f32 {
    fn class(self) -> FloatClass {
        f64::from(self).class()
    }
}

impl FloatText for f64 {
    fn class(self) -> FloatClass {
        match self {
            v if v.is_finite() => FloatClass::Finite,
            v if v.is_nan() => FloatClass::Nan,
            v if v > 0.0 => FloatClass::PosInf,
            _ => FloatClass::NegInf,
        }
    }
}

fn write_floats<T: FloatText>(w: &mut impl Write, t: &Table<T>) -> std::io::Result<()> {
    let mut fmt = ryu::Buffer::new();
    write_rows(w, t, |buf, v| {
        let text: &[u8] = match v.class() {
            FloatClass::Finite => fmt.format_finite(v).as_bytes(),
            FloatClass::Nan => b"NaN",
            FloatClass::PosInf => b"inf",
            FloatClass::NegInf => b"-inf",
        };
        buf.extend_from_slice(text);
    })
}

/// Writes integers in decimal.
pub(crate) fn write_i64(w: &mut impl Write, t: &Table<i64>) -> std::io::Result<()> {
    let mut fmt = itoa::Buffer::new();
    write_rows(w, t, |buf, v| {
        buf.extend_from_slice(fmt.format(v).as_bytes())
    })
}

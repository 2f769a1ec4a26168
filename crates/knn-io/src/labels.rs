//! Class labels, one per point, as scikit-learn takes them: integers, floating-point numbers or
//! text.
//!
//! Read from npy (a 1-D array, or one column or one row of a 2-D one; `<U` unicode and `|S`
//! byte strings give text, numbers give integers or floats), CSV (one label per line, or all in
//! one row; a first line that is not a number above lines that all are is a header, unless
//! [`CsvOptions::header`] says; cells separated by commas unless [`CsvOptions::delimiter`]
//! names another), ivecs and bvecs (integers). Written as a 1-D npy array of the same kind (`<i8`, `<f8`, `<U`n), CSV one
//! label per line (quoted where needed), or ivecs (integers within `i32`).

use std::io::Write;
use std::path::Path;

use crate::output::{write_atomically, write_encoded};
use crate::{npy, resolve, CsvOptions, Delimiter, Format, Header, IoError, Table};

/// Labels as a file holds them.
#[derive(Debug, Clone, PartialEq)]
pub enum Labels {
    /// Whole numbers (npy integer dtypes, CSV cells that are all decimal integers).
    Int(Vec<i64>),
    /// Floating-point numbers, finite (npy float dtypes, CSV cells that are all numbers and not
    /// all integers, such as `1.0`).
    Float(Vec<f64>),
    /// Text (npy `<U`/`|S` arrays, CSV cells that are not all numbers).
    Text(Vec<String>),
}

impl Labels {
    /// Number of labels.
    pub fn len(&self) -> usize {
        match self {
            Labels::Int(v) => v.len(),
            Labels::Float(v) => v.len(),
            Labels::Text(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the labels are, for messages: `integers`, `floating-point numbers` or `text`.
    pub fn kind(&self) -> &'static str {
        match self {
            Labels::Int(_) => "integers",
            Labels::Float(_) => "floating-point numbers",
            Labels::Text(_) => "text",
        }
    }

    /// Label `i` as text: integers in decimal, floats in the shortest form that reads back to
    /// the same value and shows it is a float (`1.0`, `0.25`), text as it is.
    pub fn text(&self, i: usize) -> String {
        match self {
            Labels::Int(v) => v[i].to_string(),
            Labels::Float(v) => format!("{:?}", v[i]),
            Labels::Text(v) => v[i].clone(),
        }
    }

    /// Label `i` as a CSV cell: [`Labels::text`], quoted (`"a,b"`, `"say ""hi"""`) when it
    /// holds a comma, a quote, a line break or spaces at either end, or is empty.
    pub fn csv_cell(&self, i: usize) -> String {
        let t = self.text(i);
        let plain =
            !t.is_empty() && t.trim() == t && !t.contains([',', '"', '\n', '\r', ';', '\t']);
        if plain {
            t
        } else {
            format!("\"{}\"", t.replace('"', "\"\""))
        }
    }

    /// Labels from text cells: integers when every cell is a decimal integer, floats when every
    /// cell is a finite number, text otherwise.
    pub fn from_cells(cells: Vec<String>) -> Labels {
        if let Ok(v) = cells.iter().map(|c| c.parse::<i64>()).collect() {
            return Labels::Int(v);
        }
        let floats: Option<Vec<f64>> = cells
            .iter()
            .map(|c| c.parse::<f64>().ok().filter(|v| v.is_finite()))
            .collect();
        match floats {
            Some(v) => Labels::Float(v),
            None => Labels::Text(cells),
        }
    }
}

/// Reads labels from `path`, in `format` or the one its extension names.
pub fn read_labels(path: &Path, format: Option<Format>) -> Result<Labels, IoError> {
    read_labels_with(path, format, &CsvOptions::default())
}

/// [`read_labels`] of a text file with the header and delimiter of `csv` (`finite_only` does
/// not apply: labels may be any text).
pub fn read_labels_with(
    path: &Path,
    format: Option<Format>,
    csv: &CsvOptions,
) -> Result<Labels, IoError> {
    let format = resolve(path, format)?;
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| IoError::io(&name, e))?;
    read_labels_from_bytes_with(&bytes, format, csv, &name)
}

/// [`read_labels`] on the bytes of a file held in memory; `name_for_errors` starts every error.
pub fn read_labels_from_bytes(
    bytes: &[u8],
    format: Format,
    name_for_errors: &str,
) -> Result<Labels, IoError> {
    read_labels_from_bytes_with(bytes, format, &CsvOptions::default(), name_for_errors)
}

/// [`read_labels_with`] on the bytes of a file held in memory.
pub fn read_labels_from_bytes_with(
    bytes: &[u8],
    format: Format,
    csv: &CsvOptions,
    name_for_errors: &str,
) -> Result<Labels, IoError> {
    let name = name_for_errors;
    match format {
        Format::Csv => csv_labels(bytes, name, csv),
        Format::Npy => npy_labels(bytes, name),
        Format::Ivecs | Format::Bvecs => {
            let t = crate::read_i64_from_bytes(bytes, format, name)?;
            Ok(Labels::Int(one_per_point(t, name)?))
        }
        Format::Fvecs => {
            let t = crate::read_f32_from_bytes(bytes, format, name)?;
            let t = Table::new(
                t.data.iter().map(|&v| f64::from(v)).collect(),
                t.rows,
                t.cols,
            );
            Ok(Labels::Float(one_per_point(t, name)?))
        }
    }
}

/// The values of a table that is one column or one row.
fn one_per_point<T>(t: Table<T>, name: &str) -> Result<Vec<T>, IoError> {
    if t.cols == 1 || t.rows <= 1 {
        return Ok(t.data);
    }
    Err(IoError::invalid(
        name,
        format!(
            "holds a table of {} x {}; labels are one per point: a 1-D array, one column or one row",
            t.rows, t.cols
        ),
    ))
}

/// The cells of one CSV line (separated by `delimiter`, double quotes around cells that need
/// them). `Err(column)` (from 1) for a quote that is not closed.
fn csv_line(line: &str, delimiter: Delimiter) -> Result<Vec<String>, usize> {
    let (line, is_sep): (&str, &dyn Fn(char) -> bool) = match delimiter {
        Delimiter::Byte(b) => (line, &move |c| c == b as char),
        Delimiter::Whitespace => (line.trim(), &|c| c == ' ' || c == '\t'),
    };
    // Spaces around cells are dropped; a tab is not when it separates cells.
    let pad = |c: char| c == ' ' || c == '\t' && !matches!(delimiter, Delimiter::Byte(b'\t'));
    let mut cells = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|&c| pad(c)) {
            chars.next();
        }
        let mut cell = String::new();
        let quoted = chars.next_if_eq(&'"').is_some();
        if quoted {
            loop {
                match chars.next() {
                    None => return Err(cells.len() + 1),
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        cell.push('"');
                    }
                    Some('"') => break,
                    Some(c) => cell.push(c),
                }
            }
        }
        // The cell runs to the next delimiter; after a closing quote, anything before that
        // delimiter is kept, as CSV readers do.
        while let Some(c) = chars.next_if(|&c| !is_sep(c)) {
            cell.push(c);
        }
        cells.push(if quoted { cell.trim_end() } else { cell.trim() }.to_owned());
        if chars.next().is_none() {
            return Ok(cells);
        }
    }
}

fn csv_labels(bytes: &[u8], name: &str, options: &CsvOptions) -> Result<Labels, IoError> {
    let delimiter = options.delimiter.unwrap_or(Delimiter::Byte(b','));
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let mut lines: Vec<(usize, Vec<String>)> = Vec::new();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let text = std::str::from_utf8(line).map_err(|e| {
            IoError::invalid(
                name,
                format!(
                    "line {}, byte {}: not UTF-8 text",
                    i + 1,
                    e.valid_up_to() + 1
                ),
            )
        })?;
        if text.trim().is_empty() {
            continue;
        }
        let cells = csv_line(text, delimiter).map_err(|c| {
            IoError::invalid(
                name,
                format!("line {}, column {c}: a quote is not closed", i + 1),
            )
        })?;
        lines.push((i + 1, cells));
    }
    if options.header == Header::Present && !lines.is_empty() {
        lines.remove(0);
    }
    let mut cells: Vec<String> = match &lines[..] {
        [] => Vec::new(),
        [(_, row)] => row.clone(),
        _ => {
            if let Some((line, row)) = lines.iter().find(|(_, r)| r.len() != 1) {
                return Err(IoError::invalid(
                    name,
                    format!(
                        "line {line} has {} cells; labels are one per line (or all in one row)",
                        row.len()
                    ),
                ));
            }
            lines.into_iter().flat_map(|(_, r)| r).collect()
        }
    };
    let number = |c: &String| c.parse::<f64>().is_ok();
    let auto = options.header == Header::Auto;
    if auto && cells.len() > 1 && !number(&cells[0]) && cells[1..].iter().all(number) {
        cells.remove(0); // a header above numbers
    }
    Ok(Labels::from_cells(cells))
}

fn npy_labels(bytes: &[u8], name: &str) -> Result<Labels, IoError> {
    let invalid = |msg: String| IoError::invalid(name, msg);
    let (raw, start) = npy::raw_header(bytes, name)?;
    let n = match raw.shape[..] {
        [n] => n,
        [r, c] if r <= 1 || c == 1 => r * c,
        _ => {
            return Err(invalid(format!(
                "holds an array of shape {:?}; labels are one per point: a 1-D array, one column \
                 or one row",
                raw.shape
            )));
        }
    };
    let n = usize::try_from(n).map_err(|_| invalid(format!("{n} labels are too many")))?;
    let descr = raw.descr.as_str();
    let (order, kind, size) = match descr.as_bytes() {
        [o @ (b'<' | b'>' | b'|' | b'='), k, rest @ ..] => (*o, *k, rest),
        [k, rest @ ..] => (b'=', *k, rest),
        [] => return Err(invalid("bad npy header: an empty 'descr'".to_owned())),
    };
    let size: usize = std::str::from_utf8(size)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let data = &bytes[start.min(bytes.len())..];
    let big = order == b'>' || (order == b'=' && cfg!(target_endian = "big"));
    let element = match kind {
        b'U' => 4 * size,
        b'S' | b'a' => size,
        b'O' => {
            return Err(invalid(
                "holds Python objects (dtype object), which cannot be read without running \
                 Python; save the labels as text (labels.astype(str)) or numbers"
                    .to_owned(),
            ));
        }
        _ => {
            let dtype = crate::npy::header_descr(descr).map_err(invalid)?;
            if !dtype.scalar.is_float() {
                let t = crate::read_i64_from_bytes(bytes, Format::Npy, name)?;
                return Ok(Labels::Int(t.data));
            }
            dtype.scalar.size()
        }
    };
    let needed = n
        .checked_mul(element)
        .ok_or_else(|| invalid("too large".to_owned()))?;
    if data.len() != needed {
        return Err(invalid(format!(
            "the data at byte {start} holds {} bytes; {n} labels of dtype '{descr}' need {needed}",
            data.len()
        )));
    }
    if element == 0 {
        return Ok(Labels::Text(vec![String::new(); n]));
    }
    let chunks = data.chunks_exact(element);
    match kind {
        b'U' => {
            let mut out = Vec::with_capacity(n);
            for (i, c) in chunks.enumerate() {
                let mut s = String::with_capacity(size);
                for unit in c.chunks_exact(4) {
                    let u = [unit[0], unit[1], unit[2], unit[3]];
                    let u = if big {
                        u32::from_be_bytes(u)
                    } else {
                        u32::from_le_bytes(u)
                    };
                    if u == 0 {
                        break;
                    }
                    s.push(char::from_u32(u).ok_or_else(|| {
                        invalid(format!(
                            "label [{i}] holds {u:#x}, which is not a character"
                        ))
                    })?);
                }
                out.push(s);
            }
            Ok(Labels::Text(out))
        }
        b'S' | b'a' => {
            let mut out = Vec::with_capacity(n);
            for (i, c) in chunks.enumerate() {
                let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
                let s = std::str::from_utf8(&c[..end])
                    .map_err(|_| invalid(format!("label [{i}] is not UTF-8 text")))?;
                out.push(s.to_owned());
            }
            Ok(Labels::Text(out))
        }
        _ => {
            let mut out = Vec::with_capacity(n);
            for (i, c) in chunks.enumerate() {
                let v = match c.len() {
                    2 => {
                        let b = [c[0], c[1]];
                        let h = if big {
                            u16::from_be_bytes(b)
                        } else {
                            u16::from_le_bytes(b)
                        };
                        f64::from(crate::dtype::f16_to_f32(h))
                    }
                    4 => {
                        let b = [c[0], c[1], c[2], c[3]];
                        f64::from(if big {
                            f32::from_be_bytes(b)
                        } else {
                            f32::from_le_bytes(b)
                        })
                    }
                    _ => {
                        let b: [u8; 8] = c.try_into().expect("8-byte elements");
                        if big {
                            f64::from_be_bytes(b)
                        } else {
                            f64::from_le_bytes(b)
                        }
                    }
                };
                if !v.is_finite() {
                    return Err(invalid(format!(
                        "label [{i}] is {v}; a class label must be a finite number"
                    )));
                }
                out.push(v);
            }
            Ok(Labels::Float(out))
        }
    }
}

/// Checks that `labels` can be stored in `format`.
fn check_writable(labels: &Labels, format: Format, name: &str) -> Result<(), IoError> {
    match (format, labels) {
        (Format::Npy | Format::Csv, _) => Ok(()),
        (Format::Ivecs, Labels::Int(v)) => {
            match v.iter().position(|&l| i32::try_from(l).is_err()) {
                Some(i) => Err(IoError::invalid(
                    name,
                    format!(
                    "label [{i}] = {} does not fit in i32 (format ivecs); name a .npy or .csv file",
                    v[i]
                ),
                )),
                None => Ok(()),
            }
        }
        (Format::Ivecs, _) => Err(IoError::invalid(
            name,
            format!(
                "the labels are {}, but format ivecs holds integers only; name a .npy or .csv file",
                labels.kind()
            ),
        )),
        (Format::Fvecs | Format::Bvecs, _) => Err(IoError::invalid(
            name,
            format!("format {format} does not hold labels; name a .npy, .csv or .ivecs file"),
        )),
    }
}

/// Encodes checked labels.
fn encode(w: &mut impl Write, labels: &Labels, format: Format) -> std::io::Result<()> {
    let n = labels.len();
    match (format, labels) {
        (Format::Npy, Labels::Int(v)) => {
            npy::write_array_header(w, "<i8", &[n])?;
            write_encoded(w, v, i64::to_le_bytes)
        }
        (Format::Npy, Labels::Float(v)) => {
            npy::write_array_header(w, "<f8", &[n])?;
            write_encoded(w, v, f64::to_le_bytes)
        }
        (Format::Npy, Labels::Text(v)) => {
            let width = v
                .iter()
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
                .max(1);
            npy::write_array_header(w, &format!("<U{width}"), &[n])?;
            let mut buf = Vec::with_capacity(4 * width);
            for s in v {
                buf.clear();
                for c in s.chars() {
                    buf.extend_from_slice(&(c as u32).to_le_bytes());
                }
                buf.resize(4 * width, 0);
                w.write_all(&buf)?;
            }
            Ok(())
        }
        (Format::Csv, _) => {
            let mut buf = String::new();
            for i in 0..n {
                buf.push_str(&labels.csv_cell(i));
                buf.push('\n');
                if buf.len() >= 1 << 20 {
                    w.write_all(buf.as_bytes())?;
                    buf.clear();
                }
            }
            w.write_all(buf.as_bytes())
        }
        (Format::Ivecs, Labels::Int(v)) => {
            for &l in v {
                w.write_all(&1i32.to_le_bytes())?;
                w.write_all(&(l as i32).to_le_bytes())?;
            }
            Ok(())
        }
        _ => unreachable!("refused by check_writable"),
    }
}

/// Writes `labels` to `path` as a 1-D array of their kind (npy `<i8`, `<f8` or `<U`n), one per
/// line (CSV) or one per record (ivecs, integers only), as [`write_i64`](crate::write_i64)
/// writes files.
pub fn write_labels(path: &Path, format: Option<Format>, labels: &Labels) -> Result<(), IoError> {
    let format = resolve(path, format)?;
    let name = path.display().to_string();
    check_writable(labels, format, &name)?;
    write_atomically(path, &name, |w| encode(w, labels, format))
}

/// [`write_labels`] into `w` (standard output, a buffer).
pub fn write_labels_to(
    w: &mut impl Write,
    format: Format,
    labels: &Labels,
    name_for_errors: &str,
) -> Result<(), IoError> {
    check_writable(labels, format, name_for_errors)?;
    let mut w = std::io::BufWriter::new(w);
    encode(&mut w, labels, format)
        .and_then(|()| w.flush())
        .map_err(|e| IoError::io(name_for_errors, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(labels: &Labels, format: Format) -> Labels {
        let mut bytes = Vec::new();
        write_labels_to(&mut bytes, format, labels, "t").unwrap();
        read_labels_from_bytes(&bytes, format, "t").unwrap()
    }

    #[test]
    fn every_kind_round_trips_through_npy_and_csv() {
        let all = [
            Labels::Int(vec![3, -1, 7]),
            Labels::Float(vec![1.0, 2.5, -0.0]),
            Labels::Text(vec![
                "setosa".into(),
                "a,b".into(),
                "say \"hi\"".into(),
                "ü".into(),
            ]),
        ];
        for l in &all {
            assert_eq!(&round_trip(l, Format::Npy), l);
            assert_eq!(&round_trip(l, Format::Csv), l);
        }
        assert_eq!(round_trip(&all[0], Format::Ivecs), all[0]);
    }

    #[test]
    fn numpy_text_layouts() {
        let mut bytes = Vec::new();
        write_labels_to(
            &mut bytes,
            Format::Npy,
            &Labels::Text(vec!["ab".into(), "c".into()]),
            "t",
        )
        .unwrap();
        let header_end = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
        let header = std::str::from_utf8(&bytes[10..header_end]).unwrap();
        assert!(
            header.contains("'descr': '<U2'") && header.contains("(2,)"),
            "{header}"
        );
        assert_eq!(bytes.len() - header_end, 2 * 2 * 4);
    }

    #[test]
    fn csv_headers_rows_and_errors() {
        let l = read_labels_from_bytes(b"label\n1\n2\n", Format::Csv, "t").unwrap();
        assert_eq!(l, Labels::Int(vec![1, 2]));
        let l = read_labels_from_bytes(b"1.0\n2.0\n", Format::Csv, "t").unwrap();
        assert_eq!(l, Labels::Float(vec![1.0, 2.0]));
        let l = read_labels_from_bytes(b"cat, dog,cat\n", Format::Csv, "t").unwrap();
        assert_eq!(
            l,
            Labels::Text(vec!["cat".into(), "dog".into(), "cat".into()])
        );
        let e = read_labels_from_bytes(b"1\n2,3\n", Format::Csv, "t").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t: line 2 has 2 cells; labels are one per line (or all in one row)"
        );
        let e = read_labels_from_bytes(b"\"open\n", Format::Csv, "t").unwrap_err();
        assert!(e.to_string().contains("line 1, column 1"), "{e}");
    }

    #[test]
    fn csv_header_and_delimiter_options() {
        let with = |bytes: &[u8], header: Header, delimiter: Option<Delimiter>| {
            let csv = CsvOptions {
                header,
                delimiter,
                ..CsvOptions::default()
            };
            read_labels_from_bytes_with(bytes, Format::Csv, &csv, "t").unwrap()
        };
        // A first line of a number is a header only when said.
        assert_eq!(
            with(b"0\n7\n3\n", Header::Present, None),
            Labels::Int(vec![7, 3])
        );
        assert_eq!(
            with(b"0\n7\n3\n", Header::Auto, None),
            Labels::Int(vec![0, 7, 3])
        );
        // A first line of text above numbers is data when said (then all are text).
        assert_eq!(
            with(b"label\n7\n", Header::Absent, None),
            Labels::Text(vec!["label".into(), "7".into()])
        );
        // One row in other delimiters; quotes keep a delimiter inside a label.
        let semi = Some(Delimiter::Byte(b';'));
        assert_eq!(
            with(b"a;\"b;c\";a\n", Header::Auto, semi),
            Labels::Text(vec!["a".into(), "b;c".into(), "a".into()])
        );
        assert_eq!(
            with(b"1,5;2\n", Header::Absent, semi),
            Labels::Text(vec!["1,5".into(), "2".into()])
        );
        let spaces = Some(Delimiter::Whitespace);
        assert_eq!(
            with(b"  1   2\t3 \n", Header::Auto, spaces),
            Labels::Int(vec![1, 2, 3])
        );
        let tab = Some(Delimiter::Byte(b'\t'));
        assert_eq!(
            with(b"x y\tz\n", Header::Auto, tab),
            Labels::Text(vec!["x y".into(), "z".into()])
        );
    }

    #[test]
    fn kinds_a_format_cannot_hold_are_refused_with_the_reason() {
        let mut out = Vec::new();
        let e = write_labels_to(
            &mut out,
            Format::Ivecs,
            &Labels::Text(vec!["a".into()]),
            "x",
        )
        .unwrap_err();
        assert!(e.to_string().contains("holds integers only"), "{e}");
        assert!(out.is_empty());
    }
}

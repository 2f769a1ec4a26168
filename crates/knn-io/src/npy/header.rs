//! The `.npy` header: a Python dict literal such as
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 128), }`.
//!
//! Parsed with a small recursive-descent reader of Python literals (strings, integers, `True`,
//! `False`, `None`, tuples, lists, dicts), so spacing, quote style, key order, trailing commas
//! and Python 2 `L` suffixes all work. Nesting is limited so hostile input cannot overflow the
//! stack.

use crate::dtype::{DType, Scalar};

/// Deepest nesting of brackets accepted in a header.
const MAX_DEPTH: usize = 16;

/// What the header says about the array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) dtype: DType,
    pub(crate) fortran_order: bool,
    pub(crate) shape: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Str(String),
    Int(i128),
    Bool(bool),
    None,
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while let Some(&c) = self.s.get(self.pos) {
            if c == b' ' || c == b'\t' || c == b'\n' || c == b'\r' {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.pos).copied()
    }

    fn err(&self, what: &str) -> String {
        format!("{what} at offset {} of the header", self.pos)
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.err(&format!("expected '{}'", c as char)))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(self.err("nesting too deep"));
        }
        match self.peek() {
            None => Err(self.err("unexpected end")),
            Some(b'\'' | b'"') => self.string().map(Value::Str),
            Some(b'(') => self.sequence(b')', depth).map(|(v, _)| Value::Tuple(v)),
            Some(b'[') => self.sequence(b']', depth).map(|(v, _)| Value::List(v)),
            Some(b'{') => self.dict(depth),
            Some(c) if c == b'-' || c == b'+' || c.is_ascii_digit() => self.int(),
            Some(c) if c.is_ascii_alphabetic() => {
                let start = self.pos;
                while self
                    .s
                    .get(self.pos)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
                {
                    self.pos += 1;
                }
                match &self.s[start..self.pos] {
                    b"True" => Ok(Value::Bool(true)),
                    b"False" => Ok(Value::Bool(false)),
                    b"None" => Ok(Value::None),
                    other => {
                        self.pos = start;
                        Err(self.err(&format!(
                            "unknown name '{}'",
                            String::from_utf8_lossy(other)
                        )))
                    }
                }
            }
            Some(c) => Err(self.err(&format!("unexpected character {:?}", c as char))),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        let start = self.pos;
        let quote = self.s[self.pos];
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            match self.s.get(self.pos).copied() {
                None => {
                    self.pos = start;
                    return Err(self.err("unterminated string"));
                }
                Some(c) if c == quote => {
                    self.pos += 1;
                    // Version 1 and 2 headers are latin-1; the values we use are ASCII.
                    return Ok(out.iter().map(|&b| b as char).collect());
                }
                Some(b'\\') => {
                    let Some(&next) = self.s.get(self.pos + 1) else {
                        self.pos = start;
                        return Err(self.err("unterminated string"));
                    };
                    out.push(next);
                    self.pos += 2;
                }
                Some(c) => {
                    out.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    fn int(&mut self) -> Result<Value, String> {
        let start = self.pos;
        if matches!(self.s.get(self.pos), Some(b'-' | b'+')) {
            self.pos += 1;
        }
        let digits = self.pos;
        while self.s.get(self.pos).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
        }
        if self.pos == digits {
            self.pos = start;
            return Err(self.err("expected a number"));
        }
        let text = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or("");
        let v = text.parse::<i128>().map_err(|_| {
            let pos = self.pos;
            self.pos = start;
            let e = self.err(&format!("number {text} is too large"));
            self.pos = pos;
            e
        })?;
        // Python 2 wrote long integers as `128L`.
        if matches!(self.s.get(self.pos), Some(b'L' | b'l')) {
            self.pos += 1;
        }
        Ok(Value::Int(v))
    }

    /// Comma-separated values up to `close`; returns them and whether a trailing comma was seen.
    fn sequence(&mut self, close: u8, depth: usize) -> Result<(Vec<Value>, bool), String> {
        self.pos += 1;
        let mut items = Vec::new();
        let mut trailing_comma = false;
        loop {
            if self.peek() == Some(close) {
                self.pos += 1;
                return Ok((items, trailing_comma));
            }
            items.push(self.value(depth + 1)?);
            trailing_comma = false;
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    trailing_comma = true;
                }
                Some(c) if c == close => {}
                _ => return Err(self.err(&format!("expected ',' or '{}'", close as char))),
            }
        }
    }

    fn dict(&mut self, depth: usize) -> Result<Value, String> {
        self.pos += 1;
        let mut items = Vec::new();
        loop {
            if self.peek() == Some(b'}') {
                self.pos += 1;
                return Ok(Value::Dict(items));
            }
            let key = self.value(depth + 1)?;
            self.expect(b':')?;
            let value = self.value(depth + 1)?;
            items.push((key, value));
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {}
                _ => return Err(self.err("expected ',' or '}'")),
            }
        }
    }
}

/// Parses a numpy `descr` string such as `<f4`, `>i8`, `|u1`, `=f8` or `f4` (no order: native).
pub(crate) fn parse_descr(descr: &str) -> Result<DType, String> {
    let unsupported =
        || format!("dtype '{descr}' is not supported (numbers only: b1, i1-i8, u1-u8, f2, f4, f8)");
    let bytes = descr.as_bytes();
    let (order, rest) = match bytes.first() {
        Some(c @ (b'<' | b'>' | b'|' | b'=')) => (*c, &bytes[1..]),
        _ => (b'=', bytes),
    };
    let (&kind, size) = rest.split_first().ok_or_else(unsupported)?;
    let size = std::str::from_utf8(size)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .ok_or_else(unsupported)?;
    let scalar = match (kind, size) {
        (b'b' | b'?', 1) => Scalar::Bool,
        (b'i', 1) => Scalar::I8,
        (b'i', 2) => Scalar::I16,
        (b'i', 4) => Scalar::I32,
        (b'i', 8) => Scalar::I64,
        (b'u', 1) => Scalar::U8,
        (b'u', 2) => Scalar::U16,
        (b'u', 4) => Scalar::U32,
        (b'u', 8) => Scalar::U64,
        (b'f', 2) => Scalar::F16,
        (b'f', 4) => Scalar::F32,
        (b'f', 8) => Scalar::F64,
        _ => return Err(unsupported()),
    };
    let big_endian = match order {
        b'<' => false,
        b'>' => true,
        b'=' => cfg!(target_endian = "big"),
        // '|' means "byte order not applicable", which only holds for one-byte types.
        _ if size == 1 => false,
        _ => {
            return Err(format!(
                "dtype '{descr}' has no byte order ('|') but elements of {size} bytes"
            ));
        }
    };
    Ok(DType { scalar, big_endian })
}

/// The header's fields with the dtype as written (`<U5` included), for readers of arrays that
/// are not numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawHeader {
    pub(crate) descr: String,
    pub(crate) fortran_order: bool,
    pub(crate) shape: Vec<u64>,
}

/// Parses the header dict (the bytes between the length field and the data).
pub(crate) fn parse(text: &[u8]) -> Result<Header, String> {
    let raw = parse_raw(text)?;
    Ok(Header {
        dtype: parse_descr(&raw.descr)?,
        fortran_order: raw.fortran_order,
        shape: raw.shape,
    })
}

/// [`parse`] without interpreting the dtype.
pub(crate) fn parse_raw(text: &[u8]) -> Result<RawHeader, String> {
    let mut p = Parser { s: text, pos: 0 };
    let dict = match p.value(0)? {
        Value::Dict(items) => items,
        _ => return Err("the header is not a dict".to_owned()),
    };
    // Padding after the dict: spaces, a newline, and (in some writers) NUL bytes.
    if let Some(off) = text[p.pos..]
        .iter()
        .position(|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0))
    {
        p.pos += off;
        return Err(p.err("unexpected text after the header dict"));
    }
    let get = |key: &str| {
        dict.iter()
            .rev()
            .find(|(k, _)| matches!(k, Value::Str(s) if s == key))
            .map(|(_, v)| v)
    };
    let descr = match get("descr") {
        Some(Value::Str(s)) => s.clone(),
        Some(Value::List(_)) => {
            return Err("structured dtypes (a list 'descr') are not supported".to_owned());
        }
        Some(_) => return Err("'descr' is not a string".to_owned()),
        None => return Err("the header has no 'descr'".to_owned()),
    };
    let fortran_order = match get("fortran_order") {
        Some(Value::Bool(b)) => *b,
        Some(Value::Int(i @ (0 | 1))) => *i == 1,
        Some(_) => return Err("'fortran_order' is not True or False".to_owned()),
        None => return Err("the header has no 'fortran_order'".to_owned()),
    };
    let shape = match get("shape") {
        Some(Value::Tuple(items) | Value::List(items)) => items
            .iter()
            .map(|v| match v {
                Value::Int(n) => {
                    u64::try_from(*n).map_err(|_| format!("'shape' has the invalid dimension {n}"))
                }
                _ => Err("'shape' holds something other than integers".to_owned()),
            })
            .collect::<Result<Vec<u64>, String>>()?,
        Some(Value::Int(n)) => {
            vec![u64::try_from(*n).map_err(|_| format!("'shape' has the invalid dimension {n}"))?]
        }
        Some(_) => return Err("'shape' is not a tuple".to_owned()),
        None => return Err("the header has no 'shape'".to_owned()),
    };
    Ok(RawHeader {
        descr,
        fortran_order,
        shape,
    })
}

/// The header dict as numpy writes it, for a 2-D C-order array.
pub(crate) fn format_dict(dtype: DType, rows: usize, cols: usize) -> String {
    format!("{{'descr': '{dtype}', 'fortran_order': False, 'shape': ({rows}, {cols}), }}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Result<Header, String> {
        parse(s.as_bytes())
    }

    #[test]
    fn numpy_style() {
        let hd = h("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }      \n").unwrap();
        assert_eq!(hd.dtype, DType::le(Scalar::F32));
        assert!(!hd.fortran_order);
        assert_eq!(hd.shape, [3, 4]);
    }

    #[test]
    fn variations() {
        let hd = h(r#"{"shape":(7,),"fortran_order":True,"descr":">i8"}"#).unwrap();
        assert_eq!(hd.shape, [7]);
        assert!(hd.fortran_order);
        assert_eq!(
            hd.dtype,
            DType {
                scalar: Scalar::I64,
                big_endian: true
            }
        );
        let hd = h("{'descr': '|u1', 'fortran_order': False, 'shape': (2L, 3L)}").unwrap();
        assert_eq!(hd.shape, [2, 3]);
        let hd = h("{'descr': '<f8', 'fortran_order': False, 'shape': ()}").unwrap();
        assert!(hd.shape.is_empty());
    }

    #[test]
    fn rejects() {
        for (text, what) in [
            ("", "unexpected end"),
            ("{'descr': '<f4', 'fortran_order': False}", "no 'shape'"),
            (
                "{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}",
                "not supported",
            ),
            (
                "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}",
                "structured",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
                "invalid dimension",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x",
                "after the header",
            ),
            (
                "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1,)}",
                "unknown name",
            ),
            (
                "{'descr': '|f4', 'fortran_order': False, 'shape': (1,)}",
                "no byte order",
            ),
            ("{'descr': '<f4", "unterminated"),
            ("[1, 2]", "not a dict"),
            (
                "{'shape': (99999999999999999999999999999999999999999,)}",
                "too large",
            ),
        ] {
            let e = h(text).unwrap_err();
            assert!(e.contains(what), "{text:?}: {e}");
        }
        let deep = format!("{}{}", "(".repeat(1000), ")".repeat(1000));
        assert!(h(&deep).unwrap_err().contains("too deep"));
    }

    #[test]
    fn writes_what_it_reads() {
        let s = format_dict(DType::le(Scalar::I64), 10, 3);
        let hd = parse(s.as_bytes()).unwrap();
        assert_eq!(hd.shape, [10, 3]);
        assert_eq!(hd.dtype, DType::le(Scalar::I64));
    }
}

//! Element types found in files, and their conversion into the output types (`f32`, `i64`).
//!
//! This is the only place where stored bytes become values, so every format shares one set of
//! range rules:
//! - into `f32`: floats pass through (NaN and ±inf included; the engine rejects them later
//!   with row and column), `f64` beyond the `f32` range is an error, integers wider than 16 bits
//!   are an error when `|v| > 2^24` (the largest range where every integer is exact in `f32`);
//! - into `f64`: floats exactly (NaN and ±inf pass through), integers exactly when
//!   `|v| <= 2^53` (the largest range where every integer is exact in `f64`), else an error;
//! - into `i64`: every integer type, with `u64` above `i64::MAX` an error; floats are refused.

use std::fmt;
use std::io::Read;

/// Largest magnitude up to which every integer is exactly representable in `f32`.
pub(crate) const F32_EXACT_INT: i64 = 1 << 24;

/// Largest magnitude up to which every integer is exactly representable in `f64`.
pub(crate) const F64_EXACT_INT: i64 = 1 << 53;

/// A scalar element type, independent of byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scalar {
    Bool,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    F32,
    F64,
}

impl Scalar {
    /// Bytes per element.
    pub(crate) fn size(self) -> usize {
        match self {
            Scalar::Bool | Scalar::I8 | Scalar::U8 => 1,
            Scalar::I16 | Scalar::U16 | Scalar::F16 => 2,
            Scalar::I32 | Scalar::U32 | Scalar::F32 => 4,
            Scalar::I64 | Scalar::U64 | Scalar::F64 => 8,
        }
    }

    pub(crate) fn is_float(self) -> bool {
        matches!(self, Scalar::F16 | Scalar::F32 | Scalar::F64)
    }

    /// The numpy kind character: `b`, `i`, `u` or `f`.
    fn kind(self) -> char {
        match self {
            Scalar::Bool => 'b',
            Scalar::I8 | Scalar::I16 | Scalar::I32 | Scalar::I64 => 'i',
            Scalar::U8 | Scalar::U16 | Scalar::U32 | Scalar::U64 => 'u',
            Scalar::F16 | Scalar::F32 | Scalar::F64 => 'f',
        }
    }
}

/// A scalar type plus the byte order it is stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DType {
    pub(crate) scalar: Scalar,
    pub(crate) big_endian: bool,
}

impl DType {
    pub(crate) const fn le(scalar: Scalar) -> DType {
        DType {
            scalar,
            big_endian: false,
        }
    }
}

impl fmt::Display for DType {
    /// The numpy `descr` spelling: `<f4`, `>i8`, `|u1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let size = self.scalar.size();
        let order = if size == 1 {
            '|'
        } else if self.big_endian {
            '>'
        } else {
            '<'
        };
        write!(f, "{order}{}{size}", self.scalar.kind())
    }
}

/// A stored value the output type cannot hold: `"value {value} {reason}"`.
#[derive(Debug)]
pub(crate) struct BadValue {
    pub(crate) value: String,
    pub(crate) reason: &'static str,
}

impl fmt::Display for BadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "value {} {}", self.value, self.reason)
    }
}

/// An output element type: `f32` or `f64` for data, `i64` for ids and labels.
///
/// # Safety
///
/// Every byte pattern of `size_of::<Self>()` bytes must be a valid `Self` (files are read
/// straight into its memory, see [`Element::native_bytes`]).
pub(crate) unsafe trait Element: Sized + Copy {
    /// What the output holds, for messages ("f32 values", "integers").
    const WHAT: &'static str;

    /// Whether elements of `scalar` can be read as `Self` at all (values may still be out of
    /// range, which `convert` reports).
    fn accepts(scalar: Scalar) -> bool;

    /// Zero, to size an output before reading bytes straight into it.
    const ZERO: Self;

    /// Appends the elements of `src` (a whole number of elements of `dtype`) to `out`.
    /// On a value `Self` cannot hold, returns its index within `src` (in elements).
    fn convert(dtype: DType, src: &[u8], out: &mut Vec<Self>) -> Result<(), (usize, BadValue)>;

    /// The stored type that is `Self`.
    const NATIVE: Scalar;

    /// The bytes of `out` when elements of `dtype` are stored exactly as `Self` is in memory
    /// (same type, this machine's byte order), so a file's bytes can be read straight into it.
    fn native_bytes(dtype: DType, out: &mut [Self]) -> Option<&mut [u8]> {
        if dtype.scalar != Self::NATIVE || !native_order(dtype) {
            return None;
        }
        let len = std::mem::size_of_val(out);
        // SAFETY: `out` is borrowed exclusively for the result's lifetime; every byte pattern
        // is a valid `Self` (the trait's contract), `u8` needs no alignment, and the length
        // covers exactly `out`.
        Some(unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), len) })
    }
}

/// Why [`read_elements`] stopped.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The source failed or ended early.
    Io(std::io::Error),
    /// The element at this index (counted from the first one read by the call) does not fit.
    Bad(usize, BadValue),
}

/// Bytes converted per step when elements cannot be read straight into the output.
const CONVERT_CHUNK_BYTES: usize = 1 << 16;

/// Reads `count` elements of `dtype` from `src` and appends them to `out`: straight into the
/// output's memory when the stored bytes are its representation (no second copy of the data is
/// ever resident), else through `scratch` in chunks of at most 64 KiB.
pub(crate) fn read_elements<T: Element>(
    src: &mut impl Read,
    dtype: DType,
    count: usize,
    out: &mut Vec<T>,
    scratch: &mut Vec<u8>,
) -> Result<(), ReadError> {
    let start = out.len();
    if T::native_bytes(dtype, &mut []).is_some() {
        if start == 0 && out.capacity() < count {
            // A zeroed allocation: pages are only touched by the read itself.
            *out = vec![T::ZERO; count];
        } else {
            out.resize(start + count, T::ZERO);
        }
        let bytes = T::native_bytes(dtype, &mut out[start..]).expect("checked above");
        return src.read_exact(bytes).map_err(ReadError::Io);
    }
    let size = dtype.scalar.size();
    let per_chunk = (CONVERT_CHUNK_BYTES / size).max(1);
    out.reserve(count);
    let mut done = 0;
    while done < count {
        let n = per_chunk.min(count - done);
        scratch.resize(n * size, 0);
        src.read_exact(&mut scratch[..n * size])
            .map_err(ReadError::Io)?;
        T::convert(dtype, &scratch[..n * size], out)
            .map_err(|(i, bad)| ReadError::Bad(done + i, bad))?;
        done += n;
    }
    Ok(())
}

/// Whether `dtype` stores values in this machine's byte order.
fn native_order(dtype: DType) -> bool {
    dtype.big_endian == cfg!(target_endian = "big")
}

/// Decodes each `N`-byte element of `src` in the given byte order and pushes `f(value)`.
#[inline]
fn convert_run<T, const N: usize>(
    src: &[u8],
    big_endian: bool,
    out: &mut Vec<T>,
    f: impl Fn([u8; N]) -> Result<T, BadValue>,
) -> Result<(), (usize, BadValue)> {
    out.reserve(src.len() / N);
    for (i, chunk) in src.chunks_exact(N).enumerate() {
        let mut b = [0u8; N];
        b.copy_from_slice(chunk);
        if big_endian {
            b.reverse();
        }
        match f(b) {
            Ok(v) => out.push(v),
            Err(bad) => return Err((i, bad)),
        }
    }
    Ok(())
}

fn exact_in_f32(v: i64) -> Result<f32, BadValue> {
    if v.unsigned_abs() <= F32_EXACT_INT as u64 {
        Ok(v as f32)
    } else {
        Err(BadValue {
            value: v.to_string(),
            reason: "is not exactly representable as f32 (|v| > 2^24)",
        })
    }
}

fn u64_exact_in_f32(v: u64) -> Result<f32, BadValue> {
    if v <= F32_EXACT_INT as u64 {
        Ok(v as f32)
    } else {
        Err(BadValue {
            value: v.to_string(),
            reason: "is not exactly representable as f32 (|v| > 2^24)",
        })
    }
}

fn f64_to_f32(v: f64) -> Result<f32, BadValue> {
    let r = v as f32;
    if r.is_infinite() && v.is_finite() {
        Err(BadValue {
            value: format!("{v:e}"),
            reason: "is beyond the f32 range",
        })
    } else {
        Ok(r)
    }
}

/// IEEE 754 binary16 to binary32 (exact: every f16 is an f32).
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let negative = h & 0x8000 != 0;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let magnitude = match exp {
        // Zero and subnormals: man * 2^-24, exact in f32.
        0 => man as f32 * (1.0 / 16_777_216.0),
        0x1f => f32::from_bits(0x7f80_0000 | (man << 13)),
        _ => f32::from_bits(((exp + 112) << 23) | (man << 13)),
    };
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

// SAFETY: every bit pattern is an f32 (NaNs included).
unsafe impl Element for f32 {
    const WHAT: &'static str = "f32 values";
    const ZERO: f32 = 0.0;
    const NATIVE: Scalar = Scalar::F32;

    fn accepts(_: Scalar) -> bool {
        true
    }

    fn convert(dtype: DType, src: &[u8], out: &mut Vec<f32>) -> Result<(), (usize, BadValue)> {
        let be = dtype.big_endian;
        match dtype.scalar {
            Scalar::F32 if !be => {
                // The common case (fvecs, `<f4`): one straight copy from the file bytes.
                out.extend(
                    src.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
                Ok(())
            }
            Scalar::F32 => convert_run(src, be, out, |b| Ok(f32::from_le_bytes(b))),
            Scalar::F64 => convert_run(src, be, out, |b| f64_to_f32(f64::from_le_bytes(b))),
            Scalar::F16 => convert_run(src, be, out, |b| Ok(f16_to_f32(u16::from_le_bytes(b)))),
            Scalar::Bool => convert_run(src, be, out, |b: [u8; 1]| Ok(f32::from(b[0] != 0))),
            Scalar::U8 => convert_run(src, be, out, |b: [u8; 1]| Ok(f32::from(b[0]))),
            Scalar::I8 => convert_run(src, be, out, |b| Ok(f32::from(i8::from_le_bytes(b)))),
            Scalar::I16 => convert_run(src, be, out, |b| Ok(f32::from(i16::from_le_bytes(b)))),
            Scalar::U16 => convert_run(src, be, out, |b| Ok(f32::from(u16::from_le_bytes(b)))),
            Scalar::I32 => convert_run(src, be, out, |b| {
                exact_in_f32(i64::from(i32::from_le_bytes(b)))
            }),
            Scalar::U32 => convert_run(src, be, out, |b| {
                exact_in_f32(i64::from(u32::from_le_bytes(b)))
            }),
            Scalar::I64 => convert_run(src, be, out, |b| exact_in_f32(i64::from_le_bytes(b))),
            Scalar::U64 => convert_run(src, be, out, |b| u64_exact_in_f32(u64::from_le_bytes(b))),
        }
    }
}

fn exact_in_f64(v: i64) -> Result<f64, BadValue> {
    if v.unsigned_abs() <= F64_EXACT_INT as u64 {
        Ok(v as f64)
    } else {
        Err(BadValue {
            value: v.to_string(),
            reason: "is not exactly representable as f64 (|v| > 2^53)",
        })
    }
}

fn u64_exact_in_f64(v: u64) -> Result<f64, BadValue> {
    if v <= F64_EXACT_INT as u64 {
        Ok(v as f64)
    } else {
        Err(BadValue {
            value: v.to_string(),
            reason: "is not exactly representable as f64 (|v| > 2^53)",
        })
    }
}

// SAFETY: every bit pattern is an f64 (NaNs included).
unsafe impl Element for f64 {
    const WHAT: &'static str = "f64 values";
    const ZERO: f64 = 0.0;
    const NATIVE: Scalar = Scalar::F64;

    fn accepts(_: Scalar) -> bool {
        true
    }

    fn convert(dtype: DType, src: &[u8], out: &mut Vec<f64>) -> Result<(), (usize, BadValue)> {
        let be = dtype.big_endian;
        match dtype.scalar {
            Scalar::F64 => convert_run(src, be, out, |b| Ok(f64::from_le_bytes(b))),
            Scalar::F32 => convert_run(src, be, out, |b| Ok(f64::from(f32::from_le_bytes(b)))),
            Scalar::F16 => convert_run(src, be, out, |b| {
                Ok(f64::from(f16_to_f32(u16::from_le_bytes(b))))
            }),
            Scalar::Bool => convert_run(src, be, out, |b: [u8; 1]| Ok(f64::from(b[0] != 0))),
            Scalar::U8 => convert_run(src, be, out, |b: [u8; 1]| Ok(f64::from(b[0]))),
            Scalar::I8 => convert_run(src, be, out, |b| Ok(f64::from(i8::from_le_bytes(b)))),
            Scalar::I16 => convert_run(src, be, out, |b| Ok(f64::from(i16::from_le_bytes(b)))),
            Scalar::U16 => convert_run(src, be, out, |b| Ok(f64::from(u16::from_le_bytes(b)))),
            Scalar::I32 => convert_run(src, be, out, |b| Ok(f64::from(i32::from_le_bytes(b)))),
            Scalar::U32 => convert_run(src, be, out, |b| Ok(f64::from(u32::from_le_bytes(b)))),
            Scalar::I64 => convert_run(src, be, out, |b| exact_in_f64(i64::from_le_bytes(b))),
            Scalar::U64 => convert_run(src, be, out, |b| u64_exact_in_f64(u64::from_le_bytes(b))),
        }
    }
}

// SAFETY: every bit pattern is an i64.
unsafe impl Element for i64 {
    const WHAT: &'static str = "integers";
    const ZERO: i64 = 0;
    const NATIVE: Scalar = Scalar::I64;

    fn accepts(scalar: Scalar) -> bool {
        !scalar.is_float()
    }

    fn convert(dtype: DType, src: &[u8], out: &mut Vec<i64>) -> Result<(), (usize, BadValue)> {
        let be = dtype.big_endian;
        match dtype.scalar {
            Scalar::Bool => convert_run(src, be, out, |b: [u8; 1]| Ok(i64::from(b[0] != 0))),
            Scalar::U8 => convert_run(src, be, out, |b: [u8; 1]| Ok(i64::from(b[0]))),
            Scalar::I8 => convert_run(src, be, out, |b| Ok(i64::from(i8::from_le_bytes(b)))),
            Scalar::I16 => convert_run(src, be, out, |b| Ok(i64::from(i16::from_le_bytes(b)))),
            Scalar::U16 => convert_run(src, be, out, |b| Ok(i64::from(u16::from_le_bytes(b)))),
            Scalar::I32 => convert_run(src, be, out, |b| Ok(i64::from(i32::from_le_bytes(b)))),
            Scalar::U32 => convert_run(src, be, out, |b| Ok(i64::from(u32::from_le_bytes(b)))),
            Scalar::I64 => convert_run(src, be, out, |b| Ok(i64::from_le_bytes(b))),
            Scalar::U64 => convert_run(src, be, out, |b| {
                let v = u64::from_le_bytes(b);
                i64::try_from(v).map_err(|_| BadValue {
                    value: v.to_string(),
                    reason: "does not fit in i64",
                })
            }),
            // `accepts` keeps floats away; answer with an error rather than a panic anyway.
            Scalar::F16 | Scalar::F32 | Scalar::F64 => {
                if src.is_empty() {
                    Ok(())
                } else {
                    Err((
                        0,
                        BadValue {
                            value: format!("of type {dtype}"),
                            reason: "is not an integer",
                        },
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
    }

    #[test]
    fn f32_int_range() {
        let mut out = Vec::new();
        let ok = (1i32 << 24).to_le_bytes();
        f32::convert(DType::le(Scalar::I32), &ok, &mut out).unwrap();
        assert_eq!(out, [16_777_216.0]);
        let bad = ((1i32 << 24) + 1).to_le_bytes();
        let (i, e) = f32::convert(DType::le(Scalar::I32), &bad, &mut out).unwrap_err();
        assert_eq!(i, 0);
        assert_eq!(
            e.to_string(),
            "value 16777217 is not exactly representable as f32 (|v| > 2^24)"
        );
        let neg = (-(1i64 << 24)).to_be_bytes();
        let mut out = Vec::new();
        f32::convert(
            DType {
                scalar: Scalar::I64,
                big_endian: true,
            },
            &neg,
            &mut out,
        )
        .unwrap();
        assert_eq!(out, [-16_777_216.0]);
    }

    #[test]
    fn f64_range() {
        let mut src = Vec::new();
        for v in [1.5f64, f64::NAN, f64::INFINITY, 3.4028235e38, 1e300] {
            src.extend_from_slice(&v.to_le_bytes());
        }
        let mut out = Vec::new();
        let (i, e) = f32::convert(DType::le(Scalar::F64), &src, &mut out).unwrap_err();
        assert_eq!(i, 4);
        assert_eq!(e.to_string(), "value 1e300 is beyond the f32 range");
        assert_eq!(out[0], 1.5);
        assert!(out[1].is_nan());
        assert_eq!(out[2], f32::INFINITY);
        assert_eq!(out[3], f32::MAX);
    }

    #[test]
    fn into_f64_exactly() {
        let mut src = Vec::new();
        for v in [1.0 + 1e-9, f64::NAN, -1e300] {
            src.extend_from_slice(&v.to_be_bytes());
        }
        let be = DType {
            scalar: Scalar::F64,
            big_endian: true,
        };
        let mut out = Vec::new();
        f64::convert(be, &src, &mut out).unwrap();
        assert_eq!(out[0], 1.0 + 1e-9);
        assert!(out[1].is_nan());
        assert_eq!(out[2], -1e300);
        let mut out = Vec::new();
        f64::convert(DType::le(Scalar::F32), &0.1f32.to_le_bytes(), &mut out).unwrap();
        assert_eq!(out, [f64::from(0.1f32)]);
        let big = [(1i64 << 53).to_le_bytes(), ((1i64 << 53) + 1).to_le_bytes()].concat();
        let mut out = Vec::new();
        let (i, e) = f64::convert(DType::le(Scalar::I64), &big, &mut out).unwrap_err();
        assert_eq!((i, out), (1, vec![9_007_199_254_740_992.0]));
        assert_eq!(
            e.to_string(),
            "value 9007199254740993 is not exactly representable as f64 (|v| > 2^53)"
        );
    }

    #[test]
    fn u64_into_i64() {
        let mut out = Vec::new();
        let src = [u64::MAX.to_le_bytes(), 7u64.to_le_bytes()].concat();
        let (i, e) = i64::convert(DType::le(Scalar::U64), &src, &mut out).unwrap_err();
        assert_eq!(i, 0);
        assert_eq!(
            e.to_string(),
            "value 18446744073709551615 does not fit in i64"
        );
    }

    #[test]
    fn descr_spelling() {
        assert_eq!(DType::le(Scalar::F32).to_string(), "<f4");
        assert_eq!(DType::le(Scalar::U8).to_string(), "|u1");
        let be = DType {
            scalar: Scalar::I64,
            big_endian: true,
        };
        assert_eq!(be.to_string(), ">i8");
    }
}

//! Builders of test files, byte by byte, independent of the crate's writers.
#![allow(dead_code)]

/// One vecs record: the dimension `d` (any value, for corrupt files) and the payload bytes.
pub fn record(d: i32, payload: &[u8]) -> Vec<u8> {
    let mut out = d.to_le_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// One record per row, each value as the little-endian bytes `bytes` gives.
fn vecs<T: Copy, const N: usize>(rows: &[&[T]], bytes: fn(T) -> [u8; N]) -> Vec<u8> {
    rows.iter()
        .flat_map(|r| {
            let payload: Vec<u8> = r.iter().flat_map(|&v| bytes(v)).collect();
            record(r.len() as i32, &payload)
        })
        .collect()
}

pub fn fvecs(rows: &[&[f32]]) -> Vec<u8> {
    vecs(rows, f32::to_le_bytes)
}

pub fn ivecs(rows: &[&[i32]]) -> Vec<u8> {
    vecs(rows, i32::to_le_bytes)
}

pub fn bvecs(rows: &[&[u8]]) -> Vec<u8> {
    vecs(rows, |b: u8| [b])
}

/// An npy file of the given version with `dict` as header text (padded with spaces and a
/// newline to a multiple of 64 bytes, as numpy does) followed by `data`.
pub fn npy(major: u8, dict: &str, data: &[u8]) -> Vec<u8> {
    let preamble = if major == 1 { 10 } else { 12 };
    let total = (preamble + dict.len() + 1).div_ceil(64) * 64;
    let header_len = total - preamble;
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[major, 0]);
    if major == 1 {
        out.extend_from_slice(&(header_len as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header_len as u32).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.resize(total - 1, b' ');
    out.push(b'\n');
    out.extend_from_slice(data);
    out
}

/// The numpy header dict for `descr`, `fortran_order` and `shape` (Python tuple text).
pub fn dict(descr: &str, fortran: bool, shape: &str) -> String {
    let f = if fortran { "True" } else { "False" };
    format!("{{'descr': '{descr}', 'fortran_order': {f}, 'shape': {shape}, }}")
}

/// Encodes `values` (exactly representable in every dtype used) as `descr`'s element type.
pub fn encode(descr: &str, values: &[f64]) -> Vec<u8> {
    let big = descr.starts_with('>');
    let kind = &descr[1..];
    let mut out = Vec::new();
    for &v in values {
        let mut b: Vec<u8> = match kind {
            "f8" => v.to_le_bytes().to_vec(),
            "f4" => (v as f32).to_le_bytes().to_vec(),
            "f2" => f16_bits(v as f32).to_le_bytes().to_vec(),
            "i1" => (v as i8).to_le_bytes().to_vec(),
            "i2" => (v as i16).to_le_bytes().to_vec(),
            "i4" => (v as i32).to_le_bytes().to_vec(),
            "i8" => (v as i64).to_le_bytes().to_vec(),
            "u1" => (v as u8).to_le_bytes().to_vec(),
            "u2" => (v as u16).to_le_bytes().to_vec(),
            "u4" => (v as u32).to_le_bytes().to_vec(),
            "u8" => (v as u64).to_le_bytes().to_vec(),
            "b1" => vec![u8::from(v != 0.0)],
            _ => panic!("no encoder for {descr}"),
        };
        if big {
            b.reverse();
        }
        out.extend_from_slice(&b);
    }
    out
}

/// binary16 bits of small integers (exact), enough for the tests.
fn f16_bits(v: f32) -> u16 {
    if v == 0.0 {
        return 0;
    }
    let sign = if v < 0.0 { 0x8000 } else { 0 };
    let a = v.abs();
    let e = a.log2().floor() as i32;
    let man = ((a / 2f32.powi(e) - 1.0) * 1024.0).round() as u16;
    sign | (((e + 15) as u16) << 10) | man
}

/// Asserts that `result` is an error whose message contains every one of `parts`.
#[track_caller]
pub fn assert_err<T: std::fmt::Debug>(result: Result<T, knn_io::IoError>, parts: &[&str]) {
    match result {
        Ok(v) => panic!("expected an error containing {parts:?}, got Ok({v:?})"),
        Err(e) => {
            let msg = e.to_string();
            for p in parts {
                assert!(msg.contains(p), "message {msg:?} lacks {p:?}");
            }
        }
    }
}

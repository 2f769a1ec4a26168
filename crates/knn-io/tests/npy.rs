//! npy: every dtype in both byte orders, versions, Fortran order, and the error cases.

mod common;

use common::{assert_err, dict, encode, npy};
use knn_io::{
    map_f32, read_f32, read_f32_from_bytes, read_i64, read_i64_from_bytes, write_f32, write_i64,
    Format, Table,
};

const INT_DTYPES: [&str; 9] = ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1"];
const FLOAT_DTYPES: [&str; 3] = ["f2", "f4", "f8"];

fn f32s(bytes: &[u8]) -> Result<Table<f32>, knn_io::IoError> {
    read_f32_from_bytes(bytes, Format::Npy, "a.npy")
}

fn i64s(bytes: &[u8]) -> Result<Table<i64>, knn_io::IoError> {
    read_i64_from_bytes(bytes, Format::Npy, "a.npy")
}

#[test]
fn every_dtype_in_both_byte_orders() {
    let values = [0.0, 1.0, 2.0, 3.0, 100.0, 127.0];
    let bools = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0];
    for kind in INT_DTYPES.iter().chain(&FLOAT_DTYPES) {
        let vals: &[f64] = if *kind == "b1" { &bools } else { &values };
        let orders: &[char] = if kind.ends_with('1') {
            &['|', '<', '>']
        } else {
            &['<', '>', '=']
        };
        for order in orders {
            let descr = format!("{order}{kind}");
            let data = encode(
                &format!("{}{kind}", if *order == '>' { '>' } else { '<' }),
                vals,
            );
            let file = npy(1, &dict(&descr, false, "(2, 3)"), &data);
            let t = f32s(&file).unwrap_or_else(|e| panic!("{descr}: {e}"));
            assert_eq!((t.rows, t.cols), (2, 3), "{descr}");
            let want: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
            assert_eq!(t.data, want, "{descr}");
            if kind.starts_with('f') {
                assert_err(i64s(&file), &["a.npy: dtype", "floating-point"]);
            } else {
                let t = i64s(&file).unwrap();
                let want: Vec<i64> = vals.iter().map(|&v| v as i64).collect();
                assert_eq!(t.data, want, "{descr}");
            }
        }
    }
}

#[test]
fn negative_values_and_extremes() {
    let file = npy(
        1,
        &dict(">i8", false, "(3,)"),
        &encode(">i8", &[-5.0, 0.0, 7.0]),
    );
    assert_eq!(i64s(&file).unwrap().data, [-5, 0, 7]);
    let mut data = Vec::new();
    for v in [i64::MIN, i64::MAX] {
        data.extend_from_slice(&v.to_be_bytes());
    }
    let file = npy(1, &dict(">i8", false, "(2,)"), &data);
    assert_eq!(i64s(&file).unwrap().data, [i64::MIN, i64::MAX]);
    assert_err(
        f32s(&file),
        &[
            "a.npy: element [0] at byte 128",
            "-9223372036854775808",
            "2^24",
        ],
    );
    let file = npy(
        1,
        &dict("<u8", false, "(1, 2)"),
        &[[7u8, 0, 0, 0, 0, 0, 0, 0], [255; 8]].concat(),
    );
    assert_err(
        i64s(&file),
        &["a.npy: element [0, 1] at byte 136: value 18446744073709551615 does not fit in i64"],
    );
}

#[test]
fn f64_beyond_f32_range_names_the_element() {
    let vals = [1.0, f64::NAN, f64::INFINITY, -3.0, 5.0, -1e39];
    let file = npy(1, &dict("<f8", false, "(2, 3)"), &encode("<f8", &vals));
    let e = f32s(&file).unwrap_err();
    assert_eq!(
        e.to_string(),
        "a.npy: element [1, 2] at byte 168: value -1e39 is beyond the f32 range"
    );
    // NaN and inf themselves pass through.
    let file = npy(1, &dict("<f8", false, "(2, 2)"), &encode("<f8", &vals[..4]));
    let t = f32s(&file).unwrap();
    assert!(t.data[1].is_nan());
    assert_eq!(t.data[2], f32::INFINITY);
}

#[test]
fn versions_2_and_3() {
    for major in [2, 3] {
        let file = npy(
            major,
            &dict("<f4", false, "(1, 2)"),
            &encode("<f4", &[1.5, 2.5]),
        );
        assert_eq!(f32s(&file).unwrap().data, [1.5, 2.5]);
    }
    let mut file = npy(1, &dict("<f4", false, "(1,)"), &encode("<f4", &[1.0]));
    file[6] = 4;
    assert_err(
        f32s(&file),
        &["a.npy: npy format version 4.0 is not supported"],
    );
}

#[test]
fn one_d_is_a_column() {
    let file = npy(
        1,
        &dict("<i4", false, "(4,)"),
        &encode("<i4", &[4.0, 3.0, 2.0, 1.0]),
    );
    let t = i64s(&file).unwrap();
    assert_eq!((t.rows, t.cols, t.data), (4, 1, vec![4, 3, 2, 1]));
}

#[test]
fn fortran_order_is_transposed() {
    // The 3 x 4 matrix with value 10*i + j, stored column by column.
    let (rows, cols) = (3, 4);
    let mut column_major = Vec::new();
    for j in 0..cols {
        for i in 0..rows {
            column_major.push((10 * i + j) as f64);
        }
    }
    for descr in ["<f4", ">f8", "<i2", ">u4"] {
        let file = npy(
            1,
            &dict(descr, true, "(3, 4)"),
            &encode(descr, &column_major),
        );
        let t = f32s(&file).unwrap();
        assert_eq!((t.rows, t.cols), (3, 4));
        for i in 0..rows {
            for j in 0..cols {
                assert_eq!(t.row(i)[j], (10 * i + j) as f32, "{descr} [{i}, {j}]");
            }
        }
    }
    // A bad value is named by its (row, column), not its position in the file.
    let mut vals = column_major.clone();
    vals[7] = 1e300; // column 2, row 1
    let file = npy(1, &dict("<f8", true, "(3, 4)"), &encode("<f8", &vals));
    assert_err(
        f32s(&file),
        &["a.npy: element [1, 2] at byte 184", "beyond the f32 range"],
    );
    // A larger matrix, over several transpose blocks.
    let (rows, cols) = (130, 67);
    let mut data = Vec::new();
    for j in 0..cols {
        for i in 0..rows {
            data.extend_from_slice(&((i * 1000 + j) as i32).to_le_bytes());
        }
    }
    let file = npy(1, &dict("<i4", true, "(130, 67)"), &data);
    let t = i64s(&file).unwrap();
    for i in 0..rows {
        for j in 0..cols {
            assert_eq!(t.data[i * cols + j], (i * 1000 + j) as i64);
        }
    }
}

#[test]
fn header_variations_from_other_writers() {
    let data = encode("<f4", &[1.0, 2.0]);
    for header in [
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
        "{\"descr\":\"<f4\",\"fortran_order\":False,\"shape\":(2,)}",
        "{'shape': (2L,), 'fortran_order': False, 'descr': '<f4'}",
        "{'descr':'<f4','fortran_order':False,'shape':(1,2)}",
        "{ 'descr' : '<f4' ,\n 'fortran_order' : False , 'shape' : [ 2 ] }",
    ] {
        let t = f32s(&npy(1, header, &data)).unwrap_or_else(|e| panic!("{header}: {e}"));
        assert_eq!(t.data, [1.0, 2.0], "{header}");
    }
}

#[test]
fn bad_headers_and_shapes() {
    let data = encode("<f4", &[1.0; 8]);
    for (header, want) in [
        (dict("<f4", false, "(2, 2, 2)"), "3 dimensions"),
        (dict("<f4", false, "()"), "0 dimensions"),
        (dict("<c8", false, "(8,)"), "dtype '<c8' is not supported"),
        (dict("|O", false, "(8,)"), "dtype '|O' is not supported"),
        (dict("<f4", false, "(-8,)"), "invalid dimension -8"),
        (
            "{'descr': '<f4', 'shape': (8,)}".to_owned(),
            "no 'fortran_order'",
        ),
        ("not a dict".to_owned(), "bad npy header"),
    ] {
        assert_err(f32s(&npy(1, &header, &data)), &["a.npy: ", want]);
    }
}

#[test]
fn truncated_and_oversized_data() {
    let file = npy(1, &dict("<f4", false, "(2, 3)"), &encode("<f4", &[1.0; 5]));
    assert_eq!(
        f32s(&file).unwrap_err().to_string(),
        "a.npy: truncated: data of shape (2, 3) and dtype '<f4' at byte 128 needs 24 bytes, \
         20 remain"
    );
    let file = npy(1, &dict("<f4", false, "(2, 3)"), &encode("<f4", &[1.0; 7]));
    assert_err(
        f32s(&file),
        &["a.npy: 4 unexpected bytes after the data", "need 24 bytes"],
    );
    // The header length runs past the end of the file.
    let mut file = npy(1, &dict("<f4", false, "(1,)"), &[]);
    file.truncate(60);
    assert_err(
        f32s(&file),
        &["a.npy: truncated: the npy header at byte 10 needs 118 bytes, 50 remain"],
    );
    // A preamble cut short.
    assert_err(
        f32s(b"\x93NUMPY\x02\x00\x10"),
        &["a.npy: truncated: the npy 2.0 preamble"],
    );
}

#[test]
fn absurd_shapes_do_not_allocate() {
    let data = encode("<f4", &[1.0; 4]);
    let file = npy(1, &dict("<f8", false, "(1099511627776, 1048576)"), &data);
    assert_err(
        f32s(&file),
        &[
            "a.npy: truncated",
            "needs 9223372036854775808 bytes, 16 remain",
        ],
    );
    let file = npy(
        1,
        &dict("<f8", false, "(4611686018427387904, 4611686018427387904)"),
        &data,
    );
    assert_err(f32s(&file), &["a.npy: shape", "is too large"]);
    let file = npy(1, &dict("<f8", false, "(99999999999999999999,)"), &data);
    assert_err(f32s(&file), &["a.npy: bad npy header", "invalid dimension"]);
    // Zero-sized arrays are fine, whatever the other dimension.
    let file = npy(1, &dict("<f8", false, "(1099511627776, 0)"), &[]);
    let t = f32s(&file).unwrap();
    assert_eq!((t.rows, t.cols, t.data.len()), (1 << 40, 0, 0));
}

#[test]
fn not_npy() {
    assert_err(f32s(&[]), &["a.npy: file is empty"]);
    assert_err(f32s(b"PK\x03\x04 zip"), &["a.npy: not an npy file"]);
    assert_err(f32s(b"\x93NUM"), &["a.npy: truncated"]);
}

#[test]
fn round_trips_through_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.npy");
    let t = Table {
        data: vec![1.0, -2.5, f32::NAN, f32::MAX, 0.0, 1e-40],
        rows: 3,
        cols: 2,
    };
    write_f32(&path, None, &t).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert_eq!((10 + header_len) % 64, 0);
    let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
    assert!(header.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }"));
    assert!(header.ends_with('\n'));
    let back = read_f32(&path, None).unwrap();
    let bits = |t: &Table<f32>| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!((back.rows, back.cols), (3, 2));
    assert_eq!(bits(&back), bits(&t));

    let ids = Table {
        data: vec![i64::MIN, -1, 0, i64::MAX],
        rows: 4,
        cols: 1,
    };
    let path = dir.path().join("ids.npy");
    write_i64(&path, None, &ids).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert!(std::str::from_utf8(&bytes[10..70])
        .unwrap()
        .contains("'<i8'"));
    assert_eq!(read_i64(&path, None).unwrap(), ids);

    // Empty and zero-column tables round-trip too.
    for (rows, cols) in [(0, 0), (0, 7), (5, 0)] {
        let t = Table {
            data: vec![],
            rows,
            cols,
        };
        write_f32(&path, Some(Format::Npy), &t).unwrap();
        assert_eq!(read_f32(&path, Some(Format::Npy)).unwrap(), t);
    }
}

#[test]
fn little_endian_f32_in_c_order_is_mapped_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let values: Vec<f64> = (0..12).map(|v| v as f64 * 0.5 - 2.0).collect();
    let write = |name: &str, bytes: Vec<u8>| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    // An npy file of version `major` holding `values` as `descr` in the given order and shape.
    let encoded = |major: u8, descr: &str, fortran: bool, shape: &str| {
        npy(major, &dict(descr, fortran, shape), &encode(descr, &values))
    };
    // Mapped: 2-D and 1-D `<f4`, versions 1 and 2; the values equal the reader's.
    for (name, file) in [
        ("a.npy", encoded(1, "<f4", false, "(3, 4)")),
        ("b.npy", encoded(2, "<f4", false, "(12,)")),
        ("c.npy", encoded(1, "<f4", true, "(1, 12)")),
    ] {
        let p = write(name, file);
        let m = map_f32(&p, None).unwrap().expect("mapped");
        let t = read_f32(&p, None).unwrap();
        assert_eq!((m.rows(), m.cols()), (t.rows, t.cols), "{name}");
        assert_eq!(m.values(), &t.data[..], "{name}");
    }
    // Not mapped (the reader converts or reports them): other dtypes, big-endian, Fortran
    // order, truncated data, other formats, no rows.
    for (name, file) in [
        ("d.npy", encoded(1, "<f8", false, "(3, 4)")),
        ("e.npy", encoded(1, ">f4", false, "(3, 4)")),
        ("f.npy", encoded(1, "<f4", true, "(3, 4)")),
        ("g.npy", encoded(1, "<f4", false, "(3, 5)")),
        ("h.npy", npy(1, &dict("<f4", false, "(0, 4)"), &[])),
        ("i.fvecs", vec![1, 0, 0, 0, 0, 0, 128, 63]),
    ] {
        let p = write(name, file);
        assert!(map_f32(&p, None).unwrap().is_none(), "{name}");
    }
    assert!(map_f32(&dir.path().join("missing.npy"), None).is_err());
}

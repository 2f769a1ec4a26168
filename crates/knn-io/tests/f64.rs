//! float64 data kept exact: read in the precision the file stores ([`Values`]), read as `f64`
//! from every type, and written as `<f8` npy or CSV text that reads back to the same `f64`.

mod common;

use common::{assert_err, dict, encode, npy};
use knn_io::{
    read_f32, read_f64, read_f64_from_bytes, read_values_from_bytes, read_values_with, write_f32,
    write_f64, write_f64_to, CsvOptions, Format, ReadOptions, Table, Values,
};
use std::path::{Path, PathBuf};

/// Values an f32 cannot hold: 1 ± a few 1e-9 (all round to 1.0 in f32).
const CLOSE: [f64; 4] = [1.0, 1.0 + 1e-9, 1.0 + 2e-9, 1.0 - 3e-9];

fn values(path: &Path) -> Values {
    read_values_with(path, &ReadOptions::default()).unwrap()
}

fn hdf5_data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

#[test]
fn float64_files_and_text_read_as_f64_others_as_f32() {
    let dir = tempfile::tempdir().unwrap();
    for descr in ["<f8", ">f8"] {
        let f = dir.path().join(format!("{}.npy", &descr[1..]));
        let data = encode(descr, &CLOSE);
        std::fs::write(&f, npy(1, &dict(descr, false, "(4, 1)"), &data)).unwrap();
        assert_eq!(
            values(&f),
            Values::F64(Table {
                data: CLOSE.to_vec(),
                rows: 4,
                cols: 1
            }),
            "{descr}"
        );
        // Fortran order too (transposed into rows).
        let fo = dir.path().join("fortran.npy");
        let cols = encode(descr, &[1.0, 2.0 + 1e-9, 3.0, 4.0 - 1e-9, 5.0, 6.0]);
        std::fs::write(&fo, npy(1, &dict(descr, true, "(2, 3)"), &cols)).unwrap();
        let Values::F64(t) = values(&fo) else {
            panic!("fortran {descr}: not f64")
        };
        assert_eq!(t.data, [1.0, 3.0, 5.0, 2.0 + 1e-9, 4.0 - 1e-9, 6.0]);
    }
    // float32, float16 and integer npy, and the record formats: f32.
    for descr in ["<f4", "<f2", "<i8", "|u1"] {
        let f = dir.path().join("small.npy");
        let data = encode(descr, &[1.0, 2.0]);
        std::fs::write(&f, npy(1, &dict(descr, false, "(1, 2)"), &data)).unwrap();
        assert!(matches!(values(&f), Values::F32(_)), "{descr}");
    }
    let fv = dir.path().join("a.fvecs");
    write_f32(
        &fv,
        None,
        &Table {
            data: vec![1.5, 2.5],
            rows: 1,
            cols: 2,
        },
    )
    .unwrap();
    assert!(matches!(values(&fv), Values::F32(_)));
    // Text: decimal numbers, read as the nearest f64.
    let csv = dir.path().join("a.csv");
    std::fs::write(&csv, "x\n1\n1.000000001\n1.000000002\n0.999999997\n").unwrap();
    let Values::F64(t) = values(&csv) else {
        panic!("csv: not f64")
    };
    assert_eq!(t.data, CLOSE);
    assert_eq!((t.rows, t.cols), (4, 1));
    // HDF5: a float64 dataset and a float32 one of the same file.
    let ang = hdf5_data("angular.hdf5");
    let train = read_values_with(
        &ang,
        &ReadOptions {
            dataset: Some("train".into()),
            ..ReadOptions::default()
        },
    )
    .unwrap();
    let Values::F64(t) = &train else {
        panic!("float64 train read as {train:?}")
    };
    assert_eq!((t.rows, t.cols), (120, 6));
    // Standard normal values in f64: some are not f32 values.
    assert!(t.data.iter().any(|&v| v as f32 as f64 != v));
    let test = values(&PathBuf::from(format!("{}:test", ang.display())));
    assert!(matches!(test, Values::F32(_)));
    assert_eq!((test.rows(), test.cols(), test.is_f64()), (9, 6, false));
}

#[test]
fn bytes_in_memory_read_as_files_do() {
    let data = encode("<f8", &CLOSE);
    let bytes = npy(1, &dict("<f8", false, "(2, 2)"), &data);
    let v = read_values_from_bytes(&bytes, Format::Npy, &CsvOptions::default(), "stdin").unwrap();
    assert!(v.is_f64() && v.rows() == 2 && v.cols() == 2);
    let csv = b"1;1.000000001\n1.000000002;0.999999997\n";
    let v = read_values_from_bytes(csv, Format::Csv, &CsvOptions::default(), "stdin").unwrap();
    assert_eq!(
        v,
        Values::F64(Table {
            data: CLOSE.to_vec(),
            rows: 2,
            cols: 2
        })
    );
    let finite = CsvOptions {
        finite_only: true,
        ..CsvOptions::default()
    };
    assert_err(
        read_values_from_bytes(b"1,2\n3,nan\n", Format::Csv, &finite, "stdin"),
        &["stdin: line 2, column 2: 'nan' is not a finite number"],
    );
    assert_err(
        read_values_from_bytes(b"1,1e400\n", Format::Csv, &finite, "stdin"),
        &["line 1, column 2: '1e400' is beyond the f64 range"],
    );
}

#[test]
fn every_type_reads_into_f64_exactly() {
    for descr in ["<f2", "<f4", "<f8", "<i4", "<i8", "<u8", ">i2", "|b1"] {
        let data = encode(descr, &[0.0, 1.0, 2.0, 3.0]);
        let bytes = npy(1, &dict(descr, false, "(2, 2)"), &data);
        let t = read_f64_from_bytes(&bytes, Format::Npy, "a.npy").unwrap();
        let want: &[f64] = if descr == "|b1" {
            &[0.0, 1.0, 1.0, 1.0]
        } else {
            &[0.0, 1.0, 2.0, 3.0]
        };
        assert_eq!(t.data, want, "{descr}");
    }
    // 2^24 + 1 is no f32 but is an f64; 2^53 + 1 is neither.
    let big = ((1i64 << 24) + 1).to_le_bytes();
    let bytes = npy(1, &dict("<i8", false, "(1,)"), &big);
    assert_eq!(
        read_f64_from_bytes(&bytes, Format::Npy, "a.npy")
            .unwrap()
            .data,
        [16_777_217.0]
    );
    let huge = [7i64.to_le_bytes(), ((1i64 << 53) + 1).to_le_bytes()].concat();
    let bytes = npy(1, &dict("<i8", false, "(2,)"), &huge);
    assert_err(
        read_f64_from_bytes(&bytes, Format::Npy, "a.npy"),
        &[
            "a.npy: element [1] at byte 136",
            "not exactly representable as f64",
        ],
    );
}

#[test]
fn written_f64_reads_back_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let t = Table {
        data: vec![
            0.1,
            1.0 + 1e-9,
            2.1e-9,
            -1e300,
            5e-324,
            f64::INFINITY,
            f64::NAN,
            0.0,
        ],
        rows: 2,
        cols: 4,
    };
    let same = |a: &[f64], b: &[f64]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan())
    };
    let npy_path = dir.path().join("d.npy");
    write_f64(&npy_path, None, &t).unwrap();
    let bytes = std::fs::read(&npy_path).unwrap();
    assert!(String::from_utf8_lossy(&bytes[..128]).contains("'descr': '<f8'"));
    let back = read_f64(&npy_path, None).unwrap();
    assert!(same(&back.data, &t.data) && (back.rows, back.cols) == (2, 4));
    // f32 readers round it, as they round any float64 file (-1e300 has no f32 rounding).
    assert_err(
        read_f32(&npy_path, None),
        &["element [0, 3]", "beyond the f32 range"],
    );

    let csv_path = dir.path().join("d.csv");
    write_f64(&csv_path, None, &t).unwrap();
    let text = std::fs::read_to_string(&csv_path).unwrap();
    assert_eq!(text, "0.1,1.000000001,2.1e-9,-1e300\n5e-324,inf,NaN,0.0\n");
    let back = read_f64(&csv_path, None).unwrap();
    assert!(same(&back.data, &t.data));

    let mut out = Vec::new();
    write_f64_to(&mut out, Format::Csv, &t, "standard output").unwrap();
    assert_eq!(out, text.as_bytes());

    for ext in ["fvecs", "ivecs", "bvecs"] {
        assert_err(
            write_f64(&dir.path().join(format!("d.{ext}")), None, &t),
            &[&format!(
                "format {ext} cannot hold f64 values (npy and csv can)"
            )],
        );
        assert!(!dir.path().join(format!("d.{ext}")).exists());
    }
}

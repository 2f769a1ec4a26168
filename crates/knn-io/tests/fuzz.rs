//! Properties: any bytes give `Ok` or `Err`, never a panic, and an `Ok` table is consistent;
//! valid files read back what was written into them.

mod common;

use knn_io::{
    hdf5, read_csv_f32_from_bytes, read_f32, read_f32_from_bytes, read_f64_from_bytes, read_i64,
    read_i64_from_bytes, read_values_from_bytes, CsvOptions, Delimiter, Format, Header, Table,
    Values,
};
use proptest::prelude::*;

/// Asserts that `t` is a consistent table.
fn assert_consistent<T>(t: &Table<T>, format: Format) {
    assert!(
        t.is_consistent(),
        "{format}: {} x {} with {}",
        t.rows,
        t.cols,
        t.data.len()
    );
}

/// Runs every reader on `bytes` in `format`; any `Ok` must be a consistent table.
fn read_all_ways(bytes: &[u8], format: Format) {
    if let Ok(t) = read_f32_from_bytes(bytes, format, "fuzz") {
        assert_consistent(&t, format);
    }
    if let Ok(t) = read_i64_from_bytes(bytes, format, "fuzz") {
        assert_consistent(&t, format);
    }
    if let Ok(t) = read_f64_from_bytes(bytes, format, "fuzz") {
        assert_consistent(&t, format);
    }
    let values = read_values_from_bytes(bytes, format, &CsvOptions::default(), "fuzz");
    match &values {
        Ok(Values::F32(t)) => assert_consistent(t, format),
        Ok(Values::F64(t)) => assert_consistent(t, format),
        Err(_) => {}
    }
    for result in [
        read_f32_from_bytes(bytes, format, "fuzz").err(),
        read_i64_from_bytes(bytes, format, "fuzz").err(),
        read_f64_from_bytes(bytes, format, "fuzz").err(),
        values.err(),
    ]
    .into_iter()
    .flatten()
    {
        assert!(result.to_string().starts_with("fuzz: "), "{result}");
    }
}

/// The path readers (streaming for the binary formats) give what the byte readers give: the
/// same table, or the same error message once the file name is swapped.
fn path_reads_like_bytes(bytes: &[u8], format: Format) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("f.{format}"));
    std::fs::write(&path, bytes).unwrap();
    let name = path.display().to_string();
    let msg = |e: knn_io::IoError| e.to_string().replacen(&name, "fuzz", 1);
    let (a, b) = (
        read_f32(&path, None),
        read_f32_from_bytes(bytes, format, "fuzz"),
    );
    match (a, b) {
        (Ok(a), Ok(b)) => {
            let bits =
                |t: &knn_io::Table<f32>| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                (a.rows, a.cols, bits(&a)),
                (b.rows, b.cols, bits(&b)),
                "{format}"
            );
        }
        (Err(a), Err(b)) => assert_eq!(msg(a), b.to_string(), "{format}"),
        (a, b) => panic!("{format}: path {a:?}, bytes {b:?}"),
    }
    match (
        read_i64(&path, None),
        read_i64_from_bytes(bytes, format, "fuzz"),
    ) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "{format}"),
        (Err(a), Err(b)) => assert_eq!(msg(a), b.to_string(), "{format}"),
        (a, b) => panic!("{format}: path {a:?}, bytes {b:?}"),
    }
}

fn format() -> impl Strategy<Value = Format> {
    prop::sample::select(Format::ALL.to_vec())
}

const NPY_DTYPES: [&str; 16] = [
    "<f4", ">f4", "<f8", ">f8", "<f2", "|u1", "|i1", "|b1", "<i2", ">u2", "<i4", ">i4", "<i8",
    ">i8", "<u4", "<u8",
];

/// A valid file of a random format, shape and content (small integer values, so that every
/// dtype holds them exactly), with the values it holds and whether it holds integers.
fn valid_file() -> impl Strategy<Value = (Format, Vec<u8>, Vec<f64>, bool)> {
    (
        format(),
        0usize..5,
        1usize..5,
        prop::sample::select(NPY_DTYPES.to_vec()),
        prop::sample::select(vec![1u8, 2, 3]),
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(0u8..100, 25),
    )
        .prop_map(|(format, rows, cols, descr, major, fortran, one_d, pool)| {
            let cols = if one_d && format == Format::Npy {
                1
            } else {
                cols
            };
            let values: Vec<f64> = pool[..rows * cols].iter().map(|&v| f64::from(v)).collect();
            let rows_of = |f: &dyn Fn(f64) -> Vec<u8>| -> Vec<u8> {
                values
                    .chunks(cols)
                    .flat_map(|r| {
                        let payload: Vec<u8> = r.iter().flat_map(|&v| f(v)).collect();
                        common::record(cols as i32, &payload)
                    })
                    .collect()
            };
            let bytes = match format {
                Format::Fvecs => rows_of(&|v| (v as f32).to_le_bytes().to_vec()),
                Format::Ivecs => rows_of(&|v| (v as i32).to_le_bytes().to_vec()),
                Format::Bvecs => rows_of(&|v| vec![v as u8]),
                Format::Npy => {
                    let stored = if descr == "|b1" {
                        values
                            .iter()
                            .map(|&v| f64::from(u8::from(v != 0.0)))
                            .collect()
                    } else {
                        values.clone()
                    };
                    let order: Vec<f64> = if fortran {
                        // Column-major: element k of the file is (k % rows, k / rows).
                        (0..rows * cols)
                            .map(|k| stored[(k % rows) * cols + k / rows])
                            .collect()
                    } else {
                        stored
                    };
                    let shape = if one_d {
                        format!("({rows},)")
                    } else {
                        format!("({rows}, {cols})")
                    };
                    let data = common::encode(descr, &order);
                    common::npy(major, &common::dict(descr, fortran, &shape), &data)
                }
                Format::Csv => values
                    .chunks(cols)
                    .map(|r| {
                        r.iter()
                            .map(|v| v.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                            + "\n"
                    })
                    .collect::<String>()
                    .into_bytes(),
            };
            let values = if format == Format::Npy && descr == "|b1" {
                values
                    .iter()
                    .map(|&v| f64::from(u8::from(v != 0.0)))
                    .collect()
            } else {
                values
            };
            let integers = match format {
                Format::Fvecs => false,
                Format::Npy => !descr.contains('f'),
                _ => true,
            };
            (format, bytes, values, integers)
        })
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, u8),
    Remove(usize),
    SetI32(usize, i32),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    // Bytes that matter to the parsers: header punctuation, digits, quotes, newlines.
    let interesting =
        prop::sample::select(b"(){}[],:'\" 0123456789-eE.TF\n\r<>|=fiubLx\x00\xff".to_vec());
    let ints = prop::sample::select(vec![
        0,
        -1,
        1,
        2,
        3,
        127,
        1 << 24,
        (1 << 24) + 1,
        i32::MAX,
        i32::MIN,
    ]);
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(p, x)| Mutation::Flip(p, x)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), interesting).prop_map(|(p, b)| Mutation::Insert(p, b)),
        any::<usize>().prop_map(Mutation::Remove),
        (any::<usize>(), ints).prop_map(|(p, v)| Mutation::SetI32(p, v)),
    ]
}

/// `bytes` with every mutation of `mutations` applied in turn.
fn mutated(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        apply(&mut bytes, m);
    }
    bytes
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let len = bytes.len();
    match *m {
        Mutation::Flip(p, x) if len > 0 => bytes[p % len] ^= x,
        Mutation::Truncate(p) => bytes.truncate(p % (len + 1)),
        Mutation::Insert(p, b) => bytes.insert(p % (len + 1), b),
        Mutation::Remove(p) if len > 0 => {
            bytes.remove(p % len);
        }
        Mutation::SetI32(p, v) if len >= 4 => {
            let at = p % (len - 3);
            bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600), f in format()) {
        read_all_ways(&bytes, f);
    }

    #[test]
    fn random_npy_after_a_valid_preamble(
        major in 0u8..5,
        len in any::<u16>(),
        tail in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut bytes = b"\x93NUMPY".to_vec();
        bytes.extend_from_slice(&[major, 0]);
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(&tail);
        read_all_ways(&bytes, Format::Npy);
    }

    #[test]
    fn random_text_never_panics(
        text in "[0-9a-zA-Z ,.\\-+eE\"\t\r\n]{0,200}",
        f in format(),
    ) {
        read_all_ways(text.as_bytes(), f);
    }

    #[test]
    fn valid_files_read_back((format, bytes, values, integers) in valid_file()) {
        let t = read_f32_from_bytes(&bytes, format, "ok").unwrap();
        prop_assert!(t.is_consistent());
        let want: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        prop_assert_eq!(&t.data, &want);
        let ids = read_i64_from_bytes(&bytes, format, "ok");
        if integers {
            let want: Vec<i64> = values.iter().map(|&v| v as i64).collect();
            prop_assert_eq!(ids.unwrap().data, want);
        } else {
            prop_assert!(ids.is_err());
        }
    }

    #[test]
    fn mutated_valid_files_never_panic(
        (format, bytes, _, _) in valid_file(),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        let bytes = mutated(bytes, &mutations);
        read_all_ways(&bytes, format);
    }

    #[test]
    fn path_readers_match_byte_readers(
        (format, bytes, _, _) in valid_file(),
        mutations in prop::collection::vec(mutation(), 0..4),
    ) {
        let bytes = mutated(bytes, &mutations);
        path_reads_like_bytes(&bytes, format);
    }
}

/// The HDF5 files h5py wrote for the tests (`tests/data/make_hdf5.py`).
fn hdf5_file() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(vec!["ann.hdf5", "angular.hdf5", "latest.hdf5"]).prop_map(|name| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name);
        std::fs::read(path).unwrap()
    })
}

/// Every dataset of the test files, and names that are none, read both ways.
fn read_hdf5_all_ways(bytes: &[u8]) {
    for dataset in [
        None,
        Some("train"),
        Some("test"),
        Some("neighbors"),
        Some("distances"),
        Some("grp/ids"),
        Some("half"),
        Some("cube"),
        Some("names"),
        Some("nope"),
    ] {
        match hdf5::read_f32_from_bytes(bytes, dataset, "fuzz") {
            Ok(t) => assert!(t.is_consistent(), "{dataset:?}"),
            Err(e) => assert!(e.to_string().starts_with("fuzz: "), "{e}"),
        }
        match hdf5::read_i64_from_bytes(bytes, dataset, "fuzz") {
            Ok(t) => assert!(t.is_consistent(), "{dataset:?}"),
            Err(e) => assert!(e.to_string().starts_with("fuzz: "), "{e}"),
        }
        match hdf5::read_values_from_bytes(bytes, dataset, "fuzz") {
            Ok(Values::F32(t)) => assert!(t.is_consistent(), "{dataset:?}"),
            Ok(Values::F64(t)) => assert!(t.is_consistent(), "{dataset:?}"),
            Err(e) => assert!(e.to_string().starts_with("fuzz: "), "{e}"),
        }
    }
}

fn csv_options() -> impl Strategy<Value = CsvOptions> {
    let header = prop::sample::select(vec![Header::Auto, Header::Present, Header::Absent]);
    let delimiter = prop::sample::select(vec![
        None,
        Some(Delimiter::Byte(b',')),
        Some(Delimiter::Byte(b';')),
        Some(Delimiter::Byte(b'\t')),
        Some(Delimiter::Byte(b'|')),
        Some(Delimiter::Whitespace),
    ]);
    (header, delimiter, any::<bool>()).prop_map(|(header, delimiter, finite_only)| CsvOptions {
        header,
        delimiter,
        finite_only,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic_the_hdf5_reader(
        bytes in prop::collection::vec(any::<u8>(), 0..2000),
        signature in any::<bool>(),
    ) {
        let mut bytes = bytes;
        if signature {
            // Past the signature check, into the superblock parser.
            bytes.splice(0..0, *b"\x89HDF\r\n\x1a\n");
        }
        read_hdf5_all_ways(&bytes);
    }

    #[test]
    fn mutated_hdf5_files_never_panic(
        bytes in hdf5_file(),
        mutations in prop::collection::vec(mutation(), 1..8),
    ) {
        let bytes = mutated(bytes, &mutations);
        read_hdf5_all_ways(&bytes);
    }

    #[test]
    fn random_text_with_any_options_never_panics(
        text in "[0-9a-zA-Z ,;|.\\-+eE\"\t\r\n]{0,300}",
        options in csv_options(),
    ) {
        match read_csv_f32_from_bytes(text.as_bytes(), &options, "fuzz") {
            Ok(t) => {
                prop_assert!(t.is_consistent());
                if options.finite_only {
                    prop_assert!(t.data.iter().all(|v| v.is_finite()));
                }
            }
            Err(e) => prop_assert!(e.to_string().starts_with("fuzz: "), "{}", e),
        }
    }
}

//! fvecs, ivecs, bvecs: round trips and every error with its file name and position.

mod common;

use common::{assert_err, bvecs, fvecs, ivecs, record};
use knn_io::{
    read_f32, read_f32_from_bytes, read_i64, read_i64_from_bytes, write_f32, write_i64, Format,
    Table,
};

fn table<T>(data: Vec<T>, rows: usize, cols: usize) -> Table<T> {
    Table { data, rows, cols }
}

#[test]
fn fvecs_round_trip_is_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.fvecs");
    let data = vec![
        1.5,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE / 4.0,
        f32::MAX,
        -1e-30,
        7.0,
    ];
    let t = table(data, 3, 3);
    write_f32(&path, None, &t).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 * (4 + 12));
    let back = read_f32(&path, None).unwrap();
    assert_eq!((back.rows, back.cols), (3, 3));
    let bits = |t: &Table<f32>| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&back), bits(&t));
    // The bytes are exactly the hand-built layout.
    let rows: Vec<&[f32]> = t.data.chunks(3).collect();
    assert_eq!(std::fs::read(&path).unwrap(), fvecs(&rows));
}

#[test]
fn ivecs_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gt.ivecs");
    let t = table(vec![0, -1, i32::MAX as i64, i32::MIN as i64, 5, 6], 2, 3);
    write_i64(&path, None, &t).unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        ivecs(&[&[0, -1, i32::MAX], &[i32::MIN, 5, 6]])
    );
    assert_eq!(read_i64(&path, None).unwrap(), t);
}

#[test]
fn ivecs_as_f32_exact_up_to_2_pow_24() {
    let limit = 1 << 24;
    let bytes = ivecs(&[&[1, -limit, limit], &[0, 2, 3]]);
    let t = read_f32_from_bytes(&bytes, Format::Ivecs, "gt.ivecs").unwrap();
    assert_eq!(t.data, [1.0, -16777216.0, 16777216.0, 0.0, 2.0, 3.0]);

    let bytes = ivecs(&[&[1, 2, 3], &[0, limit + 1, 3]]);
    assert_err(
        read_f32_from_bytes(&bytes, Format::Ivecs, "gt.ivecs"),
        &[
            "gt.ivecs: record 1 at byte 16, element 1 (byte 24)",
            "16777217",
            "2^24",
        ],
    );
}

#[test]
fn bvecs_reads_as_f32_and_i64() {
    let bytes = bvecs(&[&[0, 1, 255], &[7, 8, 9]]);
    let f = read_f32_from_bytes(&bytes, Format::Bvecs, "b.bvecs").unwrap();
    assert_eq!(f, table(vec![0.0, 1.0, 255.0, 7.0, 8.0, 9.0], 2, 3));
    let i = read_i64_from_bytes(&bytes, Format::Bvecs, "b.bvecs").unwrap();
    assert_eq!(i, table(vec![0, 1, 255, 7, 8, 9], 2, 3));
}

#[test]
fn empty_files_are_zero_rows() {
    for format in [Format::Fvecs, Format::Ivecs, Format::Bvecs] {
        let t = read_f32_from_bytes(&[], format, "e").unwrap();
        assert_eq!((t.rows, t.cols, t.data.len()), (0, 0, 0));
    }
    let t = read_i64_from_bytes(&[], Format::Ivecs, "e").unwrap();
    assert_eq!((t.rows, t.cols), (0, 0));
}

#[test]
fn dimension_mismatch_names_record_and_byte() {
    let row = vec![0.5f32; 128];
    let mut rows: Vec<&[f32]> = vec![&row; 17];
    let short = vec![1.0f32; 64];
    rows.push(&short);
    rows.push(&row);
    let bytes = fvecs(&rows);
    let e = read_f32_from_bytes(&bytes, Format::Fvecs, "data.fvecs").unwrap_err();
    assert_eq!(
        e.to_string(),
        "data.fvecs: record 17 at byte 8772: dimension 64 differs from the first record's 128"
    );
    assert_eq!(e.file(), "data.fvecs");
}

#[test]
fn truncated_record_names_needs_and_remains() {
    let row = vec![0.5f32; 128];
    let mut bytes = fvecs(&[&row, &row, &row, &row]);
    bytes.truncate(3 * 516 + 200);
    let e = read_f32_from_bytes(&bytes, Format::Fvecs, "data.fvecs").unwrap_err();
    assert_eq!(
        e.to_string(),
        "data.fvecs: truncated: record 3 at byte 1548 needs 516 bytes, 200 remain"
    );
    // A tail shorter than the dimension field.
    let mut bytes = fvecs(&[&row]);
    bytes.extend_from_slice(&[1, 2]);
    assert_err(
        read_f32_from_bytes(&bytes, Format::Fvecs, "data.fvecs"),
        &["data.fvecs: truncated: record 1 at byte 516 needs 516 bytes, 2 remain"],
    );
    // A file shorter than one dimension field.
    assert_err(
        read_f32_from_bytes(&[1, 0], Format::Fvecs, "tiny.fvecs"),
        &["tiny.fvecs: truncated: record 0 at byte 0 needs at least 4 bytes, 2 remain"],
    );
}

#[test]
fn truncated_tail_with_another_dimension_reports_the_dimension() {
    let mut bytes = ivecs(&[&[1, 2, 3]]);
    bytes.extend_from_slice(&record(2, &[0; 4]));
    assert_err(
        read_i64_from_bytes(&bytes, Format::Ivecs, "x.ivecs"),
        &["x.ivecs: record 1 at byte 16: dimension 2 differs from the first record's 3"],
    );
}

#[test]
fn non_positive_dimension() {
    for d in [0, -1, i32::MIN] {
        let bytes = record(d, &[0; 16]);
        assert_err(
            read_f32_from_bytes(&bytes, Format::Bvecs, "z.bvecs"),
            &["z.bvecs: record 0 at byte 0: dimension", "is not positive"],
        );
    }
}

#[test]
fn huge_dimension_in_a_small_file_is_truncation_not_allocation() {
    let bytes = record(i32::MAX, &[0; 12]);
    assert_err(
        read_f32_from_bytes(&bytes, Format::Fvecs, "h.fvecs"),
        &["h.fvecs: truncated: record 0 at byte 0 needs 8589934592 bytes, 16 remain"],
    );
}

#[test]
fn fvecs_is_not_integers() {
    let bytes = fvecs(&[&[1.0]]);
    assert_err(
        read_i64_from_bytes(&bytes, Format::Fvecs, "ids.fvecs"),
        &["ids.fvecs: format fvecs holds floating-point values"],
    );
}

#[test]
fn writers_refuse_what_the_format_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    let t = table(vec![1.0f32, 2.0], 1, 2);
    for name in ["out.ivecs", "out.bvecs"] {
        let path = dir.path().join(name);
        let e = write_f32(&path, None, &t).unwrap_err().to_string();
        assert!(e.ends_with(&format!(
            "{name}: format {} cannot hold f32 values",
            &name[4..]
        )));
        assert!(!path.exists());
    }
    let ids = table(vec![1i64, 2], 1, 2);
    for name in ["out.fvecs", "out.bvecs"] {
        let path = dir.path().join(name);
        assert_err(
            write_i64(&path, None, &ids),
            &[name, "cannot hold i64 values"],
        );
    }
    let path = dir.path().join("big.ivecs");
    let t = table(vec![1i64, 2, 3, 1 << 31], 2, 2);
    assert_err(
        write_i64(&path, None, &t),
        &["big.ivecs: row 1, column 1: value 2147483648 does not fit in i32"],
    );
    assert!(!path.exists());
    // Records cannot have dimension 0.
    let t = table(Vec::<f32>::new(), 3, 0);
    assert_err(
        write_f32(&dir.path().join("z.fvecs"), None, &t),
        &["z.fvecs: format fvecs cannot hold rows of 0 values"],
    );
    // An empty table is an empty file, which reads back as 0 x 0.
    let path = dir.path().join("empty.fvecs");
    write_f32(&path, None, &table(vec![], 0, 5)).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    assert_eq!(read_f32(&path, None).unwrap().rows, 0);
}

#[test]
fn spilled_copies_equal_the_read_values_and_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let spill_dir = tempfile::tempdir().unwrap();
    // Enough records to cross the sink's batch size (2^20 values) more than once.
    let rows: Vec<Vec<f32>> = (0..9000)
        .map(|r| {
            (0..300)
                .map(|c| (r * 300 + c) as f32 * 0.25 - 7.0)
                .collect()
        })
        .collect();
    let refs: Vec<&[f32]> = rows.iter().map(|r| &r[..]).collect();
    let f = dir.path().join("a.fvecs");
    std::fs::write(&f, fvecs(&refs)).unwrap();
    let b = dir.path().join("a.bvecs");
    let bytes: Vec<Vec<u8>> = (0..50)
        .map(|r| (0..7).map(|c| (r * 7 + c) as u8).collect())
        .collect();
    let brefs: Vec<&[u8]> = bytes.iter().map(|r| &r[..]).collect();
    std::fs::write(&b, bvecs(&brefs)).unwrap();
    for path in [&f, &b] {
        let want = read_f32(path, None).unwrap();
        let got = knn_io::spill_f32(path, None, spill_dir.path())
            .unwrap()
            .unwrap();
        assert_eq!((got.rows(), got.cols()), (want.rows, want.cols));
        assert_eq!(got.values(), &want.data[..]);
    }
    assert_eq!(std::fs::read_dir(spill_dir.path()).unwrap().count(), 0);
    // Not a records format, or empty: nothing to spill.
    let e = dir.path().join("e.fvecs");
    std::fs::write(&e, b"").unwrap();
    assert!(knn_io::spill_f32(&e, None, spill_dir.path())
        .unwrap()
        .is_none());
    assert!(knn_io::spill_f32(&e, Some(Format::Csv), spill_dir.path())
        .unwrap()
        .is_none());
    // A bad record: the reader's own error, file and position named.
    let row = vec![0.5f32; 128];
    let short = vec![1.0f32; 64];
    let bad = dir.path().join("bad.fvecs");
    std::fs::write(&bad, fvecs(&[&row[..], &row, &short])).unwrap();
    assert_err(
        knn_io::spill_f32(&bad, None, spill_dir.path()).map(|m| m.map(|m| m.rows())),
        &["bad.fvecs: record 2 at byte 1032: dimension 64 differs from the first record's 128"],
    );
    assert_eq!(std::fs::read_dir(spill_dir.path()).unwrap().count(), 0);
}

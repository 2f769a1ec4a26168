//! CSV: round trips, headers, spacing, and errors with line and column.

mod common;

use common::assert_err;
use knn_io::{
    read_f32, read_f32_from_bytes, read_i64, read_i64_from_bytes, write_f32, write_i64, Format,
    Table,
};

fn f32s(text: &str) -> Result<Table<f32>, knn_io::IoError> {
    read_f32_from_bytes(text.as_bytes(), Format::Csv, "x.csv")
}

fn i64s(text: &str) -> Result<Table<i64>, knn_io::IoError> {
    read_i64_from_bytes(text.as_bytes(), Format::Csv, "x.csv")
}

#[test]
fn plain_numbers() {
    let t = f32s("1,2,3\n4.5,-6e2,.25\n").unwrap();
    assert_eq!(
        t,
        Table {
            data: vec![1.0, 2.0, 3.0, 4.5, -600.0, 0.25],
            rows: 2,
            cols: 3
        }
    );
}

#[test]
fn spaces_quotes_crlf_bom_blank_lines() {
    let text = "\u{feff} 1 , 2\t\r\n\r\n\"3\",  4  \r\n   \n5,6\n\n\n";
    let t = f32s(text).unwrap();
    assert_eq!((t.rows, t.cols), (3, 2));
    assert_eq!(t.data, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    // No final newline.
    assert_eq!(i64s("1,2\n3,4").unwrap().data, [1, 2, 3, 4]);
}

#[test]
fn header_is_skipped() {
    let t = f32s("x, y ,label\n1,2,3\n").unwrap();
    assert_eq!((t.rows, t.cols, t.data), (1, 3, vec![1.0, 2.0, 3.0]));
    // A header with numeric-looking names mixed in is still a header.
    let t = i64s("id,2,3\n7,8,9\n").unwrap();
    assert_eq!(t.data, [7, 8, 9]);
    // NaN and inf are numbers, so such a first line is data.
    let t = f32s("nan,inf,-Infinity\n1,2,3\n").unwrap();
    assert_eq!(t.rows, 2);
    assert!(t.data[0].is_nan());
    assert_eq!(t.data[1], f32::INFINITY);
    assert_eq!(t.data[2], f32::NEG_INFINITY);
    // Only a header: 0 rows, the header's columns.
    let t = f32s("a,b\n").unwrap();
    assert_eq!((t.rows, t.cols, t.data.len()), (0, 2, 0));
    // Only a second line can be wrong once a header was seen.
    assert_err(
        f32s("a,b\nc,d\n"),
        &["x.csv: line 2, column 1: 'c' is not a number"],
    );
}

#[test]
fn empty_input() {
    for text in ["", "\n\n", "\u{feff}"] {
        let t = f32s(text).unwrap();
        assert_eq!((t.rows, t.cols), (0, 0), "{text:?}");
    }
}

#[test]
fn bad_cells_name_line_and_column() {
    let text = "a,b,c\n1,2,3\n4,5,6\n\n7,8,abc\n";
    assert_eq!(
        f32s(text).unwrap_err().to_string(),
        "x.csv: line 5, column 3: 'abc' is not a number"
    );
    assert_err(
        f32s("1,2\n3,\n"),
        &["x.csv: line 2, column 2: '' is not a number"],
    );
    assert_err(
        f32s("1,2\n3,1e50\n"),
        &["x.csv: line 2, column 2: '1e50' is beyond the f32 range"],
    );
    assert_err(
        i64s("1,2\n3,4.5\n"),
        &["x.csv: line 2, column 2: '4.5' is not an integer"],
    );
    assert_err(
        i64s("1\n99999999999999999999\n"),
        &["x.csv: line 2, column 1: '99999999999999999999' does not fit in i64"],
    );
    assert_err(i64s("1\nzz\n"), &["line 2, column 1: 'zz' is not a number"]);
    let long = "q".repeat(100);
    let e = f32s(&format!("1\n{long}\n")).unwrap_err().to_string();
    assert!(e.contains("...'") && e.len() < 120, "{e}");
    assert_err(
        read_f32_from_bytes(b"1,2\n3,\xff\n", Format::Csv, "x.csv"),
        &["x.csv: line 2, column 2: not valid UTF-8"],
    );
}

#[test]
fn ragged_rows() {
    assert_eq!(
        f32s("h1,h2\n1,2\n3,4\n5,6,7\n").unwrap_err().to_string(),
        "x.csv: line 4: 3 columns, but the first data line (2) has 2"
    );
    assert_err(i64s("1,2,3\n4\n"), &["x.csv: line 2: 1 columns"]);
}

#[test]
fn f32_round_trip_is_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.csv");
    let data = vec![
        0.1,
        -0.0,
        1e-7,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        1e-45,
        123456789.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        2.0,
    ];
    let t = Table {
        data,
        rows: 4,
        cols: 3,
    };
    write_f32(&path, None, &t).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 4);
    assert_eq!(text.lines().nth(2), Some("1e-45,123456790.0,NaN"));
    assert_eq!(text.lines().nth(3), Some("inf,-inf,2.0"));
    let back = read_f32(&path, None).unwrap();
    let bits = |t: &Table<f32>| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!((back.rows, back.cols), (4, 3));
    assert_eq!(bits(&back), bits(&t));
}

#[test]
fn i64_round_trip_and_txt_extension() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("labels.txt");
    let t = Table {
        data: vec![i64::MIN, -1, 0, i64::MAX],
        rows: 2,
        cols: 2,
    };
    write_i64(&path, None, &t).unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "-9223372036854775808,-1\n0,9223372036854775807\n"
    );
    assert_eq!(read_i64(&path, None).unwrap(), t);
    // Integers read as f32 too.
    assert_eq!(read_f32(&path, None).unwrap().data[1], -1.0);
}

#[test]
fn zero_column_rows_cannot_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let t = Table {
        data: Vec::<f32>::new(),
        rows: 2,
        cols: 0,
    };
    assert_err(
        write_f32(&dir.path().join("z.csv"), None, &t),
        &["z.csv: format csv cannot hold rows of 0 values"],
    );
}

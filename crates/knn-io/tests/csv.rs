//! CSV: round trips, headers, spacing, and errors with line and column.

mod common;

use common::assert_err;
use knn_io::{
    read_csv_f32_from_bytes, read_f32, read_f32_from_bytes, read_i64, read_i64_from_bytes,
    write_f32, write_i64, CsvOptions, Delimiter, Format, Header, Table,
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
    // A first line with a number in it is data, so its other cells must be numbers too.
    assert_err(
        i64s("id,2,3\n7,8,9\n"),
        &["x.csv: line 1, column 1: 'id' is not a number"],
    );
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
        "x.csv: line 4: 3 columns, but the first data line (2) has 2 (delimiter: ',')"
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

fn with(
    text: &str,
    header: Header,
    delimiter: Option<&str>,
) -> Result<Table<f32>, knn_io::IoError> {
    let options = CsvOptions {
        header,
        delimiter: delimiter.map(|d| d.parse().unwrap()),
        finite_only: false,
    };
    read_csv_f32_from_bytes(text.as_bytes(), &options, "x.csv")
}

#[test]
fn a_first_line_with_a_number_is_data_and_must_parse() {
    // Issue 24: `1,NA` was taken for a header and vanished, shifting every later id by one.
    assert_err(
        f32s("1,NA\n2,3\n4,5\n"),
        &["x.csv: line 1, column 2: 'NA' is not a number"],
    );
    // A header has no number at all.
    let t = f32s("x,y\n1,2\n").unwrap();
    assert_eq!((t.rows, t.data), (1, vec![1.0, 2.0]));
    // Empty cells in a header are fine; a line of empty cells is not a header.
    assert_eq!(f32s(",label\n1,2\n").unwrap().rows, 1);
    assert_err(f32s(",\n1,2\n"), &["line 1, column 1: '' is not a number"]);
}

#[test]
fn header_and_no_header_decide_the_first_line() {
    // --header: the first line is skipped even when it holds numbers (names like `1`, `2`).
    let t = with("1,2\n3,4\n", Header::Present, None).unwrap();
    assert_eq!((t.rows, t.data), (1, vec![3.0, 4.0]));
    let t = with("id,2\n3,4\n", Header::Present, None).unwrap();
    assert_eq!(t.data, [3.0, 4.0]);
    // --no-header: a first line of names is an error, not silently skipped.
    assert_err(
        with("x,y\n1,2\n", Header::Absent, None),
        &["x.csv: line 1, column 1: 'x' is not a number"],
    );
    assert_eq!(with("1,2\n3,4\n", Header::Absent, None).unwrap().rows, 2);
}

#[test]
fn delimiters_are_detected() {
    let want = [1.0, 2.5, -3.0, 4.0, 5.0, 6e-3];
    for (what, text) in [
        ("comma", "1,2.5,-3\n4,5,6e-3\n"),
        ("comma and spaces", "1, 2.5, -3\n4, 5, 6e-3\n"),
        ("tab", "1\t2.5\t-3\n4\t5\t6e-3\n"),
        ("semicolon", "1;2.5;-3\r\n4;5;6e-3\r\n"),
        ("spaces", "  1  2.5 -3\n4 5     6e-3  \n"),
        (
            "savetxt default",
            "1.000000000000000000e+00 2.500000000000000000e+00 -3.000000000000000000e+00\n\
             4.000000000000000000e+00 5.000000000000000000e+00 6.000000000000000000e-03\n",
        ),
        ("tab with a header", "x\ty\tz\n1\t2.5\t-3\n4\t5\t6e-3\n"),
        ("semicolon with a header", "x;y;z\n1;2.5;-3\n4;5;6e-3\n"),
        ("spaces with a header", "# x y z\n1 2.5 -3\n4 5 6e-3\n"),
    ] {
        let t = f32s(text).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            (t.rows, t.cols, t.data.as_slice()),
            (2, 3, &want[..]),
            "{what}"
        );
    }
    // One column: one value per line, whatever the delimiter.
    let t = f32s("1\n2\n3\n").unwrap();
    assert_eq!((t.rows, t.cols), (3, 1));
}

#[test]
fn delimiter_option_overrides_detection() {
    let t = with("1|2\n3|4\n", Header::Auto, Some("|")).unwrap();
    assert_eq!(t.data, [1.0, 2.0, 3.0, 4.0]);
    let t = with("1 2\n3 4\n", Header::Auto, Some("space")).unwrap();
    assert_eq!(t.data, [1.0, 2.0, 3.0, 4.0]);
    let t = with("1\t2\n3\t4\n", Header::Auto, Some("tab")).unwrap();
    assert_eq!(t.cols, 2);
    // The wrong delimiter: the error says which delimiter the cell holds.
    assert_err(
        with("1;2\n3;4\n", Header::Auto, Some(",")),
        &[
            "x.csv: line 1, column 1: '1;2' is not a number",
            "separated by ';'",
            "--delimiter ';'",
        ],
    );
    assert_err(
        with("1 2\n3 4\n", Header::Auto, Some(";")),
        &["'1 2' is not a number", "--delimiter space"],
    );
    assert_err(
        with("1\t2\n3\t4\n", Header::Auto, Some(",")),
        &["--delimiter tab"],
    );
    // A cell that is not a number and holds no numbers gets no hint.
    let e = with("1,abc\n", Header::Absent, None)
        .unwrap_err()
        .to_string();
    assert!(!e.contains("--delimiter"), "{e}");
}

#[test]
fn delimiter_names_parse() {
    for (text, want) in [
        (",", Delimiter::Byte(b',')),
        ("comma", Delimiter::Byte(b',')),
        (";", Delimiter::Byte(b';')),
        ("tab", Delimiter::Byte(b'\t')),
        ("\\t", Delimiter::Byte(b'\t')),
        ("\t", Delimiter::Byte(b'\t')),
        ("space", Delimiter::Whitespace),
        (" ", Delimiter::Whitespace),
        ("|", Delimiter::Byte(b'|')),
    ] {
        assert_eq!(text.parse::<Delimiter>().unwrap(), want, "{text:?}");
    }
    for bad in ["", "ab", "1", ".", "-", "x"] {
        let e = bad.parse::<Delimiter>().unwrap_err().to_string();
        assert!(e.contains("is not a delimiter"), "{bad:?}: {e}");
    }
}

#[test]
fn non_finite_values_are_refused_by_line_and_column_when_asked() {
    let options = CsvOptions {
        finite_only: true,
        ..CsvOptions::default()
    };
    let read = |t: &str| read_csv_f32_from_bytes(t.as_bytes(), &options, "x.csv");
    assert_err(
        read("x,y\n1,2\n\n3,NaN\n"),
        &["x.csv: line 4, column 2: 'NaN' is not a finite number"],
    );
    assert_err(
        read("-inf 1\n"),
        &["x.csv: line 1, column 1: '-inf' is not a finite"],
    );
    assert_eq!(read("1,2\n").unwrap().data, [1.0, 2.0]);
    // Without the option they are values (distances read back may be infinite).
    assert!(f32s("1,inf\n").unwrap().data[1].is_infinite());
}

#[test]
fn tsv_files_are_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("points.TSV");
    std::fs::write(&path, "a\tb\n1\t2\n3\t4\n").unwrap();
    let t = read_f32(&path, None).unwrap();
    assert_eq!((t.rows, t.cols, t.data), (2, 2, vec![1.0, 2.0, 3.0, 4.0]));
}

//! `knn classify` reads its files as search does (issue 24): text flags, standard input, HDF5
//! datasets; probabilities come in float64 as scikit-learn's `predict_proba` gives them.

mod common;

use common::{classify_args, fails, file, knn_with, ok, p, text};
use std::path::Path;

/// Five labelled points in two clusters and three points to classify.
const TRAIN: [[&str; 2]; 5] = [["0", "0"], ["0", "1"], ["5", "5"], ["5", "6"], ["9", "9"]];
const QUERIES: [[&str; 2]; 3] = [["0", "0.4"], ["5", "5.4"], ["9", "8.8"]];

/// `rows` as text: an optional header line, cells joined by `sep`.
fn table(rows: &[[&str; 2]], sep: &str, header: Option<&str>) -> String {
    let mut s: String = header.map(|h| format!("{h}\n")).unwrap_or_default();
    for r in rows {
        s += &r.join(sep);
        s.push('\n');
    }
    s
}

/// Runs `knn classify` on the CPU with k = 1 into `out`; returns its messages.
fn classify(train: &str, labels: &str, q: &str, out: &str, extra: &[&str]) -> String {
    let cpu = ["-k", "1", "--device", "cpu", "-o", out, "--quiet"];
    ok(&classify_args(
        train,
        labels,
        q,
        &[&cpu[..], extra].concat(),
    ))
}

#[test]
fn header_no_header_and_delimiter_apply_to_every_text_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let want = "7\n3\n-1\n";
    // Semicolons and header lines: found without flags (a header holds no number).
    let train = file(d, "t.csv", &table(&TRAIN, ";", Some("x;y")));
    let q = file(d, "q.csv", &table(&QUERIES, ";", Some("x;y")));
    let labels = file(d, "l.csv", "label\n7\n7\n3\n3\n-1\n");
    let out = p(d, "out.csv");
    classify(&train, &labels, &q, &out, &[]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), want);
    // --delimiter: labels all in one row, separated by semicolons, and the points.
    let one_row = file(d, "row.csv", "7;7;3;3;-1\n");
    let out = p(d, "out2.csv");
    classify(&train, &one_row, &q, &out, &["--delimiter", ";"]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), want);
    // --header: a first line of numbers is a header in every file.
    let train_h = file(d, "th.csv", &table(&TRAIN, ",", Some("100,100")));
    let q_h = file(d, "qh.csv", &table(&QUERIES, ",", Some("100,100")));
    let labels_h = file(d, "lh.csv", "0\n7\n7\n3\n3\n-1\n");
    let out = p(d, "out3.csv");
    classify(&train_h, &labels_h, &q_h, &out, &["--header"]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), want);
    // Without it, those first lines are data: six points, six labels, four queries.
    let out = p(d, "out4.csv");
    classify(&train_h, &labels_h, &q_h, &out, &[]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "0\n7\n3\n-1\n");
    // --no-header: a header line is data, and an error naming its line and column.
    let e = fails(
        &classify_args(&train, &labels, &q, &["--no-header", "-o", &p(d, "x.csv")]),
        2,
    );
    assert!(e.contains("t.csv: line 1, column 1: 'x'"), "{e}");
    // Text labels under a header line: --no-header keeps the line, so one label too many.
    let names = file(d, "names.csv", "species\na\na\nb\nb\nc\n");
    let plain_train = file(d, "pt.csv", &table(&TRAIN, ",", None));
    let plain_q = file(d, "pq.csv", &table(&QUERIES, ",", None));
    let out = p(d, "names_out.csv");
    classify(&plain_train, &names, &plain_q, &out, &[]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "a\nb\nc\n");
    let e = fails(
        &classify_args(
            &plain_train,
            &names,
            &plain_q,
            &["--no-header", "-o", &p(d, "y.csv")],
        ),
        2,
    );
    assert!(e.contains("6 labels for 5 labelled points"), "{e}");
    // The seed CSV has its own layout: the text flags are refused with --csv.
    let seed = file(d, "seed.csv", "2,1,2,1\n0,0\n10,1\n1,-1\n");
    let e = fails(&["classify", "--csv", &seed, "-k", "1", "--header"], 2);
    assert!(
        e.contains("the seed CSV of --csv has its own layout"),
        "{e}"
    );
}

#[test]
fn probabilities_npy_are_float64() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let train = file(d, "t.csv", &table(&TRAIN, ",", None));
    let q = file(d, "q.csv", &table(&QUERIES, ",", None));
    let labels = file(d, "l.csv", "7\n7\n3\n3\n-1\n");
    let (pn, pc) = (p(d, "p.npy"), p(d, "p.csv"));
    let out = p(d, "out.csv");
    // k = 3, distance weights: probabilities that are no float32 values.
    let args = [
        "-k",
        "3",
        "--weights",
        "distance",
        "--device",
        "cpu",
        "--quiet",
    ];
    let run = |proba: &str| {
        ok(&classify_args(
            &train,
            &labels,
            &q,
            &[&args[..], &["-o", &out, "--force", "--proba", proba]].concat(),
        ))
    };
    run(&pn);
    run(&pc);
    let bytes = std::fs::read(&pn).unwrap();
    let header = String::from_utf8_lossy(&bytes[..128]).into_owned();
    assert!(
        header.contains("'descr': '<f8'") && header.contains("(3, 3)"),
        "{header}"
    );
    let npy = knn_io::read_f64(Path::new(&pn), None).unwrap();
    // The .csv's header names the classes (-1, 3, 7: numbers, so say it is a header).
    let header = knn_io::ReadOptions {
        csv: knn_io::CsvOptions {
            header: knn_io::Header::Present,
            ..knn_io::CsvOptions::default()
        },
        ..knn_io::ReadOptions::default()
    };
    assert!(std::fs::read_to_string(&pc)
        .unwrap()
        .starts_with("-1,3,7\n"));
    let csv = knn_io::read_f64_with(Path::new(&pc), &header).unwrap();
    assert_eq!(
        npy.data, csv.data,
        "the .npy holds the digits the .csv shows"
    );
    assert!(
        npy.data.iter().any(|&v| v as f32 as f64 != v),
        "{:?}",
        npy.data
    );
    for row in npy.data.chunks(3) {
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{row:?}");
    }
}

#[test]
fn points_from_standard_input_and_hdf5_datasets() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let train = file(d, "t.csv", &table(&TRAIN, ",", None));
    let labels = file(d, "l.csv", "7\n7\n3\n3\n-1\n");
    let queries = table(&QUERIES, ",", None);
    let args = classify_args(&train, &labels, "-", &["-k", "1", "-o", "-", "--quiet"]);
    let o = knn_with(&args, &[], queries.as_bytes());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8(o.stdout).unwrap(), "7\n3\n-1\n");
    let both = classify_args("-", &labels, "-", &["-o", "-"]);
    let e = fails(&both, 2);
    assert!(
        e.contains("only one input can be read from standard input"),
        "{e}"
    );
    // An ann-benchmarks file: --train reads its `train`, -q its `test`. With labels id % 3,
    // each query's class is that of its stored nearest neighbour.
    let ann = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../knn-io/tests/data/ann.hdf5")
        .display()
        .to_string();
    let ids: Vec<String> = (0..300).map(|i| (i % 3).to_string()).collect();
    let labels = file(d, "ann_labels.csv", &(ids.join("\n") + "\n"));
    let out = p(d, "ann.npy");
    classify(&ann, &labels, &ann, &out, &[]);
    let got = knn_io::read_i64(Path::new(&out), None).unwrap();
    let nn = knn_io::read_i64(Path::new(&format!("{ann}:neighbors")), None).unwrap();
    let want: Vec<i64> = (0..nn.rows).map(|i| nn.row(i)[0] % 3).collect();
    assert_eq!(got.data, want);
}

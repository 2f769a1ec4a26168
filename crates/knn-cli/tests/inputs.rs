//! Inputs read as the user meant (issue 24): HDF5 files of ann-benchmarks, CSV headers and
//! delimiters, positions as line and column, and one answer whatever the format.

mod common;

use common::{fails, graph_args, graph_cpu, ok, p, search_cpu};
use std::path::{Path, PathBuf};

/// A test file made by `crates/knn-io/tests/data/make_hdf5.py` (h5py).
fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../knn-io/tests/data")
        .join(name)
        .display()
        .to_string()
}

/// `knn search` on the CPU into `out`, then `extra`; returns its messages.
fn search(base: &str, queries: &str, k: usize, out: &str, extra: &[&str]) -> String {
    let k = k.to_string();
    ok(&search_cpu(
        base,
        queries,
        &k,
        &[&["-o", out], extra].concat(),
    ))
}

/// Writes `text` into `path`; returns the messages of a `knn graph` of it, which must fail.
fn graph_fails_on(path: &str, text: &str, extra: &[&str]) -> String {
    std::fs::write(path, text).unwrap();
    fails(&graph_cpu(path, "1", extra), 2)
}

fn ids(path: &str) -> knn_io::Table<i64> {
    knn_io::read_i64(Path::new(path), None).unwrap()
}

#[test]
fn hdf5_search_reads_train_and_test_and_finds_the_stored_neighbors() {
    let dir = tempfile::tempdir().unwrap();
    let ann = fixture("ann.hdf5");
    let out = p(dir.path(), "nn.npy");
    let msg = search(&ann, &ann, 10, &out, &[]);
    assert!(msg.contains("25 queries × 300 base points (d=8)"), "{msg}");
    // The file's distance attribute (euclidean) chose l2.
    assert!(msg.contains("k=10, l2,"), "{msg}");
    let truth = knn_io::read_i64(Path::new(&format!("{ann}:neighbors")), None).unwrap();
    assert_eq!(ids(&out), truth);
    // verify against the file: neighbors (int32) and distances.
    let v = ok(&["verify", "-r", &out, "--truth", &ann]);
    assert!(
        v.contains("id recall against") && v.contains("with ties") && v.contains("PASSED"),
        "{v}"
    );
    // And exactly, from its train and test.
    let v = ok(&["verify", "-r", &out, "-b", &ann, "-q", &ann]);
    assert!(v.contains("tie-aware recall 1.000000"), "{v}");
}

#[test]
fn hdf5_verify_catches_a_wrong_result() {
    let dir = tempfile::tempdir().unwrap();
    let ann = fixture("ann.hdf5");
    let out = p(dir.path(), "nn.npy");
    search(&ann, &ann, 10, &out, &[]);
    // Swap each row's nearest for a far point (the row's 10th neighbour of another query).
    let mut t = ids(&out);
    let d = knn_io::read_f32(&dir.path().join("nn.dist.npy"), None).unwrap();
    for i in 0..t.rows {
        t.data[i * t.cols] = 299 - t.data[i * t.cols];
    }
    knn_io::write_i64(&dir.path().join("bad.npy"), None, &t).unwrap();
    knn_io::write_f32(&dir.path().join("bad.dist.npy"), None, &d).unwrap();
    let v = fails(
        &["verify", "-r", &p(dir.path(), "bad.npy"), "--truth", &ann],
        1,
    );
    assert!(v.contains("FAILED"), "{v}");
}

#[test]
fn hdf5_names_a_dataset_and_its_metric_attribute_is_a_default() {
    let dir = tempfile::tempdir().unwrap();
    let ang = fixture("angular.hdf5");
    let out = p(dir.path(), "a.npy");
    // angular = cosine; chunked, compressed float64 train; FILE:NAME for the queries.
    let msg = search(&ang, &format!("{ang}:test"), 5, &out, &[]);
    assert!(
        msg.contains("9 queries × 120 base points (d=6), k=5, cosine"),
        "{msg}"
    );
    // int64 neighbors.
    let v = ok(&["verify", "-r", &out, "--truth", &ang]);
    assert!(v.contains("PASSED"), "{v}");
    // -m wins over the file's attribute.
    let msg = search(&ang, &ang, 5, &p(dir.path(), "l2.npy"), &["-m", "l2"]);
    assert!(msg.contains("k=5, l2,"), "{msg}");
    // A graph of the train set.
    let msg = ok(&graph_cpu(&ang, "3", &["-o", &p(dir.path(), "g.npy")]));
    assert!(msg.contains("120 points"), "{msg}");
    assert!(msg.contains("cosine"), "{msg}");
    // A missing dataset lists the ones there are.
    let e = fails(&search_cpu(&ang, &format!("{ang}:queries"), "1", &[]), 2);
    assert!(
        e.contains("no dataset 'queries'") && e.contains("neighbors, test, train"),
        "{e}"
    );
    // A 3-D dataset is named as such.
    let e = fails(&search_cpu(&ang, &format!("{ang}:cube"), "1", &[]), 2);
    assert!(e.contains("dataset 'cube': has 3 dimensions"), "{e}");
    // Newest file format (HDF5 2 with libver latest), no distance attribute: l2.
    let lat = fixture("latest.hdf5");
    let msg = search(&lat, &lat, 5, &p(dir.path(), "lat.npy"), &[]);
    assert!(
        msg.contains("9 queries × 120 base points (d=6), k=5, l2"),
        "{msg}"
    );
}

#[test]
fn csv_first_line_with_a_number_is_data_not_a_header() {
    let dir = tempfile::tempdir().unwrap();
    let b = p(dir.path(), "b.csv");
    // Today this line vanished as a "header" and every later id shifted by one.
    let e = graph_fails_on(&b, "1,NA\n2,3\n4,5\n", &[]);
    assert!(
        e.contains("b.csv: line 1, column 2: 'NA' is not a number"),
        "{e}"
    );
    // A header has no number in it: x,y is skipped, and ids count data rows from 0.
    std::fs::write(&b, "x,y\n0,0\n10,10\n1,1\n").unwrap();
    let q = p(dir.path(), "q.csv");
    std::fs::write(&q, "9,9\n").unwrap();
    let out = p(dir.path(), "nn.csv");
    search(&b, &q, 1, &out, &[]);
    assert_eq!(ids(&out).data, [1]);
}

#[test]
fn csv_header_and_no_header_flags() {
    let dir = tempfile::tempdir().unwrap();
    let b = p(dir.path(), "b.csv");
    let q = p(dir.path(), "q.csv");
    // Numeric column names: only --header skips them.
    std::fs::write(&b, "1,2\n0,0\n10,10\n").unwrap();
    std::fs::write(&q, "1,2\n9,9\n").unwrap();
    let out = p(dir.path(), "h.csv");
    let msg = search(&b, &q, 1, &out, &["--header"]);
    assert!(msg.contains("1 queries × 2 base points"), "{msg}");
    assert_eq!(ids(&out).data, [1]);
    let msg = search(&b, &q, 1, &p(dir.path(), "n.csv"), &[]);
    assert!(msg.contains("2 queries × 3 base points"), "{msg}");
    // --no-header: names on the first line are an error, not skipped.
    let e = graph_fails_on(&b, "x,y\n0,0\n", &["--no-header"]);
    assert!(e.contains("line 1, column 1: 'x' is not a number"), "{e}");
    let e = fails(&graph_args(&b, "1", &["--header", "--no-header"]), 2);
    assert!(e.contains("cannot be used with"), "{e}");
    // --help says what each flag does.
    let help = ok(&["search", "--help"]);
    for flag in ["--header", "--no-header", "--delimiter", "FILE.hdf5:NAME"] {
        assert!(help.contains(flag), "{flag}:\n{help}");
    }
}

#[test]
fn csv_delimiters_are_detected_or_given() {
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        [0.0, 0.5, 1.0],
        [4.0, 4.0, 4.0],
        [1.0, 1.0, 1.5],
        [9.0, 0.0, 2.0],
    ];
    let write = |name: &str, sep: &str| {
        let body: String = rows
            .iter()
            .map(|r| format!("{}\n", r.map(|v| format!("{v:e}")).join(sep)))
            .collect();
        std::fs::write(dir.path().join(name), body).unwrap();
        p(dir.path(), name)
    };
    let q = write("q.csv", ",");
    let reference = p(dir.path(), "ref.npy");
    search(&write("comma.csv", ","), &q, 2, &reference, &[]);
    for (name, sep) in [("tab.tsv.csv", "\t"), ("semi.csv", ";"), ("space.txt", " ")] {
        let out = p(dir.path(), &format!("{name}.npy"));
        search(&write(name, sep), &q, 2, &out, &[]);
        assert_eq!(ids(&out), ids(&reference), "{name}");
    }
    // --delimiter for any other character.
    let out = p(dir.path(), "pipe.npy");
    search(
        &write("pipe.csv", "|"),
        &write("qpipe.csv", "|"),
        2,
        &out,
        &["--delimiter", "|"],
    );
    assert_eq!(ids(&out), ids(&reference));
    // The wrong delimiter: the error says which one the field holds.
    let e = fails(
        &graph_args(&write("semi2.csv", ";"), "1", &["--delimiter", ","]),
        2,
    );
    assert!(
        e.contains("line 1, column 1") && e.contains("--delimiter ';'"),
        "{e}"
    );
    let e = fails(&graph_args(&q, "1", &["--delimiter", "xy"]), 2);
    assert!(e.contains("--delimiter: 'xy' is not a delimiter"), "{e}");
}

#[test]
fn csv_nan_is_named_by_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let b = p(dir.path(), "b.csv");
    // Before: "row 0, column 1" (data rows from 0) for a NaN, "line 1, column 2" for text.
    let e = graph_fails_on(&b, "x,y\n1,2\n\n3,nan\n", &[]);
    assert!(
        e.contains("b.csv: line 4, column 2: 'nan' is not a finite number"),
        "{e}"
    );
    let e = graph_fails_on(&b, "1 inf\n2 3\n", &[]);
    assert!(e.contains("b.csv: line 1, column 2: 'inf'"), "{e}");
}

/// Writes `t` (whole numbers 0..=255) as bvecs, which no writer of ours makes.
fn write_bvecs(path: &Path, t: &knn_io::Table<f32>) {
    let mut bytes = Vec::new();
    for i in 0..t.rows {
        bytes.extend_from_slice(&(t.cols as i32).to_le_bytes());
        bytes.extend(t.row(i).iter().map(|&v| v as u8));
    }
    std::fs::write(path, bytes).unwrap();
}

/// Writes `t` as text: an optional header line, values joined by `sep`.
fn write_text(path: &Path, t: &knn_io::Table<f32>, sep: &str, header: bool) {
    let mut s = String::new();
    if header {
        let names: Vec<String> = (0..t.cols).map(|j| format!("x{j}")).collect();
        s += &names.join(sep);
        s.push('\n');
    }
    for i in 0..t.rows {
        let cells: Vec<String> = t.row(i).iter().map(|v| v.to_string()).collect();
        s += &cells.join(sep);
        s.push('\n');
    }
    std::fs::write(path, s).unwrap();
}

#[test]
fn every_input_format_gives_byte_identical_ids() {
    let dir = tempfile::tempdir().unwrap();
    let ann = fixture("ann.hdf5");
    let reference = p(dir.path(), "hdf5.npy");
    search(&ann, &ann, 10, &reference, &[]);
    let want = std::fs::read(&reference).unwrap();
    let train = knn_io::read_f32(Path::new(&format!("{ann}:train")), None).unwrap();
    let test = knn_io::read_f32(Path::new(&format!("{ann}:test")), None).unwrap();
    let to_i64 = |t: &knn_io::Table<f32>| knn_io::Table {
        data: t.data.iter().map(|&v| v as i64).collect(),
        rows: t.rows,
        cols: t.cols,
    };
    let mut inputs: Vec<(String, PathBuf, PathBuf)> = Vec::new();
    let mut add = |label: &str, ext: &str, write: &dyn Fn(&Path, &knn_io::Table<f32>)| {
        let b = dir.path().join(format!("{label}-b.{ext}"));
        let q = dir.path().join(format!("{label}-q.{ext}"));
        write(&b, &train);
        write(&q, &test);
        inputs.push((label.to_owned(), b, q));
    };
    add("npy", "npy", &|p, t| knn_io::write_f32(p, None, t).unwrap());
    add("fvecs", "fvecs", &|p, t| {
        knn_io::write_f32(p, None, t).unwrap()
    });
    add("ivecs", "ivecs", &|p, t| {
        knn_io::write_i64(p, None, &to_i64(t)).unwrap()
    });
    add("bvecs", "bvecs", &write_bvecs);
    for (name, sep) in [
        ("comma", ","),
        ("tab", "\t"),
        ("semicolon", ";"),
        ("space", " "),
    ] {
        add(name, "csv", &|p, t| write_text(p, t, sep, false));
        add(&format!("{name}-header"), "csv", &|p, t| {
            write_text(p, t, sep, true)
        });
    }
    for (label, b, q) in &inputs {
        let out = p(dir.path(), &format!("{label}.npy"));
        search(
            &b.display().to_string(),
            &q.display().to_string(),
            10,
            &out,
            &["-m", "l2"],
        );
        assert!(
            std::fs::read(&out).unwrap() == want,
            "{label}: ids differ from HDF5's"
        );
    }
    assert_eq!(inputs.len(), 12);
}

#[test]
fn cosine_all_zero_rows_are_at_distance_one() {
    // scikit-learn's cosine_distances: an all-zero row is at distance 1 from every row.
    let dir = tempfile::tempdir().unwrap();
    let b = common::file(dir.path(), "b.csv", "0,0\n1,1\n2,0\n");
    let q = common::file(dir.path(), "q.csv", "0,0\n1,2\n");
    let out = p(dir.path(), "nn.csv");
    search(&b, &q, 3, &out, &["-m", "cosine"]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "0,1,2\n1,2,0\n");
    let dist = knn_io::read_f64(Path::new(&p(dir.path(), "nn.dist.csv")), None).unwrap();
    assert_eq!(dist.row(0), [1.0, 1.0, 1.0]);
    assert_eq!(dist.row(1)[2], 1.0);
    ok(&[
        "verify", "-r", &out, "-b", &b, "-q", &q, "-m", "cosine", "--quiet",
    ]);
    let g = p(dir.path(), "g.csv");
    ok(&graph_cpu(&b, "2", &["-m", "cosine", "-o", &g, "--quiet"]));
    assert!(std::fs::read_to_string(p(dir.path(), "g.dist.csv"))
        .unwrap()
        .starts_with("1.0,1.0\n"));
}

#[test]
fn verify_refuses_a_one_d_array_as_search_does() {
    let dir = tempfile::tempdir().unwrap();
    let one_d = dir.path().join("one.npy");
    // An npy file of shape (3,): preamble, header padded to 64 bytes, three float32 values.
    let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
    let header_len = (10 + dict.len() + 1).div_ceil(64) * 64 - 10;
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header_len as u16).to_le_bytes());
    bytes.extend_from_slice(format!("{dict:<w$}\n", w = header_len - 1).as_bytes());
    for v in [1.0f32, 2.0, 3.0] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(&one_d, bytes).unwrap();
    let one_d = one_d.display().to_string();
    let r = p(dir.path(), "r.csv");
    std::fs::write(&r, "1\n0\n1\n").unwrap();
    std::fs::write(p(dir.path(), "r.dist.csv"), "1\n1\n1\n").unwrap();
    let e = fails(&["verify", "-r", &r, "-b", &one_d], 2);
    assert!(
        e.contains("one.npy: Expected 2D array, got 1D array instead"),
        "{e}"
    );
}

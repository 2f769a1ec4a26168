//! float64 inputs are exact (issue 20): float64 `.npy`/HDF5 data and CSV text are searched for
//! the float64 values, distances are written in float64, and `knn verify` checks against the
//! float64 values, so an answer computed on their float32 rounding fails.

mod common;

use common::{fails, file, graph_cpu, knn_with, ok, p, search_cpu, text, verify_args};
use knn_io::Table;
use std::path::Path;

/// The issue's base: four 1-D points closer together than a float32 step (all round to 1.0).
const BASE: [f64; 4] = [1.0, 1.0 + 1e-9, 1.0 + 2e-9, 1.0 - 3e-9];
const QUERY: f64 = 1.0 + 2.1e-9;

/// Writes `values` (`cols` a row) as a float64 `.npy` file `dir/name`; returns its path.
fn f64_npy(dir: &Path, name: &str, values: &[f64], cols: usize) -> String {
    let f = p(dir, name);
    let t = Table {
        data: values.to_vec(),
        rows: values.len() / cols,
        cols,
    };
    knn_io::write_f64(Path::new(&f), None, &t).unwrap();
    f
}

fn ids(path: &str) -> Table<i64> {
    knn_io::read_i64(Path::new(path), None).unwrap()
}

/// The dtype an npy file's header names.
fn descr(path: &str) -> String {
    let bytes = std::fs::read(path).unwrap();
    let head = String::from_utf8_lossy(&bytes[..64.min(bytes.len())]).into_owned();
    let at = head.find("'descr': '").unwrap() + 10;
    head[at..at + 3].to_owned()
}

/// The nearest `k` of `q` among `base` (rows of `d`) by (f64 squared distance, id), and the
/// f64 L2 distances; `skip` leaves one id out (a graph).
fn brute(base: &[f64], d: usize, q: &[f64], k: usize, skip: Option<usize>) -> (Vec<i64>, Vec<f64>) {
    let mut all: Vec<(f64, usize)> = base
        .chunks(d)
        .enumerate()
        .filter(|(i, _)| Some(*i) != skip)
        .map(|(i, b)| (b.iter().zip(q).map(|(x, y)| (x - y) * (x - y)).sum(), i))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    all.truncate(k);
    (
        all.iter().map(|p| p.1 as i64).collect(),
        all.iter().map(|p| p.0.sqrt()).collect(),
    )
}

#[test]
fn the_issues_case_is_exact_and_verify_tells_a_rounded_answer() {
    let dir = tempfile::tempdir().unwrap();
    let b = f64_npy(dir.path(), "b.npy", &BASE, 1);
    let q = f64_npy(dir.path(), "q.npy", &[QUERY], 1);
    let out = p(dir.path(), "nn.npy");
    let msg = ok(&search_cpu(&b, &q, "4", &["-o", &out]));
    assert!(msg.contains("float64 values"), "{msg}");
    assert_eq!(ids(&out).data, [2, 1, 0, 3]);
    // Distances in float64: the distances of the float64 values.
    let dist = p(dir.path(), "nn.dist.npy");
    assert_eq!(descr(&dist), "<f8");
    let got = knn_io::read_f64(Path::new(&dist), None).unwrap().data;
    let want: Vec<f64> = [2, 1, 0, 3]
        .iter()
        .map(|&i| (QUERY - BASE[i]).abs())
        .collect();
    assert_eq!(got, want);
    let v = ok(&verify_args(&out, &b, &q, &[]));
    assert!(
        v.contains("float64 values") && v.contains("0 bad rows") && v.contains("PASSED"),
        "{v}"
    );

    // The answer of the float32 rounding (what knn gave before): ids 0 1 2 3, all at 0.
    let rounded = p(dir.path(), "rounded.npy");
    let r = knn_io::Table {
        data: vec![0i64, 1, 2, 3],
        rows: 1,
        cols: 4,
    };
    knn_io::write_i64(Path::new(&rounded), None, &r).unwrap();
    let zeros = knn_io::Table {
        data: vec![0.0f32; 4],
        rows: 1,
        cols: 4,
    };
    knn_io::write_f32(Path::new(&p(dir.path(), "rounded.dist.npy")), None, &zeros).unwrap();
    let v = fails(&verify_args(&rounded, &b, &q, &[]), 1);
    assert!(
        v.contains("FAILED") && v.contains("1 bad rows") && v.contains("id 0: reported 0"),
        "{v}"
    );
    // --float32 computes exactly that answer, which verify --float32 accepts (and plain verify
    // refuses).
    let f32_out = p(dir.path(), "f32.npy");
    ok(&search_cpu(&b, &q, "4", &["-o", &f32_out, "--float32"]));
    assert_eq!(ids(&f32_out).data, [0, 1, 2, 3]);
    assert_eq!(descr(&p(dir.path(), "f32.dist.npy")), "<f4");
    ok(&verify_args(&f32_out, &b, &q, &["--float32"]));
    fails(&verify_args(&f32_out, &b, &q, &[]), 1);
    // Our float64 answer, its distances rounded to float32, still passes (within tolerance).
    let narrowed = knn_io::Table {
        data: want.iter().map(|&d| d as f32).collect(),
        rows: 1,
        cols: 4,
    };
    let nd = p(dir.path(), "narrow.dist.npy");
    knn_io::write_f32(Path::new(&nd), None, &narrowed).unwrap();
    ok(&verify_args(&out, &b, &q, &["--result-distances", &nd]));
}

#[test]
fn csv_text_is_decimal_read_as_float64() {
    let dir = tempfile::tempdir().unwrap();
    let b = file(
        dir.path(),
        "b.csv",
        "x\n1\n1.000000001\n1.000000002\n0.999999997\n",
    );
    let q = file(dir.path(), "q.csv", "1.0000000021\n");
    let out = p(dir.path(), "nn.csv");
    ok(&search_cpu(&b, &q, "4", &["-o", &out]));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "2,1,0,3\n");
    // Up to 17 significant digits: the float64 distances read back exactly.
    let dist = p(dir.path(), "nn.dist.csv");
    let got = knn_io::read_f64(Path::new(&dist), None).unwrap().data;
    let base: Vec<f64> = ["1", "1.000000001", "1.000000002", "0.999999997"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let q64: f64 = "1.0000000021".parse().unwrap();
    let want: Vec<f64> = [2, 1, 0, 3]
        .iter()
        .map(|&i| (q64 - base[i]).abs())
        .collect();
    assert_eq!(got, want);
    ok(&verify_args(&out, &b, &q, &[]));
    // From standard input too, side by side on standard output.
    let args = search_cpu(&b, "-", "2", &["-o", "-", "--quiet"]);
    let o = knn_with(&args, &[], b"1.0000000021\n");
    assert!(o.status.success(), "{}", text(&o));
    let line = String::from_utf8(o.stdout).unwrap();
    assert_eq!(line, format!("2,1,{:?},{:?}\n", want[0], want[1]));
}

#[test]
fn a_graph_of_float64_points_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    // Points near 1000 with jitter far below a float32 step there (6e-5): their float32
    // rounding makes most of them equal.
    let d = 3;
    let mut s = 7u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let values: Vec<f64> = (0..300 * d)
        .map(|_| 1000.0 + (next() - 0.5) * 1e-7)
        .collect();
    let pts = f64_npy(dir.path(), "p.npy", &values, d);
    for method in ["auto", "brute"] {
        let out = p(dir.path(), &format!("g-{method}.npy"));
        let msg = ok(&graph_cpu(&pts, "5", &["--method", method, "-o", &out]));
        assert!(
            msg.contains("300 points (d=3)") && msg.contains("float64"),
            "{msg}"
        );
        let got = ids(&out);
        let dist = p(dir.path(), &format!("g-{method}.dist.npy"));
        assert_eq!(descr(&dist), "<f8");
        let dist = knn_io::read_f64(Path::new(&dist), None).unwrap();
        for i in 0..300 {
            let (want_ids, want_d) = brute(&values, d, &values[i * d..(i + 1) * d], 5, Some(i));
            assert_eq!(got.row(i), want_ids.as_slice(), "{method}: point {i}");
            for (g, w) in dist.row(i).iter().zip(&want_d) {
                assert!(
                    (g - w).abs() <= 1e-12 * w,
                    "{method}: point {i}: {g} vs {w}"
                );
            }
        }
        let v = ok(&["verify", "-r", &out, "-b", &pts]);
        assert!(v.contains("tie-aware recall 1.000000"), "{v}");
    }
    // The graph of the float32 rounding fails the check against the float64 values.
    let rounded = p(dir.path(), "g32.npy");
    ok(&graph_cpu(
        &pts,
        "5",
        &["-o", &rounded, "--float32", "--quiet"],
    ));
    let v = fails(&["verify", "-r", &rounded, "-b", &pts], 1);
    assert!(v.contains("FAILED"), "{v}");
    ok(&["verify", "-r", &rounded, "-b", &pts, "--float32", "--quiet"]);
}

#[test]
fn checkpointed_float64_runs_resume_to_the_same_result() {
    let dir = tempfile::tempdir().unwrap();
    let d = 4;
    let mut s = 3u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        1.0 + (s >> 11) as f64 / (1u64 << 53) as f64 * 1e-6
    };
    let base: Vec<f64> = (0..600 * d).map(|_| next()).collect();
    let queries: Vec<f64> = (0..9000 * d).map(|_| next()).collect();
    let b = f64_npy(dir.path(), "b.npy", &base, d);
    let q = f64_npy(dir.path(), "q.npy", &queries, d);
    let ck = p(dir.path(), "state.ckpt");
    let full = p(dir.path(), "full.npy");
    ok(&search_cpu(&b, &q, "6", &["-o", &full, "--quiet"]));
    let resumed = p(dir.path(), "resumed.npy");
    let with_ckpt = search_cpu(&b, &q, "6", &["-o", &resumed, "--checkpoint", &ck]);
    let stopped = [&with_ckpt[..], &["--checkpoint-stop-after", "1"]].concat();
    let o = common::knn(&stopped);
    assert_eq!(o.status.code(), Some(130), "{}", text(&o));
    // The same command in float32 is another run: its checkpoint is refused.
    let e = fails(&[&with_ckpt[..], &["--float32"]].concat(), 2);
    assert!(e.contains("other arguments"), "{e}");
    let log = ok(&with_ckpt);
    assert!(log.contains("resuming"), "{log}");
    assert_eq!(
        std::fs::read(&full).unwrap(),
        std::fs::read(&resumed).unwrap()
    );
    let dist = |f: &str| std::fs::read(f.replace(".npy", ".dist.npy")).unwrap();
    assert_eq!(dist(&full), dist(&resumed));
    assert_eq!(descr(&resumed.replace(".npy", ".dist.npy")), "<f8");
    assert!(!Path::new(&ck).exists());
    ok(&verify_args(&resumed, &b, &q, &["--quiet"]));
}

#[test]
fn float32_metrics_and_files_refuse_float64_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let b = f64_npy(dir.path(), "b.npy", &[0.5, 1.0, 2.0, 3.5, 1.5, 0.25], 2);
    for (name, args) in [
        ("maha.npy", ["-m", "mahalanobis"]),
        ("expr.npy", ["--metric-expr", "acc + abs(x - y)"]),
    ] {
        let x = p(dir.path(), name);
        let e = fails(&graph_cpu(&b, "1", &[&args[..], &["-o", &x]].concat()), 2);
        assert!(
            e.contains("takes float32 values")
                && e.contains("b.npy holds float64 values")
                && e.contains("give --float32"),
            "{e}"
        );
        assert!(!Path::new(&x).exists());
        let f32_run = [&args[..], &["-o", &x, "--float32", "--quiet"]].concat();
        ok(&graph_cpu(&b, "1", &f32_run));
        let verify = ["verify", "-r", &x, "-b", &b, args[0], args[1]];
        let e = fails(&verify, 2);
        assert!(e.contains("give --float32"), "{e}");
        ok(&[&verify[..], &["--float32"]].concat());
    }
    // fvecs cannot hold float64 distances: refused before any work, with the fix.
    let iv = p(dir.path(), "nn.ivecs");
    let e = fails(&graph_cpu(&b, "1", &["-o", &iv]), 2);
    assert!(
        e.contains("nn.fvecs: fvecs holds float32 values") && e.contains("--distances"),
        "{e}"
    );
    assert!(!Path::new(&iv).exists());
    let nd = p(dir.path(), "nn.dist.npy");
    ok(&graph_cpu(
        &b,
        "1",
        &["-o", &iv, "--distances", &nd, "--quiet"],
    ));
    ok(&graph_cpu(
        &b,
        "1",
        &["-o", &p(dir.path(), "r.ivecs"), "--float32", "--quiet"],
    ));
    // NaN in a float64 file is named by file, row and column.
    let nan = f64_npy(dir.path(), "nan.npy", &[0.5, 1.0, f64::NAN, 3.5], 2);
    let e = fails(&graph_cpu(&nan, "1", &[]), 2);
    assert!(e.contains("nan.npy: row 1, column 0 is NaN"), "{e}");
    let huge = f64_npy(dir.path(), "huge.npy", &[0.5, 1.0, 1e300, 3.5], 2);
    let e = fails(&graph_cpu(&huge, "1", &[]), 2);
    assert!(
        e.contains("huge.npy: row 1, column 0") && e.contains("float32 range"),
        "{e}"
    );
}

#[test]
fn float32_and_float64_inputs_together_and_hdf5() {
    let dir = tempfile::tempdir().unwrap();
    // float32 base, float64 query: searched for the float64 query, float64 distances.
    let b32 = p(dir.path(), "b.npy");
    let t = Table {
        data: vec![1.0f32, 2.0, 3.0],
        rows: 3,
        cols: 1,
    };
    knn_io::write_f32(Path::new(&b32), None, &t).unwrap();
    let q = f64_npy(dir.path(), "q.npy", &[2.5 + 1e-12], 1);
    let out = p(dir.path(), "nn.npy");
    ok(&search_cpu(&b32, &q, "3", &["-o", &out, "--quiet"]));
    assert_eq!(ids(&out).data, [2, 1, 0]);
    assert_eq!(descr(&p(dir.path(), "nn.dist.npy")), "<f8");
    ok(&verify_args(&out, &b32, &q, &["--quiet"]));
    // HDF5: a float64 train (angular.hdf5, cosine from its distance attribute) and float32 test.
    let ang = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../knn-io/tests/data/angular.hdf5")
        .display()
        .to_string();
    let out = p(dir.path(), "ang.npy");
    let msg = ok(&search_cpu(&ang, &ang, "5", &["-o", &out]));
    assert!(
        msg.contains("k=5, cosine, brute force on the CPU, float64 values"),
        "{msg}"
    );
    assert_eq!(descr(&p(dir.path(), "ang.dist.npy")), "<f8");
    let v = ok(&["verify", "-r", &out, "-b", &ang, "-q", &ang]);
    assert!(
        v.contains("float64 values") && v.contains("0 bad rows"),
        "{v}"
    );
}

//! Issue 24, the output and command-line side: writing never destroys what it should not,
//! standard input and output, names and contents that agree, 1-D arrays, labels as
//! scikit-learn has them, and messages in the user's words.

mod common;

use common::{
    bench_cpu, classify_args, fails, file, graph_args, graph_cpu, knn, knn_with, ok, p,
    search_args, search_cpu, text,
};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::Command;

/// An npy file of `descr` and `shape` holding `data` (raw element bytes).
fn npy(dir: &Path, name: &str, descr: &str, shape: &str, data: &[u8]) -> String {
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let mut header = dict.into_bytes();
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(&header);
    bytes.extend_from_slice(data);
    let f = p(dir, name);
    std::fs::write(&f, bytes).unwrap();
    f
}

/// The header dict and data of an npy file.
fn npy_parts(path: &str) -> (String, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    assert!(bytes.starts_with(b"\x93NUMPY"), "{path} is not an npy file");
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = String::from_utf8(bytes[10..10 + len].to_vec()).unwrap();
    (header, bytes[10 + len..].to_vec())
}

fn f64_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Base points (a 4 x 2 grid of 8 points) and 3 queries, as CSV.
fn points(dir: &Path) -> (String, String) {
    let b = file(dir, "b.csv", "0,0\n1,0\n2,0\n3,0\n0,5\n1,5\n2,5\n3,5\n");
    let q = file(dir, "q.csv", "0.1,0\n2.9,5\n1.4,0.2\n");
    (b, q)
}

fn is_symlink(path: &str) -> bool {
    std::fs::symlink_metadata(path)
        .unwrap()
        .file_type()
        .is_symlink()
}

#[test]
fn a_link_to_standard_output_is_written_through_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (b, q) = points(dir.path());
    let link = p(dir.path(), "out");
    std::os::unix::fs::symlink("/proc/self/fd/1", &link).unwrap();
    let o = knn(&search_cpu(&b, &q, "2", &["-o", &link, "--quiet"]));
    assert!(o.status.success(), "{}", text(&o));
    assert!(is_symlink(&link), "the link was replaced");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "0,1,0.1,0.9\n7,6,0.10000000000000009,0.8999999999999999\n1,2,0.44721359549995787,0.632455532033676\n"
    );
    // Nothing was left next to it (no out.dist.csv, no temporary file).
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["b.csv", "out", "q.csv"]);
}

#[test]
fn a_pipe_is_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let (b, q) = points(dir.path());
    let fifo = p(dir.path(), "fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let csv = ["--output-format", "csv", "--quiet"];
    ok(&search_cpu(
        &b,
        &q,
        "1",
        &[&["-o", &fifo][..], &csv].concat(),
    ));
    assert_eq!(
        reader.join().unwrap(),
        "0,0.1\n7,0.10000000000000009\n1,0.44721359549995787\n"
    );
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
}

#[test]
fn a_link_to_a_file_needs_force_and_stays_a_link() {
    let dir = tempfile::tempdir().unwrap();
    let (b, q) = points(dir.path());
    let real = file(dir.path(), "real.csv", "old\n");
    let link = p(dir.path(), "link.csv");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let d = p(dir.path(), "d.csv");
    let args = search_cpu(&b, &q, "1", &["-o", &link, "--distances", &d, "--quiet"]);
    let search = |extra: &[&str]| knn(&[&args[..], extra].concat());
    let refused = search(&[]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        text(&refused).contains("file exists (use --force"),
        "{}",
        text(&refused)
    );
    assert_eq!(std::fs::read_to_string(&real).unwrap(), "old\n");
    assert!(search(&["--force"]).status.success());
    assert!(is_symlink(&link));
    assert_eq!(std::fs::read_to_string(&real).unwrap(), "0\n7\n1\n");
}

#[test]
fn dash_is_standard_output_and_standard_input() {
    let dir = tempfile::tempdir().unwrap();
    let (b, q) = points(dir.path());
    let cpu = ["--device", "cpu", "--quiet"];
    let run = |args: &[&str], stdin: &[u8]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend_from_slice(&cpu);
        let o = knn_with(&all, &[], stdin);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        o.stdout
    };
    // CSV to standard output: ids, then distances, side by side.
    let side = run(&search_args(&b, &q, "2", &["-o", "-"]), b"");
    assert_eq!(
        String::from_utf8(side.clone()).unwrap(),
        "0,1,0.1,0.9\n7,6,0.10000000000000009,0.8999999999999999\n1,2,0.44721359549995787,0.632455532033676\n"
    );
    // npy to standard output: the bytes of the file.
    let ids = p(dir.path(), "nn.npy");
    run(&search_args(&b, &q, "2", &["-o", &ids]), b"");
    let npy_out = ["-o", "-", "--output-format", "npy"];
    let out = run(&search_args(&b, &q, "2", &npy_out), b"");
    assert_eq!(out, std::fs::read(&ids).unwrap());
    // Queries from standard input, CSV or npy: the same answer.
    let from_stdin = search_args(&b, "-", "2", &["-o", "-"]);
    let from_csv = run(&from_stdin, &std::fs::read(&q).unwrap());
    assert_eq!(from_csv, side);
    let qn = npy(
        dir.path(),
        "q.npy",
        "<f8",
        "(3, 2)",
        &f64_bytes(&[0.1, 0.0, 2.9, 5.0, 1.4, 0.2]),
    );
    let from_npy = run(&from_stdin, &std::fs::read(&qn).unwrap());
    assert_eq!(from_npy, side);
    // Base from standard input too (a graph reads its points there).
    let graph = run(
        &graph_args("-", "1", &["-o", "-"]),
        &std::fs::read(&b).unwrap(),
    );
    assert_eq!(String::from_utf8(graph).unwrap().lines().count(), 8);
    // Standard input holds one file.
    let twice = fails(&search_args("-", "-", "1", &["-o", "-"]), 2);
    assert!(
        twice.contains("only one input can be read from standard input"),
        "{twice}"
    );
}

#[test]
fn an_output_holds_what_its_name_says() {
    let dir = tempfile::tempdir().unwrap();
    let (b, q) = points(dir.path());
    let nn = p(dir.path(), "nn.npy");
    let e = fails(
        &search_args(&b, &q, "1", &["-o", &nn, "--output-format", "csv"]),
        2,
    );
    assert!(
        e.contains("the name says npy but --output-format says csv"),
        "{e}"
    );
    assert!(!Path::new(&nn).exists());
    // The seed CSV classified into an .npy name: the predicted classes as npy, not CSV text.
    let seed = file(
        dir.path(),
        "seed.csv",
        "4,2,2,1\n0,0\n1,0\n10,1\n11,1\n0.5,-1\n10.5,-1\n",
    );
    let classify = |out: &str| {
        ok(&[
            "classify", "--csv", &seed, "-k", "1", "--device", "cpu", "-o", out, "--quiet",
        ])
    };
    let out = p(dir.path(), "out.npy");
    classify(&out);
    let (header, data) = npy_parts(&out);
    assert!(
        header.contains("'<i8'") && header.contains("'shape': (2,)"),
        "{header}"
    );
    let labels: Vec<i64> = data
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(labels, [0, 1]);
    // A .csv name keeps the filled-in seed CSV; a format that cannot hold labels is refused
    // before any work.
    let filled = p(dir.path(), "filled.csv");
    classify(&filled);
    assert_eq!(
        std::fs::read_to_string(&filled).unwrap(),
        "4,2,2,1\n0,0\n1,0\n10,1\n11,1\n0.5,0\n10.5,1\n"
    );
    let fvecs = p(dir.path(), "out.fvecs");
    let e = fails(&["classify", "--csv", &seed, "-k", "1", "-o", &fvecs], 2);
    assert!(e.contains("format fvecs cannot hold"), "{e}");
}

#[test]
fn one_d_queries_are_refused_with_scikit_learns_hint() {
    let dir = tempfile::tempdir().unwrap();
    let (b, _) = points(dir.path());
    let q = npy(dir.path(), "q1.npy", "<f8", "(2,)", &f64_bytes(&[0.5, 1.0]));
    let e = fails(&search_args(&b, &q, "1", &["-o", "-"]), 2);
    assert!(
        e.contains(
            "q1.npy: Expected 2D array, got 1D array instead. Reshape your data either using \
             array.reshape(-1, 1) if your data has a single feature or array.reshape(1, -1) if \
             it contains a single sample."
        ),
        "{e}"
    );
    assert!(!e.contains("d=1"), "{e}");
    let train = file(dir.path(), "t.csv", "0,0\n1,1\n");
    let labels = file(dir.path(), "l.csv", "0\n1\n");
    let e = fails(
        &classify_args(&train, &labels, &q, &["-k", "1", "-o", "-"]),
        2,
    );
    assert!(e.contains("got 1D array instead"), "{e}");
}

#[test]
fn labels_come_back_as_scikit_learn_gives_them() {
    let dir = tempfile::tempdir().unwrap();
    let train = file(dir.path(), "train.csv", "0,0\n0,1\n5,5\n5,6\n9,9\n");
    let q = file(dir.path(), "q.csv", "0,0.4\n5,5.4\n9,8.8\n");
    let classify = |labels: &str, out: &str, extra: &[&str]| {
        let cpu = ["-k", "1", "--device", "cpu", "-o", out, "--quiet"];
        ok(&classify_args(
            &train,
            labels,
            &q,
            &[&cpu[..], extra].concat(),
        ))
    };
    // Integers: a 1-D int64 array (n,), not (n, 1).
    let ints = file(dir.path(), "ints.csv", "7\n7\n3\n3\n-1\n");
    let out = p(dir.path(), "ints.npy");
    classify(&ints, &out, &[]);
    let (header, data) = npy_parts(&out);
    assert!(
        header.contains("'<i8'") && header.contains("(3,)"),
        "{header}"
    );
    assert_eq!(data.len(), 24);
    // Text (CSV with a header line): text out, classes in numpy.unique order, the probability
    // columns named by a header.
    let text_labels = file(
        dir.path(),
        "species.csv",
        "species\nsetosa\nsetosa\nvirginica\nvirginica\n\"big,one\"\n",
    );
    let out = p(dir.path(), "species.npy");
    let proba = p(dir.path(), "proba.csv");
    classify(&text_labels, &out, &["--proba", &proba]);
    let (header, data) = npy_parts(&out);
    assert!(
        header.contains("'<U9'") && header.contains("(3,)"),
        "{header}"
    );
    let chars: String = data
        .chunks_exact(4)
        .map(|c| char::from_u32(u32::from_le_bytes(c.try_into().unwrap())).unwrap())
        .map(|c| if c == '\0' { '.' } else { c })
        .collect();
    assert_eq!(chars, "setosa...virginicabig,one..");
    assert_eq!(
        std::fs::read_to_string(&proba).unwrap(),
        "\"big,one\",setosa,virginica\n0.0,1.0,0.0\n0.0,0.0,1.0\n1.0,0.0,0.0\n"
    );
    let csv_out = p(dir.path(), "species_out.csv");
    classify(&text_labels, &csv_out, &[]);
    assert_eq!(
        std::fs::read_to_string(&csv_out).unwrap(),
        "setosa\nvirginica\n\"big,one\"\n"
    );
    // NumPy unicode labels in, npy probabilities with the classes beside them.
    let mut units = Vec::new();
    for s in ["b", "b", "a", "a", "c"] {
        units.extend_from_slice(&(s.chars().next().unwrap() as u32).to_le_bytes());
    }
    let uni = npy(dir.path(), "uni.npy", "<U1", "(5,)", &units);
    let out = p(dir.path(), "uni_out.csv");
    let proba = p(dir.path(), "p.npy");
    classify(&uni, &out, &["--proba", &proba]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "b\na\nc\n");
    let (header, _) = npy_parts(&p(dir.path(), "p.classes.npy"));
    assert!(
        header.contains("'<U1'") && header.contains("(3,)"),
        "{header}"
    );
    let (_, classes) = npy_parts(&p(dir.path(), "p.classes.npy"));
    assert_eq!(classes, [b'a', 0, 0, 0, b'b', 0, 0, 0, b'c', 0, 0, 0]);
    let (header, _) = npy_parts(&proba);
    assert!(header.contains("(3, 3)"), "{header}");
    // Integer-valued floats stay floats.
    let floats = npy(
        dir.path(),
        "f.npy",
        "<f8",
        "(5,)",
        &f64_bytes(&[1.0, 1.0, 2.0, 2.0, 3.0]),
    );
    let out = p(dir.path(), "f_out.csv");
    classify(&floats, &out, &[]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "1.0\n2.0\n3.0\n");
    let out = p(dir.path(), "f_out.npy");
    classify(&floats, &out, &[]);
    let (header, data) = npy_parts(&out);
    assert!(
        header.contains("'<f8'") && header.contains("(3,)"),
        "{header}"
    );
    assert_eq!(data, f64_bytes(&[1.0, 2.0, 3.0]));
}

#[test]
fn no_arguments_prints_the_help() {
    let o = knn(&[]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("Usage: knn") && out.contains("search"),
        "{out}"
    );
    assert!(!text(&o).contains("knn bench:"), "it ran the bench");
}

#[test]
fn help_and_summaries_speak_the_users_language() {
    let dir = tempfile::tempdir().unwrap();
    let (b, q) = points(dir.path());
    let help = ok(&["search", "--help"]);
    assert!(
        help.contains("grid (sorts the base points into cells")
            && help.contains("brute (compares every query with every base point"),
        "{help}"
    );
    let s = ok(&search_cpu(&b, &q, "1", &["--method", "brute"]));
    assert!(s.contains("l2, brute force on the CPU"), "{s}");
    assert!(!s.contains("on cpu"), "{s}");
    let big = p(dir.path(), "big.npy");
    ok(&["generate", "-n", "3000", "-d", "2", "-o", &big, "--quiet"]);
    let g = ok(&graph_cpu(&big, "1", &[]));
    assert!(
        g.contains("l2, exact grid on the CPU") && g.contains("points/s"),
        "{g}"
    );
    assert!(!g.contains("queries/s") && !g.contains("on grid"), "{g}");
    // The bench table: columns explained under it; the seed's V100 times only next to the
    // same programs at the same sizes (never on a CPU row, never at other sizes).
    let bench = bench_cpu("20", "4");
    assert!(!bench.contains("V100"), "{bench}");
    assert!(
        bench.contains("median ms: of 1 timed runs after a warm-up; GFLOP/s:"),
        "{bench}"
    );
    assert!(bench.contains("brute force, CPU"), "{bench}");
}

#[test]
fn messages_say_what_and_where_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let (b, q) = points(dir.path());
    let search = |out: &str, extra: &[&str]| {
        fails(
            &search_args(&b, &q, "1", &[&["-o", out], extra].concat()),
            2,
        )
    };
    let e = search(&p(dir.path(), ""), &[]);
    assert!(e.contains("is a folder; name a file in it"), "{e}");
    let missing = dir.path().join("no/such");
    let e = search(&p(&missing, "nn.npy"), &[]);
    assert!(
        e.contains(&format!("the folder {} does not exist", missing.display())),
        "{e}"
    );
    let e = search(&p(dir.path(), "nn.out"), &[]);
    assert!(e.contains("--output-format"), "{e}");
    let odd = file(dir.path(), "q.dat", "1,2\n");
    let e = fails(&search_args(&b, &odd, "1", &["-o", "-"]), 2);
    assert!(e.contains("--input-format"), "{e}");
    let e = search("-", &["-m", "euclidian"]);
    assert!(
        e.contains("unknown metric 'euclidian'")
            && e.contains("l2 (euclidean)")
            && e.contains("--metric-expr"),
        "{e}"
    );
    let e = search("-", &["--metric-expr", "acc + (x - y)**2"]);
    assert!(e.contains("write powers with ^"), "{e}");
    assert!(e.starts_with("error: metric expression: column 15:"), "{e}");
    let e = search("-", &["--metric-expr", "acc + sqrt(x - y)", "--float32"]);
    assert!(e.starts_with("error: metric expression: column 7:"), "{e}");
    let negative = file(dir.path(), "neg.csv", "1,2\n3,-4\n");
    let e = fails(
        &search_args(&negative, &q, "1", &["-m", "hellinger", "-o", "-"]),
        2,
    );
    assert!(e.contains("neg.csv: row 1, column 1 is -4"), "{e}");
}

#[test]
fn the_readme_installs_the_binary_before_it_uses_it() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let install = readme
        .find("cargo install --path crates/knn-cli")
        .expect("the README says how to install knn");
    let first_use = readme
        .lines()
        .scan(0, |at, line| {
            let start = *at;
            *at += line.len() + 1;
            Some((start, line))
        })
        .find(|(_, line)| line.trim_start().starts_with("knn "))
        .map(|(at, _)| at)
        .expect("the README uses knn");
    assert!(install < first_use, "knn is used before it is installed");
}

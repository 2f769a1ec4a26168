//! Running the `knn` binary from the tests: its output and exit code, its usual argument
//! lists, and the small files the tests give it.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The `knn` binary: where cargo built it, or, where the tests were copied to another machine
/// without that tree (the GPU machine's `.gpu/tests/`), `knn` in the folder above theirs.
pub fn knn_binary() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_knn"));
    if built.exists() {
        return built;
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let beside = exe.parent().and_then(Path::parent).map(|d| d.join("knn"));
    beside
        .filter(|p| p.exists())
        .unwrap_or_else(|| panic!("no knn binary at {} or beside the tests", built.display()))
}

/// Runs `knn` with `args`, the environment variables `env` set and `stdin` on its standard
/// input.
pub fn knn_with(args: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> Output {
    let mut child = Command::new(knn_binary())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run knn");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).expect("write stdin");
    drop(input);
    child.wait_with_output().expect("wait for knn")
}

/// Runs `knn` with `args` and an empty standard input.
pub fn knn(args: &[&str]) -> Output {
    knn_with(args, &[], b"")
}

/// Runs `knn` with `args` and the environment variable `var` set.
pub fn knn_env(args: &[&str], var: (&str, &str)) -> Output {
    knn_with(args, &[var], b"")
}

/// Standard output, then standard error.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs a command that must succeed; returns its messages.
pub fn ok(args: &[&str]) -> String {
    let o = knn(args);
    assert!(o.status.success(), "knn {args:?} failed:\n{}", text(&o));
    text(&o)
}

/// Runs a command that must fail with exit code `code`; returns its messages.
pub fn fails(args: &[&str], code: i32) -> String {
    let o = knn(args);
    assert_eq!(o.status.code(), Some(code), "knn {args:?}:\n{}", text(&o));
    text(&o)
}

/// `dir/name` as a string.
pub fn p(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// Writes `text` into `dir/name`; returns the path.
pub fn file(dir: &Path, name: &str, text: &str) -> String {
    let f = p(dir, name);
    std::fs::write(&f, text).unwrap();
    f
}

/// `knn generate`s `rows` uniform points of dimension `dim` into `dir/name`; returns the path.
pub fn generate(dir: &Path, name: &str, rows: usize, dim: usize, seed: u64) -> String {
    let f = p(dir, name);
    let (rows, dim, seed) = (rows.to_string(), dim.to_string(), seed.to_string());
    ok(&[
        "generate", "-n", &rows, "-d", &dim, "--seed", &seed, "-o", &f, "--quiet",
    ]);
    f
}

// The argument lists below name their files by the flags they follow: `-b`, `-q`, `-r`.

/// The arguments of `knn search` of the queries `q` against the base points `b` for `k`
/// neighbours, then `extra`.
pub fn search_args<'a>(b: &'a str, q: &'a str, k: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    [&["search", "-b", b, "-q", q, "-k", k], extra].concat()
}

/// [`search_args`] on the CPU.
pub fn search_cpu<'a>(b: &'a str, q: &'a str, k: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    search_args(b, q, k, &[&["--device", "cpu"], extra].concat())
}

/// The arguments of `knn graph` of `points` with `k` neighbours, then `extra`.
pub fn graph_args<'a>(points: &'a str, k: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    [&["graph", "-p", points, "-k", k], extra].concat()
}

/// [`graph_args`] on the CPU.
pub fn graph_cpu<'a>(points: &'a str, k: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    graph_args(points, k, &[&["--device", "cpu"], extra].concat())
}

/// The arguments of `knn verify` of the result `r` against the exact answer for the base
/// points `b` and queries `q`, then `extra`.
pub fn verify_args<'a>(r: &'a str, b: &'a str, q: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    [&["verify", "-r", r, "-b", b, "-q", q], extra].concat()
}

/// The arguments of `knn classify` of the queries `q` by the points `train` and their
/// `labels`, then `extra`.
pub fn classify_args<'a>(
    train: &'a str,
    labels: &'a str,
    q: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    [
        &["classify", "--train", train, "--labels", labels, "-q", q],
        extra,
    ]
    .concat()
}

/// Runs `knn bench` on the CPU, small: 300 base points of dimension 8, `queries` queries, `k`
/// neighbours, one timed run; returns its messages.
pub fn bench_cpu(queries: &str, k: &str) -> String {
    ok(&[
        "bench",
        "--refs",
        "300",
        "--queries",
        queries,
        "-d",
        "8",
        "-k",
        k,
        "--repeat",
        "1",
        "--devices",
        "cpu",
    ])
}

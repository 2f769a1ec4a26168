//! The `knn` binary end to end on small files.

mod common;

use common::{
    bench_cpu, classify_args, fails, generate, graph_args, graph_cpu, knn_env, ok, p, search_args,
    search_cpu, verify_args,
};
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn search_then_verify_npy() {
    let dir = tempfile::tempdir().unwrap();
    let b = generate(dir.path(), "b.npy", 500, 16, 1);
    let q = generate(dir.path(), "q.npy", 40, 16, 2);
    let out = p(dir.path(), "nn.npy");
    let search = search_cpu(&b, &q, "7", &["-o", &out]);
    let msg = ok(&search);
    assert!(msg.contains("40 queries × 500 base"), "{msg}");
    assert!(PathBuf::from(p(dir.path(), "nn.dist.npy")).exists());
    let v = ok(&verify_args(&out, &b, &q, &[]));
    assert!(
        v.contains("tie-aware recall 1.000000") && v.contains("PASSED"),
        "{v}"
    );
    // Refuses to overwrite without --force, then replaces with it.
    let again = fails(&search, 2);
    assert!(again.contains("exists"), "{again}");
    ok(&[&search[..], &["--force", "--quiet"]].concat());
    // Never over an input, even with --force.
    let input = fails(
        &["search", "-b", &b, "-q", &q, "-k", "7", "-o", &b, "--force"],
        2,
    );
    assert!(input.contains("input"), "{input}");
}

#[test]
fn verify_catches_a_wrong_result() {
    let dir = tempfile::tempdir().unwrap();
    let b = generate(dir.path(), "b.fvecs", 300, 8, 3);
    let q = generate(dir.path(), "q.fvecs", 20, 8, 4);
    let out = p(dir.path(), "nn.ivecs");
    ok(&search_cpu(&b, &q, "5", &["-o", &out, "--quiet"]));
    assert!(PathBuf::from(p(dir.path(), "nn.fvecs")).exists());
    ok(&["verify", "-r", &out, "--truth", &out]);
    // Swap one id for a far point: both checks must fail.
    let mut bytes = std::fs::read(&out).unwrap();
    bytes[4..8].copy_from_slice(&299i32.to_le_bytes());
    bytes[8..12].copy_from_slice(&298i32.to_le_bytes());
    std::fs::write(&out, bytes).unwrap();
    let v = fails(&verify_args(&out, &b, &q, &[]), 1);
    assert!(v.contains("FAILED"), "{v}");
}

#[test]
fn graph_csv_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let pts = generate(dir.path(), "p.csv", 120, 5, 5);
    for m in [
        "l2",
        "sqeuclidean",
        "ip",
        "cosine",
        "l1",
        "linf",
        "hellinger",
        "mahalanobis",
    ] {
        let out = p(dir.path(), &format!("g_{m}.csv"));
        // CSV text is float64 input; mahalanobis takes float32 values: --float32 says to
        // compute on their rounding (refused without it, see tests/float64.rs).
        let f32_only: &[&str] = if m == "mahalanobis" {
            &["--float32"]
        } else {
            &[]
        };
        let args = [&["-m", m, "-o", &out, "--quiet"], f32_only].concat();
        ok(&graph_cpu(&pts, "4", &args));
        ok(&[
            &["verify", "-r", &out, "-b", &pts, "-m", m, "--quiet"],
            f32_only,
        ]
        .concat());
    }
    let text = std::fs::read_to_string(p(dir.path(), "g_l2.csv")).unwrap();
    assert_eq!(text.lines().count(), 120);
}

#[test]
fn graph_symmetric_on_off_auto_agree() {
    let dir = tempfile::tempdir().unwrap();
    let pts = generate(dir.path(), "p.npy", 700, 20, 9);
    let mut outputs = Vec::new();
    for mode in ["off", "on", "auto"] {
        for m in ["l2", "l1"] {
            let out = p(dir.path(), &format!("g_{mode}_{m}.npy"));
            ok(&graph_cpu(
                &pts,
                "7",
                &["-m", m, "--symmetric", mode, "-o", &out, "--quiet"],
            ));
            outputs.push((m, std::fs::read(&out).unwrap()));
        }
    }
    for (m, bytes) in &outputs[2..] {
        let same_metric = outputs.iter().find(|(x, _)| x == m).unwrap();
        assert!(bytes == &same_metric.1, "{m}: symmetric modes differ");
    }
    let x = p(dir.path(), "x.npy");
    let e = fails(
        &graph_args(&pts, "3", &["--symmetric", "sometimes", "-o", &x]),
        2,
    );
    assert!(
        e.contains("--symmetric") && e.contains("auto, on, off"),
        "{e}"
    );
}

#[test]
fn bad_input_errors_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let nan = p(dir.path(), "nan.csv");
    std::fs::write(&nan, "1,2,3\n4,nan,6\n").unwrap();
    let good = p(dir.path(), "good.csv");
    std::fs::write(&good, "1,2,3\n4,5,6\n").unwrap();
    let e = fails(&search_cpu(&good, &nan, "1", &[]), 2);
    assert!(
        e.contains("nan.csv") && e.contains("line 2, column 2"),
        "{e}"
    );
    let e = fails(&search_cpu(&good, &good, "3", &[]), 2);
    assert!(e.contains("k=3") && e.contains('2'), "{e}");
    let two = p(dir.path(), "two.csv");
    std::fs::write(&two, "1,2\n").unwrap();
    let e = fails(&search_cpu(&good, &two, "1", &[]), 2);
    assert!(e.contains("dimension mismatch"), "{e}");
    let ragged = p(dir.path(), "ragged.csv");
    std::fs::write(&ragged, "1,2,3\n4,5\n").unwrap();
    let e = fails(&graph_args(&ragged, "1", &[]), 2);
    assert!(e.contains("ragged.csv") && e.contains("line 2"), "{e}");
    let e = fails(&search_args(&good, &good, "1", &["-m", "nope"]), 2);
    assert!(e.contains("unknown metric"), "{e}");
    let e = fails(&search_args(&good, &good, "1", &["--device", "cuda:7"]), 2);
    assert!(
        e.to_lowercase().contains("cuda") || e.contains("device"),
        "{e}"
    );
}

#[test]
fn bench_small_and_info() {
    let t = bench_cpu("50", "5");
    assert!(
        t.contains("brute force, CPU") && t.contains("PASSED") && !t.contains("FAILED"),
        "{t}"
    );
    let i = ok(&["info"]);
    assert!(i.contains("knn ") && i.contains("threads"), "{i}");
}

#[test]
fn repeat_and_timing_json() {
    let dir = tempfile::tempdir().unwrap();
    let b = generate(dir.path(), "b.npy", 200, 4, 9);
    let t = p(dir.path(), "t.json");
    ok(&search_cpu(
        &b,
        &b,
        "3",
        &["--repeat", "3", "--timing-json", &t, "--quiet"],
    ));
    let j = std::fs::read_to_string(&t).unwrap();
    assert!(
        j.contains("median_ms") && j.matches(',').count() >= 3,
        "{j}"
    );
}

#[test]
fn grid_and_brute_agree_in_low_dimensions() {
    let dir = tempfile::tempdir().unwrap();
    let b = generate(dir.path(), "b.npy", 3000, 3, 5);
    let q = generate(dir.path(), "q.npy", 200, 3, 6);
    let auto_npy = p(dir.path(), "auto.npy");
    let brute_csv = p(dir.path(), "brute.csv");
    let grid_csv = p(dir.path(), "grid.csv");
    let auto = ok(&search_cpu(&b, &q, "7", &["-o", &auto_npy]));
    assert!(
        auto.contains("exact grid on the CPU"),
        "auto picks the grid for d=3:\n{auto}"
    );
    let brute = ok(&search_cpu(
        &b,
        &q,
        "7",
        &["--method", "brute", "-o", &brute_csv],
    ));
    assert!(brute.contains("brute force on the CPU"), "{brute}");
    // Same ids (exact, ties by id), both formats.
    let grid_ids = std::fs::read(&auto_npy).unwrap();
    ok(&search_args(
        &b,
        &q,
        "7",
        &["--method", "grid", "-o", &grid_csv, "--quiet"],
    ));
    assert_eq!(
        std::fs::read_to_string(&grid_csv).unwrap(),
        std::fs::read_to_string(&brute_csv).unwrap()
    );
    assert!(!grid_ids.is_empty());
    ok(&verify_args(&auto_npy, &b, &q, &[]));
    let e = fails(
        &search_args(&b, &q, "3", &["-m", "ip", "--method", "grid"]),
        2,
    );
    assert!(e.contains("grid") && e.contains("brute"), "{e}");
    let e = fails(&search_args(&b, &q, "3", &["--method", "warp"]), 2);
    assert!(e.contains("unknown method"), "{e}");
    let e = fails(&search_args(&b, &q, "3", &["--gpu-memory", "2 parsecs"]), 2);
    assert!(e.contains("size"), "{e}");
    let e = fails(&search_cpu(&b, &q, "3", &["--method", "cublas"]), 2);
    assert!(e.contains("GPU"), "{e}");
}

#[test]
fn classify_seed_csv_batch_and_sequential() {
    let dir = tempfile::tempdir().unwrap();
    let csv = p(dir.path(), "seed.csv");
    ok(&[
        "generate",
        "-n",
        "600",
        "-d",
        "5",
        "--classes",
        "4",
        "--new-share",
        "0.25",
        "--seed",
        "9",
        "-o",
        &csv,
        "--quiet",
    ]);
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.starts_with("450,150,4,5\n"), "{}", &text[..40]);
    assert_eq!(text.lines().filter(|l| l.ends_with(",-1")).count(), 150);
    for mode in ["batch", "sequential"] {
        let out = p(dir.path(), &format!("{mode}.csv"));
        let log = ok(&[
            "classify", "--csv", &csv, "-k", "5", "--mode", mode, "-o", &out,
        ]);
        assert!(log.contains(mode), "{log}");
        let filled = std::fs::read_to_string(&out).unwrap();
        assert_eq!(filled.lines().count(), text.lines().count());
        assert!(
            !filled.lines().any(|l| l.ends_with(",-1")),
            "every -1 replaced"
        );
        // Labelled rows are unchanged, byte for byte.
        for (a, b) in text.lines().zip(filled.lines()) {
            if !a.ends_with(",-1") {
                assert_eq!(a, b);
            } else {
                let class: i64 = b.rsplit(',').next().unwrap().parse().unwrap();
                assert!((0..4).contains(&class), "{b}");
            }
        }
    }
    // Separate files, probabilities; an existing output is not replaced.
    let train = generate(dir.path(), "train.npy", 300, 3, 1);
    let queries = generate(dir.path(), "new.npy", 50, 3, 2);
    let labels = p(dir.path(), "labels.csv");
    std::fs::write(
        &labels,
        (0..300).map(|i| format!("{}\n", i % 3)).collect::<String>(),
    )
    .unwrap();
    let out = p(dir.path(), "pred.csv");
    let proba = p(dir.path(), "proba.csv");
    ok(&classify_args(
        &train,
        &labels,
        &queries,
        &[
            "-k",
            "3",
            "--weights",
            "distance",
            "-o",
            &out,
            "--proba",
            &proba,
            "--quiet",
        ],
    ));
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 50);
    // A header naming the classes, then one row per point.
    let proba_text = std::fs::read_to_string(&proba).unwrap();
    assert_eq!(proba_text.lines().count(), 51);
    assert!(proba_text.starts_with("0,1,2"), "{proba_text}");
    let e = fails(&classify_args(&train, &labels, &queries, &["-o", &out]), 2);
    assert!(e.contains("exists"), "{e}");
    // Bad seed CSV: the error names the line.
    let bad = p(dir.path(), "bad.csv");
    std::fs::write(&bad, "2,1,2,2\n0.5,0\n1,1,1\n0,0,-1\n").unwrap();
    let e = fails(&["classify", "--csv", &bad, "-k", "1"], 2);
    assert!(e.contains("line 2"), "{e}");
}

fn as_refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn checkpoint_resume_equals_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let pts = generate(dir.path(), "p.npy", 20000, 6, 3);
    let q = generate(dir.path(), "q.npy", 9000, 6, 4);
    let ck = p(dir.path(), "state.ckpt");
    for (cmd, extra) in [
        ("graph", vec!["-p", pts.as_str()]),
        ("search", vec!["-b", pts.as_str(), "-q", q.as_str()]),
    ] {
        let full = p(dir.path(), &format!("{cmd}-full.npy"));
        let resumed = p(dir.path(), &format!("{cmd}-resumed.npy"));
        let mut base_args = vec![cmd, "-k", "7", "--device", "cpu"];
        base_args.extend(extra.iter().copied());
        let with = |out: &str, ckpt: bool| {
            let mut v = base_args.clone();
            v.extend(["-o", out]);
            if ckpt {
                v.extend(["--checkpoint", ck.as_str()]);
            }
            v.into_iter().map(String::from).collect::<Vec<String>>()
        };
        ok(&as_refs(&with(&full, false)));
        // "Interrupted" after two chunks (the hidden test hook): exit 130, rows saved, no
        // output yet.
        let mut stopped = with(&resumed, true);
        stopped.extend(["--checkpoint-stop-after".to_string(), "2".to_string()]);
        let o = common::knn(&as_refs(&stopped));
        assert_eq!(
            o.status.code(),
            Some(130),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!Path::new(&resumed).exists());
        // A kill in the middle of a record: the torn record is dropped on resume.
        let len = std::fs::metadata(&ck).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&ck).unwrap();
        f.set_len(len - 1000).unwrap();
        drop(f);
        // Other arguments are refused, the checkpoint kept.
        let mut other = with(&resumed, true);
        other[2] = "8".into();
        let e = fails(&as_refs(&other), 2);
        assert!(e.contains("other arguments"), "{e}");
        let log = ok(&as_refs(&with(&resumed, true)));
        assert!(log.contains("resuming"), "{log}");
        assert_eq!(
            std::fs::read(&full).unwrap(),
            std::fs::read(&resumed).unwrap(),
            "{cmd} ids"
        );
        let dist = |s: &str| s.replace(".npy", ".dist.npy");
        assert_eq!(
            std::fs::read(dist(&full)).unwrap(),
            std::fs::read(dist(&resumed)).unwrap()
        );
        assert!(
            !Path::new(&ck).exists(),
            "the checkpoint is removed when done"
        );
    }
    // A file that is not a checkpoint is never overwritten.
    std::fs::write(&ck, b"precious data").unwrap();
    let e = fails(&graph_args(&pts, "3", &["--checkpoint", &ck]), 2);
    assert!(e.contains("not a knn checkpoint"), "{e}");
    assert_eq!(std::fs::read(&ck).unwrap(), b"precious data");
    let e = fails(&graph_args(&pts, "3", &["--checkpoint", &pts]), 2);
    assert!(e.contains("input"), "{e}");
}

#[cfg(unix)]
#[test]
fn ctrl_c_stops_with_the_checkpoint_saved() {
    let dir = tempfile::tempdir().unwrap();
    let pts = generate(dir.path(), "p.npy", 60000, 12, 5);
    let ck = p(dir.path(), "c.ckpt");
    let out = p(dir.path(), "g.npy");
    let args = graph_cpu(
        &pts,
        "5",
        &["--threads", "1", "-o", &out, "--checkpoint", &ck],
    );
    let mut child = Command::new(common::knn_binary())
        .args(&args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the first saved chunk, then send SIGINT.
    let t = std::time::Instant::now();
    while std::fs::metadata(&ck).map_or(0, |m| m.len()) <= 32 && t.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    // Either stopped cleanly (130) or it had already finished (0).
    assert!(matches!(status.code(), Some(130) | Some(0)), "{status:?}");
    if status.code() == Some(130) {
        ok(&args);
    }
    let full = p(dir.path(), "full.npy");
    ok(&graph_cpu(&pts, "5", &["-o", &full]));
    assert_eq!(std::fs::read(&full).unwrap(), std::fs::read(&out).unwrap());
}

#[test]
fn metric_expr_spells_the_built_in_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let b = generate(dir.path(), "b.npy", 600, 12, 11);
    let q = generate(dir.path(), "q.npy", 50, 12, 12);
    // The Hellinger expression: the same keys in f64, so the very same files.
    let (gh, ge) = (p(dir.path(), "gh.csv"), p(dir.path(), "ge.csv"));
    ok(&graph_cpu(
        &b,
        "6",
        &["-m", "hellinger", "-o", &gh, "--quiet"],
    ));
    let expr = "acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)";
    let msg = ok(&graph_cpu(&b, "6", &["--metric-expr", expr, "-o", &ge]));
    assert!(msg.contains("expr 'acc + (sqrt(x)"), "{msg}");
    assert_eq!(
        std::fs::read_to_string(&gh).unwrap(),
        std::fs::read_to_string(&ge).unwrap()
    );
    let dist = |f: &str| std::fs::read_to_string(f.replace(".csv", ".dist.csv")).unwrap();
    assert_eq!(dist(&gh), dist(&ge));
    // L1: verified under the built-in metric and under the expression itself.
    let l1 = "acc + abs(x - y)";
    let out = p(dir.path(), "l1.npy");
    ok(&search_cpu(
        &b,
        &q,
        "9",
        &["--metric-expr", l1, "-o", &out, "--quiet"],
    ));
    ok(&verify_args(&out, &b, &q, &["-m", "l1", "--quiet"]));
    let v = ok(&verify_args(&out, &b, &q, &["--metric-expr", l1]));
    assert!(v.contains("tie-aware recall 1.000000"), "{v}");
    // A user metric of its own.
    let own_expr = "acc + abs(x - y) / (x + y + 0.01) ; sqrt(acc)";
    let own = p(dir.path(), "own.npy");
    ok(&search_cpu(
        &b,
        &q,
        "3",
        &["--metric-expr", own_expr, "-o", &own, "--quiet"],
    ));
    ok(&verify_args(
        &own,
        &b,
        &q,
        &["--metric-expr", own_expr, "--quiet"],
    ));
}

#[test]
fn metric_expr_errors_point_at_the_column() {
    let dir = tempfile::tempdir().unwrap();
    let b = generate(dir.path(), "b.npy", 100, 4, 21);
    let run = |expr: &str| fails(&graph_cpu(&b, "3", &["--metric-expr", expr]), 2);
    let e = run("acc + sqr(x - y)");
    assert!(
        e.contains("metric expression: column 7: unknown function 'sqr'")
            && e.contains("    acc + sqr(x - y)\n          ^^^"),
        "{e}"
    );
    let e = run("acc + abs(x - y");
    assert!(e.contains("column 16: expected ',' or ')'"), "{e}");
    let e = run("acc + abs(x - y) ; sqrt(x)");
    assert!(e.contains("column 25") && e.contains("final step"), "{e}");
    // Data-dependent: a divisor that can be 0 on this data, a decreasing final step.
    let e = run("acc + abs(x - y) / (x - y)");
    assert!(
        e.contains("column 18") && e.contains("divisor may be 0"),
        "{e}"
    );
    let e = run("acc + abs(x - y) ; -acc");
    assert!(e.contains("must not decrease"), "{e}");
    // Negative values under a square root name the row and column of the data.
    let neg = p(dir.path(), "neg.csv");
    std::fs::write(&neg, "0.5,1\n2,-3\n1,1\n").unwrap();
    let sqrt_expr = "acc + (sqrt(x) - sqrt(y))^2";
    let e = fails(
        &graph_cpu(&neg, "1", &["--metric-expr", sqrt_expr, "--float32"]),
        2,
    );
    assert!(e.contains("row 1, column 1 (value -3)"), "{e}");
    let both = ["-m", "l1", "--metric-expr", "acc + abs(x - y)"];
    let e = fails(&graph_args(&b, "3", &both), 2);
    assert!(e.contains("cannot be used with"), "{e}");
}

#[test]
fn record_files_through_a_temporary_copy_give_the_same_result() {
    // fvecs and bvecs larger than memory are read through a mapped temporary float32 copy;
    // KNN_SPILL=always forces that path on small files.
    let dir = tempfile::tempdir().unwrap();
    let b = generate(dir.path(), "b.fvecs", 500, 12, 21);
    let q = generate(dir.path(), "q.fvecs", 40, 12, 22);
    for (mode, name) in [("never", "mem.npy"), ("always", "spill.npy")] {
        let out = p(dir.path(), name);
        let graph_out = p(dir.path(), &format!("g-{name}"));
        let spill = ("KNN_SPILL", mode);
        let o = knn_env(&search_cpu(&b, &q, "7", &["-o", &out, "--quiet"]), spill);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let g = knn_env(&graph_cpu(&b, "5", &["-o", &graph_out, "--quiet"]), spill);
        assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    }
    for (a, b) in [
        ("mem.npy", "spill.npy"),
        ("mem.dist.npy", "spill.dist.npy"),
        ("g-mem.npy", "g-spill.npy"),
    ] {
        assert_eq!(
            std::fs::read(dir.path().join(a)).unwrap(),
            std::fs::read(dir.path().join(b)).unwrap(),
            "{a} vs {b}"
        );
    }
    // A bad record still names the file and the record.
    let mut bytes = std::fs::read(&b).unwrap();
    bytes.truncate(bytes.len() - 3);
    let bad = p(dir.path(), "bad.fvecs");
    std::fs::write(&bad, bytes).unwrap();
    let x = p(dir.path(), "x.npy");
    let o = knn_env(
        &search_cpu(&bad, &q, "3", &["-o", &x, "--quiet"]),
        ("KNN_SPILL", "always"),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("bad.fvecs") && err.contains("truncated: record 499"),
        "{err}"
    );
}

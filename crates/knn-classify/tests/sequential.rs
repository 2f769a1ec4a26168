//! Sequential mode equals the plain one-by-one loop exactly (labels and probabilities), on
//! random data of many shapes: chains where each new point's nearest is the previous new point,
//! new points crowded far from the labelled ones, duplicates and lattices full of ties, every
//! metric, both weightings. Batch mode is checked against the same brute force.

use knn::synth::Rng;
use knn::{Covariance, Device, Knn, Matrix, MatrixRef, Metric, Options};
use knn_classify::{Classifier, Mode, Params, Weights};

fn cpu() -> Options {
    Options {
        device: Device::Cpu,
        ..Options::default()
    }
}

/// The f64 distance a vote weights by (as scikit-learn reports it).
fn distance(metric: &Metric, key: f64) -> f64 {
    match metric {
        Metric::SqL2 | Metric::L1 | Metric::Linf => key,
        Metric::L2 | Metric::Mahalanobis(_) => key.max(0.0).sqrt(),
        Metric::Cosine => (1.0 + key).max(0.0),
        Metric::Hellinger => (0.5 * key).max(0.0).sqrt(),
        Metric::InnerProduct => -key,
        Metric::Expr(e) => e.distance(key),
    }
}

/// One vote over neighbours in (key, id) order: returns the class and the probabilities.
fn vote(nb: &[(f64, i64)], classes: usize, metric: &Metric, w: Weights) -> (i64, Vec<f64>) {
    let mut s = vec![0.0f64; classes];
    let zero = nb.iter().any(|&(key, _)| distance(metric, key) == 0.0);
    for &(key, c) in nb {
        let d = distance(metric, key);
        s[c as usize] += match (w, zero) {
            (Weights::Uniform, _) => 1.0,
            (Weights::Distance, true) => f64::from(u8::from(d == 0.0)),
            (Weights::Distance, false) => 1.0 / d,
        };
    }
    let best = (0..classes).fold(0, |b, c| if s[c] > s[b] { c } else { b });
    let total: f64 = s.iter().sum();
    (best as i64, s.iter().map(|v| v / total).collect())
}

/// The reference: new points one by one, each searched (f64 brute force, ties to the smaller
/// id) among the labelled points and the new points before it, then added with its class.
/// `batch`: new points never join.
fn naive(case: &Case, k: usize, metric: &Metric, w: Weights, batch: bool) -> (Vec<i64>, Vec<f64>) {
    let (d, classes) = (case.d, case.classes);
    let mut pts: Vec<f32> = case.train.clone();
    let mut lab: Vec<i64> = case.labels.clone();
    let (mut out, mut proba) = (Vec::new(), Vec::new());
    for q in case.new.chunks(d) {
        let mut all: Vec<(f64, u32)> = pts
            .chunks(d)
            .enumerate()
            .map(|(i, p)| (metric.exact_key(q, p), i as u32))
            .collect();
        all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let nb: Vec<(f64, i64)> = all[..k]
            .iter()
            .map(|&(key, i)| (key, lab[i as usize]))
            .collect();
        let (c, p) = vote(&nb, classes, metric, w);
        out.push(c);
        proba.extend(p);
        if !batch {
            pts.extend_from_slice(q);
            lab.push(c);
        }
    }
    (out, proba)
}

/// The same loop with the engine's `Knn::search` on each prefix (as a user would write it).
fn engine_loop(
    train: &[f32],
    labels: &[i64],
    new: &[f32],
    d: usize,
    k: usize,
    classes: usize,
) -> Vec<i64> {
    let knn = Knn::new(&cpu()).unwrap();
    let mut pts: Vec<f32> = train.to_vec();
    let mut lab: Vec<i64> = labels.to_vec();
    let mut out = Vec::new();
    for q in new.chunks(d) {
        let base = MatrixRef::new("prefix", &pts, d).unwrap();
        let nn = knn
            .search(base, MatrixRef::new("q", q, d).unwrap(), k, &Metric::L2)
            .unwrap();
        let mut nb: Vec<(f64, u32)> = nn
            .ids_of(0)
            .iter()
            .map(|&i| {
                (
                    Metric::L2.exact_key(q, &pts[i as usize * d..(i as usize + 1) * d]),
                    i,
                )
            })
            .collect();
        nb.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let nb: Vec<(f64, i64)> = nb.iter().map(|&(key, i)| (key, lab[i as usize])).collect();
        let c = vote(&nb, classes, &Metric::L2, Weights::Uniform).0;
        out.push(c);
        pts.extend_from_slice(q);
        lab.push(c);
    }
    out
}

struct Case {
    name: String,
    train: Vec<f32>,
    labels: Vec<i64>,
    new: Vec<f32>,
    d: usize,
    classes: usize,
}

fn uniform(rng: &mut Rng, rows: usize, d: usize, lo: f64, hi: f64) -> Vec<f32> {
    (0..rows * d)
        .map(|_| (lo + (hi - lo) * rng.uniform()) as f32)
        .collect()
}

fn labels(rng: &mut Rng, n: usize, classes: usize) -> Vec<i64> {
    (0..n).map(|_| rng.below(classes as u64) as i64).collect()
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let mut rng = Rng::new(3);
    // Random uniform, many shapes (sizes around tile edges, d from 1 to 70).
    for &(n, m, d, c) in &[
        (1, 1, 1, 1),
        (7, 13, 2, 3),
        (33, 47, 3, 2),
        (100, 100, 5, 4),
        (200, 31, 16, 10),
        (64, 300, 8, 3),
        (500, 129, 70, 5),
        (16, 257, 2, 2),
    ] {
        let train = uniform(&mut rng, n, d, -100.0, 100.0);
        out.push(Case {
            name: format!("uniform n={n} m={m} d={d}"),
            labels: labels(&mut rng, n, c),
            new: uniform(&mut rng, m, d, -100.0, 100.0),
            train,
            d,
            classes: c,
        });
    }
    // Chains: labelled points in a far cluster; new points walk away from it in small steps,
    // so each new point's nearest is the previous new point.
    for &(n, m, d) in &[(20, 200, 2), (50, 400, 3), (16, 1000, 1)] {
        let mut train = uniform(&mut rng, n, d, 0.0, 1.0);
        train.iter_mut().for_each(|v| *v -= 50.0);
        let mut new = Vec::new();
        let mut p = vec![0.0f32; d];
        for _ in 0..m {
            for v in p.iter_mut() {
                *v += (0.5 + 0.1 * rng.uniform()) as f32;
            }
            new.extend_from_slice(&p);
        }
        out.push(Case {
            name: format!("chain n={n} m={m} d={d}"),
            labels: labels(&mut rng, n, 3),
            new,
            train,
            d,
            classes: 3,
        });
    }
    // Chain walking towards the labelled points, in reverse file order, and zig-zag.
    {
        let d = 2;
        let train = uniform(&mut rng, 30, d, -1.0, 1.0);
        let new: Vec<f32> = (0..300)
            .flat_map(|i| {
                let t = 5.0 + 0.3 * i as f32;
                [t, if i % 2 == 0 { 0.1 } else { -0.1 }]
            })
            .collect();
        out.push(Case {
            name: "zig-zag chain".into(),
            labels: labels(&mut rng, 30, 4),
            new,
            train,
            d,
            classes: 4,
        });
    }
    // New points crowded in a tight cluster far from the labelled ones, random order.
    for &(n, m, d) in &[(40, 600, 3), (15, 2000, 2)] {
        let train = uniform(&mut rng, n, d, -100.0, -90.0);
        let new = uniform(&mut rng, m, d, 50.0, 50.5);
        out.push(Case {
            name: format!("crowd n={n} m={m} d={d}"),
            labels: labels(&mut rng, n, 5),
            new,
            train,
            d,
            classes: 5,
        });
    }
    // Lattices: integer coordinates, many exactly equal distances, duplicates.
    for &(n, m, d, side) in &[(100, 200, 2, 6), (300, 300, 3, 4), (50, 120, 1, 5)] {
        let lattice = |rng: &mut Rng, rows: usize| -> Vec<f32> {
            (0..rows * d).map(|_| rng.below(side) as f32).collect()
        };
        let train = lattice(&mut rng, n);
        out.push(Case {
            name: format!("lattice n={n} m={m} d={d} side={side}"),
            labels: labels(&mut rng, n, 3),
            new: lattice(&mut rng, m),
            train,
            d,
            classes: 3,
        });
    }
    // New points that duplicate labelled points and each other (zero distances).
    {
        let d = 4;
        let train = uniform(&mut rng, 60, d, 0.0, 3.0);
        let mut new = Vec::new();
        for i in 0..150 {
            let src = if i % 3 == 0 {
                train[(i % 60) * d..(i % 60 + 1) * d].to_vec()
            } else if i > 0 && i % 3 == 1 {
                new[(i - 1) * d..i * d].to_vec()
            } else {
                uniform(&mut rng, 1, d, 0.0, 3.0)
            };
            new.extend(src);
        }
        out.push(Case {
            name: "duplicates".into(),
            labels: labels(&mut rng, 60, 4),
            new,
            train,
            d,
            classes: 4,
        });
    }
    out
}

fn run(case: &Case, k: usize, metric: &Metric, w: Weights, mode: Mode) -> (Vec<i64>, Vec<f64>) {
    run_with_stats(case, k, metric, w, mode).0
}

fn run_with_stats(
    case: &Case,
    k: usize,
    metric: &Metric,
    w: Weights,
    mode: Mode,
) -> ((Vec<i64>, Vec<f64>), knn_classify::Stats) {
    let params = Params {
        k,
        metric: metric.clone(),
        weights: w,
        mode,
    };
    let mut clf = Classifier::new(params, &cpu()).unwrap();
    let classes: Vec<i64> = (0..case.classes as i64).collect();
    clf.fit_with_classes(
        MatrixRef::new("train", &case.train, case.d).unwrap(),
        &case.labels,
        &classes,
    )
    .unwrap();
    let p = clf
        .classify(MatrixRef::new("new", &case.new, case.d).unwrap(), true)
        .unwrap();
    ((p.labels, p.proba.unwrap()), p.stats)
}

fn assert_same(what: &str, ours: &(Vec<i64>, Vec<f64>), want: &(Vec<i64>, Vec<f64>)) {
    if let Some(i) = (0..want.0.len()).find(|&i| ours.0[i] != want.0[i]) {
        panic!(
            "{what}: new point {i}: ours {} but the loop says {}",
            ours.0[i], want.0[i]
        );
    }
    assert_eq!(ours.0.len(), want.0.len(), "{what}");
    for (i, (a, b)) in ours.1.iter().zip(&want.1).enumerate() {
        assert!(
            (a - b).abs() <= 1e-12,
            "{what}: probability {i}: {a} vs {b}"
        );
    }
}

#[test]
fn sequential_equals_the_loop() {
    let (mut widened, mut scanned) = (0, 0);
    for case in cases() {
        let n = case.labels.len();
        for k in [1usize, 2, 3, 5, 15] {
            if k > n {
                continue;
            }
            for w in [Weights::Uniform, Weights::Distance] {
                let want = naive(&case, k, &Metric::L2, w, false);
                let (ours, stats) = run_with_stats(&case, k, &Metric::L2, w, Mode::Sequential);
                assert_same(&format!("{} k={k} {w} sequential", case.name), &ours, &want);
                if w == Weights::Uniform {
                    println!("{} k={k}: {stats:?}", case.name);
                }
                widened += stats.widened;
                scanned += stats.scanned;
                let want = naive(&case, k, &Metric::L2, w, true);
                let ours = run(&case, k, &Metric::L2, w, Mode::Batch);
                assert_same(&format!("{} k={k} {w} batch", case.name), &ours, &want);
            }
        }
    }
    // The cases reach every path: lists proved at once, widened lists, exact scans.
    assert!(
        widened > 0 && scanned > 0,
        "widened {widened}, scanned {scanned}"
    );
}

#[test]
fn sequential_equals_the_loop_for_every_metric() {
    let mut rng = Rng::new(11);
    let (n, m, d, c) = (80, 150, 5, 4);
    let train = uniform(&mut rng, n, d, 0.1, 10.0);
    let case = Case {
        name: "metrics".into(),
        labels: labels(&mut rng, n, c),
        new: uniform(&mut rng, m, d, 0.1, 10.0),
        train,
        d,
        classes: c,
    };
    let metrics = [
        Metric::SqL2,
        Metric::L1,
        Metric::Linf,
        Metric::Cosine,
        Metric::Hellinger,
        Metric::InnerProduct,
    ];
    for metric in &metrics {
        for k in [1, 4, 9] {
            for w in [Weights::Uniform, Weights::Distance] {
                if w == Weights::Distance && metric.is_similarity() {
                    continue;
                }
                let want = naive(&case, k, metric, w, false);
                let ours = run(&case, k, metric, w, Mode::Sequential);
                assert_same(&format!("{metric} k={k} {w}"), &ours, &want);
            }
        }
    }
}

#[test]
fn mahalanobis_uses_the_labelled_covariance() {
    // Sequential Mahalanobis = the loop in the space whitened by the labelled points' covariance.
    let mut rng = Rng::new(5);
    let (n, m, d, c) = (120, 90, 3, 3);
    let mut train = uniform(&mut rng, n, d, -1.0, 1.0);
    for r in train.chunks_mut(d) {
        r[1] = 3.0 * r[0] + 0.2 * r[1];
    }
    let labels = labels(&mut rng, n, c);
    let new = uniform(&mut rng, m, d, -1.0, 1.0);
    let w = knn_core_whitener(&train, d);
    let white = |x: &[f32]| -> Vec<f32> {
        x.chunks(d)
            .flat_map(|r| {
                let mut o = vec![0.0f32; d];
                w(r, &mut o);
                o
            })
            .collect()
    };
    let whitened = Case {
        name: "whitened".into(),
        train: white(&train),
        labels: labels.clone(),
        new: white(&new),
        d,
        classes: c,
    };
    let want = naive(&whitened, 5, &Metric::L2, Weights::Distance, false);
    let case = Case {
        name: "mahalanobis".into(),
        train,
        labels,
        new,
        d,
        classes: c,
    };
    let metric = Metric::Mahalanobis(Covariance::FromBase);
    let ours = run(&case, 5, &metric, Weights::Distance, Mode::Sequential);
    assert_same("mahalanobis", &ours, &want);
}

fn knn_core_whitener(train: &[f32], d: usize) -> impl Fn(&[f32], &mut [f32]) + Sync {
    let m = Matrix::new("train", train.to_vec(), d).unwrap();
    knn_core::prepare::whitener(&Covariance::FromBase, m.view()).unwrap()
}

#[test]
fn sequential_equals_the_engine_loop() {
    // The reference loop written with Knn::search on each prefix, as a user would.
    let mut rng = Rng::new(9);
    for &(n, m, d) in &[(30, 120, 2), (200, 150, 16)] {
        let train = uniform(&mut rng, n, d, -100.0, 100.0);
        let labels = labels(&mut rng, n, 3);
        let new = uniform(&mut rng, m, d, -100.0, 100.0);
        let want = engine_loop(&train, &labels, &new, d, 5, 3);
        let case = Case {
            name: String::new(),
            train,
            labels,
            new,
            d,
            classes: 3,
        };
        let ours = run(&case, 5, &Metric::L2, Weights::Uniform, Mode::Sequential);
        assert_eq!(ours.0, want, "n={n} m={m} d={d}");
    }
}

#[test]
fn chains_take_one_wave_per_point() {
    let d = 1;
    let train = vec![-100.0f32, -101.0];
    let new: Vec<f32> = (0..500).map(|i| i as f32).collect();
    let params = Params {
        k: 1,
        mode: Mode::Sequential,
        ..Params::default()
    };
    let mut clf = Classifier::new(params, &cpu()).unwrap();
    clf.fit(MatrixRef::new("train", &train, d).unwrap(), &[4, 2])
        .unwrap();
    let p = clf
        .classify(MatrixRef::new("new", &new, d).unwrap(), false)
        .unwrap();
    assert_eq!(p.labels, vec![4; 500]);
    assert_eq!(p.stats.waves, 500);
    assert_eq!(p.stats.largest_wave, 1);
}

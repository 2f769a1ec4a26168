//! Predictions identical to scikit-learn's `KNeighborsClassifier(algorithm="brute")` on its
//! bundled digits (1797 × 64) and iris (150 × 4), split with a fixed seed, for k in
//! {1, 3, 5, 15} and uniform / distance weights, for every test point.
//!
//! The data and scikit-learn's answers were exported once by `bench/classify/export_sklearn.py`
//! (scikit-learn 1.9.1) into `tests/data/`. A prediction may differ only where scikit-learn's
//! neighbour set is a different but equally valid k-nearest set (a distance tie at the k-th
//! neighbour: scikit-learn keeps whichever its heap kept, we keep the smaller ids); the test
//! proves each such case is a genuine tie (exact f64 distances) and that our vote on
//! scikit-learn's neighbours gives scikit-learn's prediction, and prints how many there were.

use knn::{Device, MatrixRef, Metric, Options};
use knn_classify::{Classifier, Params, Weights};

fn parse(text: &str) -> Vec<Vec<f64>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split(',').map(|c| c.trim().parse().unwrap()).collect())
        .collect()
}

struct Data {
    name: &'static str,
    train: Vec<f32>,
    labels: Vec<i64>,
    test: Vec<f32>,
    dim: usize,
    /// Column name → sklearn's predictions.
    predictions: Vec<(String, Vec<i64>)>,
    /// k → sklearn's neighbour ids (uniform kneighbors) per test point.
    neighbours: Vec<(usize, Vec<Vec<u32>>)>,
}

macro_rules! data {
    ($name:literal) => {{
        let train = parse(include_str!(concat!("data/", $name, "_train.csv")));
        let test = parse(include_str!(concat!("data/", $name, "_test.csv")));
        let pred = include_str!(concat!("data/", $name, "_predictions.csv"));
        let mut lines = pred.lines();
        let header: Vec<String> = lines.next().unwrap().split(',').map(String::from).collect();
        let rows = parse(&lines.collect::<Vec<_>>().join("\n"));
        let dim = test[0].len();
        let nb = |t: &str| -> Vec<Vec<u32>> {
            parse(t)
                .into_iter()
                .map(|r| r.into_iter().map(|v| v as u32).collect())
                .collect()
        };
        Data {
            name: $name,
            train: train
                .iter()
                .flat_map(|r| r[..dim].iter().map(|&v| v as f32))
                .collect(),
            labels: train.iter().map(|r| r[dim] as i64).collect(),
            test: test.iter().flatten().map(|&v| v as f32).collect(),
            dim,
            predictions: header
                .iter()
                .enumerate()
                .map(|(c, h)| (h.clone(), rows.iter().map(|r| r[c] as i64).collect()))
                .collect(),
            neighbours: vec![
                (
                    1,
                    nb(include_str!(concat!("data/", $name, "_neighbors_k1.csv"))),
                ),
                (
                    3,
                    nb(include_str!(concat!("data/", $name, "_neighbors_k3.csv"))),
                ),
                (
                    5,
                    nb(include_str!(concat!("data/", $name, "_neighbors_k5.csv"))),
                ),
                (
                    15,
                    nb(include_str!(concat!("data/", $name, "_neighbors_k15.csv"))),
                ),
            ],
        }
    }};
}

/// Exact squared distance, f64.
fn sq(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum()
}

/// scikit-learn's vote on given neighbours (independent of the crate's code): uniform counts or
/// 1/d weights with the zero-distance rule, argmax with ties to the smallest label.
fn vote(ids: &[u32], d: &[f64], labels: &[i64], weights: Weights) -> i64 {
    let mut classes: Vec<i64> = labels.to_vec();
    classes.sort_unstable();
    classes.dedup();
    let mut score = vec![0.0f64; classes.len()];
    let zero = d.contains(&0.0);
    for (&i, &di) in ids.iter().zip(d) {
        let c = classes.binary_search(&labels[i as usize]).unwrap();
        score[c] += match (weights, zero) {
            (Weights::Uniform, _) => 1.0,
            (Weights::Distance, true) => f64::from(u8::from(di == 0.0)),
            (Weights::Distance, false) => 1.0 / di,
        };
    }
    let mut best = 0;
    for c in 0..score.len() {
        if score[c] > score[best] {
            best = c;
        }
    }
    classes[best]
}

fn check(data: &Data) {
    let cpu = Options {
        device: Device::Cpu,
        ..Options::default()
    };
    let n_test = data.test.len() / data.dim;
    let mut total_ties = 0;
    for (column, expected) in &data.predictions {
        let (k, weights) = column.split_once('_').unwrap();
        let k: usize = k[1..].parse().unwrap();
        let weights: Weights = weights.parse().unwrap();
        let params = Params {
            k,
            metric: Metric::L2,
            weights,
            ..Params::default()
        };
        let mut clf = Classifier::new(params, &cpu).unwrap();
        clf.fit(
            MatrixRef::new("train", &data.train, data.dim).unwrap(),
            &data.labels,
        )
        .unwrap();
        let ours = clf
            .predict(MatrixRef::new("test", &data.test, data.dim).unwrap())
            .unwrap();
        assert_eq!(ours.len(), n_test);
        let sk_neighbours = &data.neighbours.iter().find(|(kk, _)| *kk == k).unwrap().1;
        let mut ties = 0;
        for i in 0..n_test {
            if ours[i] == expected[i] {
                continue;
            }
            // A difference must be a genuine tie at the k-th distance.
            let q = &data.test[i * data.dim..(i + 1) * data.dim];
            let dist: Vec<f64> = (0..data.labels.len())
                .map(|b| sq(q, &data.train[b * data.dim..(b + 1) * data.dim]).sqrt())
                .collect();
            let mut sorted = dist.clone();
            sorted.sort_by(f64::total_cmp);
            let kth = sorted[k - 1];
            let sk = &sk_neighbours[i];
            let sk_d: Vec<f64> = sk.iter().map(|&b| dist[b as usize]).collect();
            let strictly_closer = dist.iter().filter(|&&d| d < kth).count();
            let valid = sk_d.iter().all(|&d| d <= kth)
                && sk_d.iter().filter(|&&d| d < kth).count() == strictly_closer;
            let tie_group = dist.iter().filter(|&&d| d == kth).count();
            assert!(
                valid && tie_group > k - strictly_closer,
                "{} {column}: test point {i}: ours {} but scikit-learn {} without a tie at the k-th distance",
                data.name,
                ours[i],
                expected[i]
            );
            assert_eq!(
                vote(sk, &sk_d, &data.labels, weights),
                expected[i],
                "{} {column}: test point {i}: our vote on scikit-learn's neighbours differs",
                data.name
            );
            ties += 1;
        }
        total_ties += ties;
        println!(
            "{} {column}: {} of {n_test} identical, {ties} differ by a genuine k-th-distance tie",
            data.name,
            n_test - ties
        );
    }
    println!("{}: {total_ties} tie differences in all", data.name);
}

#[test]
fn digits_match_scikit_learn() {
    check(&data!("digits"));
}

#[test]
fn iris_match_scikit_learn() {
    check(&data!("iris"));
}

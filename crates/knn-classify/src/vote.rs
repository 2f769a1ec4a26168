//! Turning k neighbours into a class: uniform (majority) and distance-weighted votes, the
//! way scikit-learn's `KNeighborsClassifier` does it.

use crate::error::{ClassifyError, Result};
use knn::Metric;
use std::fmt;
use std::str::FromStr;

/// How neighbours are weighted in the vote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Weights {
    /// Every neighbour counts 1: the class held by most of the k neighbours (the mode).
    #[default]
    Uniform,
    /// Neighbour at distance `d` counts `1/d`. If any neighbour is at distance exactly 0, only
    /// those exact matches vote, each with weight 1 (scikit-learn's rule).
    Distance,
}

impl FromStr for Weights {
    type Err = ClassifyError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "uniform" => Ok(Weights::Uniform),
            "distance" => Ok(Weights::Distance),
            _ => Err(ClassifyError::Option(format!(
                "unknown weights '{s}' (uniform, distance)"
            ))),
        }
    }
}

impl fmt::Display for Weights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Weights::Uniform => "uniform",
            Weights::Distance => "distance",
        })
    }
}

/// The distance in f64 for an exact kernel key of `metric` (the f64 counterpart of
/// `Metric::distance_from_key`; Mahalanobis is searched as L2 on whitened data).
pub(crate) fn distance_f64(metric: &Metric, key: f64) -> f64 {
    match metric {
        Metric::SqL2 | Metric::L1 | Metric::Linf => key,
        Metric::L2 | Metric::Mahalanobis(_) => key.max(0.0).sqrt(),
        Metric::InnerProduct => -key,
        Metric::Cosine => (1.0 + key).max(0.0),
        Metric::Hellinger => (0.5 * key).max(0.0).sqrt(),
        Metric::Expr(e) => e.distance(key),
    }
}

/// Checks that `weights` make sense for `metric`.
pub(crate) fn check_weights(weights: Weights, metric: &Metric) -> Result<()> {
    if weights == Weights::Distance && metric.is_similarity() {
        return Err(ClassifyError::Option(format!(
            "distance weights need a distance, but {metric} is a similarity"
        )));
    }
    Ok(())
}

/// One vote. `neighbours` are (exact key, class index) in (key, id) order; `scores` (length =
/// number of classes) receives each class's total weight. Returns the winning class index: the
/// largest total, the smallest class index among equal totals (scikit-learn's `argmax`).
///
/// Totals are summed in f64 in neighbour order, so the same neighbours always give the same
/// bits.
pub(crate) fn vote(
    neighbours: &[(f64, u32)],
    weights: Weights,
    metric: &Metric,
    scores: &mut [f64],
) -> u32 {
    scores.iter_mut().for_each(|s| *s = 0.0);
    match weights {
        Weights::Uniform => {
            for &(_, c) in neighbours {
                scores[c as usize] += 1.0;
            }
        }
        Weights::Distance => {
            let exact_match = neighbours
                .iter()
                .any(|&(key, _)| distance_f64(metric, key) == 0.0);
            for &(key, c) in neighbours {
                let d = distance_f64(metric, key);
                let w = match (exact_match, d == 0.0) {
                    (true, true) => 1.0,
                    (true, false) => 0.0,
                    (false, _) => 1.0 / d,
                };
                scores[c as usize] += w;
            }
        }
    }
    let mut best = 0;
    for (c, &s) in scores.iter().enumerate() {
        if s > scores[best] {
            best = c;
        }
    }
    best as u32
}

/// Scales `scores` to probabilities (they sum to 1).
pub(crate) fn normalise(scores: &mut [f64]) {
    let total: f64 = scores.iter().sum();
    if total > 0.0 {
        scores.iter_mut().for_each(|s| *s /= total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_smallest_class() {
        let mut s = vec![0.0; 3];
        let n = [(1.0, 2), (2.0, 1), (3.0, 1), (4.0, 2)];
        assert_eq!(vote(&n, Weights::Uniform, &Metric::L2, &mut s), 1);
        assert_eq!(s, [0.0, 2.0, 2.0]);
    }

    #[test]
    fn distance_weights_and_exact_matches() {
        let mut s = vec![0.0; 3];
        // Squared keys 1, 4, 4 under L2: weights 1, 1/2, 1/2.
        let n = [(1.0, 0), (4.0, 1), (4.0, 1)];
        assert_eq!(vote(&n, Weights::Distance, &Metric::L2, &mut s), 0);
        assert_eq!(s, [1.0, 1.0, 0.0]);
        // One exact match outvotes everything else.
        let n = [(0.0, 2), (0.01, 1), (0.01, 1)];
        assert_eq!(vote(&n, Weights::Distance, &Metric::L2, &mut s), 2);
        assert_eq!(s, [0.0, 0.0, 1.0]);
    }
}

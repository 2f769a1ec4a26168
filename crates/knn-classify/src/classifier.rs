//! The [`Classifier`]: fit on labelled points, predict classes (and probabilities) of new ones.

use crate::error::{ClassifyError, Result};
use crate::sequential;
use crate::vote::{check_weights, normalise, vote, Weights};
use knn::{Covariance, Knn, KnnError, Matrix, MatrixRef, Metric, Options};
use rayon::prelude::*;
use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// How new points are classified.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Every new point is classified against the labelled points only.
    #[default]
    Batch,
    /// Seed 003's semantics: new points are taken in order and each, once classified, joins the
    /// labelled set for the points after it. The result equals a one-by-one loop exactly; the
    /// work is done for all points at once (see [`crate::sequential`]).
    Sequential,
}

impl FromStr for Mode {
    type Err = ClassifyError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "batch" => Ok(Mode::Batch),
            "sequential" => Ok(Mode::Sequential),
            _ => Err(ClassifyError::Option(format!(
                "unknown mode '{s}' (batch, sequential)"
            ))),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Batch => "batch",
            Mode::Sequential => "sequential",
        })
    }
}

/// What the classifier does.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    /// Neighbours that vote (1 ..= labelled points).
    pub k: usize,
    /// The distance. Mahalanobis with [`Covariance::FromBase`] estimates the covariance from the
    /// labelled points given to `fit` (in sequential mode too: new points do not change it).
    pub metric: Metric,
    /// How votes are weighted.
    pub weights: Weights,
    /// Batch or sequential.
    pub mode: Mode,
}

impl Default for Params {
    /// k = 5, L2, uniform weights, batch: scikit-learn's defaults.
    fn default() -> Self {
        Params {
            k: 5,
            metric: Metric::L2,
            weights: Weights::Uniform,
            mode: Mode::Batch,
        }
    }
}

/// Counters of one sequential run (zero in batch mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Waves of the dependency resolution (the seed's "punisher" rounds): 1 when no new point
    /// has an earlier new point among its k nearest; the number of new points for a chain.
    pub waves: usize,
    /// Largest wave (points decided together).
    pub largest_wave: usize,
    /// New points whose first candidate list could not prove their k nearest and were asked
    /// again with a wider list.
    pub widened: usize,
    /// New points finished by an exact scan of the earlier new points.
    pub scanned: usize,
}

/// The result of [`Classifier::classify`].
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// The predicted label of every new point, in input order.
    pub labels: Vec<i64>,
    /// `rows × classes` probabilities, row-major, columns in the order of `classes` (when asked).
    pub proba: Option<Vec<f64>>,
    /// The class labels, ascending: the columns of `proba`.
    pub classes: Vec<i64>,
    /// Sequential-mode counters.
    pub stats: Stats,
}

/// Labelled points, kept after `fit`.
struct Fitted {
    points: Matrix,
    /// Class index (into `classes`) of each point.
    labels: Vec<u32>,
    classes: Vec<i64>,
}

/// k-nearest-neighbour classifier on the exact engine.
///
/// Neighbours are the exact k nearest by (distance, id), ids being the labelled points' order
/// (and, in sequential mode, new points after them in input order), so the answer is the same on
/// every device and thread count. Votes follow scikit-learn's `KNeighborsClassifier`: the class
/// with the largest (weighted) count, ties to the smallest class label.
///
/// ```
/// use knn_classify::{Classifier, Params, Weights};
/// use knn::{MatrixRef, Options, Device};
/// let train = [0.0f32, 0.0, 0.1, 0.0, 5.0, 5.0, 5.1, 5.0, 5.0, 5.1];
/// let labels = [7, 7, 3, 3, 3];
/// let params = Params { k: 3, weights: Weights::Distance, ..Params::default() };
/// let mut clf = Classifier::new(params, &Options { device: Device::Cpu, ..Options::default() })?;
/// clf.fit(MatrixRef::new("train", &train, 2)?, &labels)?;
/// let new = [0.05f32, 0.0, 4.9, 5.0];
/// assert_eq!(clf.predict(MatrixRef::new("new", &new, 2)?)?, [7, 3]);
/// # Ok::<(), knn_classify::ClassifyError>(())
/// ```
pub struct Classifier {
    params: Params,
    knn: Knn,
    fitted: Option<Fitted>,
}

/// Order of neighbours: exact key, then id (the engine's order).
pub(crate) fn by_key_then_id(a: &(f64, u32), b: &(f64, u32)) -> Ordering {
    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
}

/// One classification problem in the exact space (whitened for Mahalanobis).
pub(crate) struct Problem<'a> {
    pub knn: &'a Knn,
    pub train: MatrixRef<'a>,
    pub train_labels: &'a [u32],
    pub queries: MatrixRef<'a>,
    pub k: usize,
    pub metric: &'a Metric,
    pub weights: Weights,
    pub classes: usize,
}

/// Class index and (optionally) per-class scores of every query.
pub(crate) struct Votes {
    pub class: Vec<u32>,
    pub scores: Option<Vec<f64>>,
    pub stats: Stats,
}

impl Classifier {
    /// A classifier with `params`, searching on the engine `options` pick.
    pub fn new(params: Params, options: &Options) -> Result<Self> {
        Self::with_engine(params, Knn::new(options)?)
    }

    /// A classifier with `params` on a configured engine.
    pub fn with_engine(params: Params, knn: Knn) -> Result<Self> {
        if params.k == 0 {
            return Err(KnnError::ZeroK.into());
        }
        check_weights(params.weights, &params.metric)?;
        Ok(Classifier {
            params,
            knn,
            fitted: None,
        })
    }

    /// The parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The engine's name (`cpu`, `cuda:0/fused`, ...).
    pub fn engine_name(&self) -> String {
        self.knn.engine_name()
    }

    /// Remembers the labelled `points` and their `labels` (any integers); the classes are the
    /// distinct labels, ascending (scikit-learn's `classes_`).
    pub fn fit(&mut self, points: MatrixRef<'_>, labels: &[i64]) -> Result<()> {
        let mut classes = labels.to_vec();
        classes.sort_unstable();
        classes.dedup();
        self.fit_with_classes(points, labels, &classes)
    }

    /// [`Classifier::fit`] with the class set given (ascending, distinct, containing every
    /// label): classes without labelled points still get a probability column (0).
    pub fn fit_with_classes(
        &mut self,
        points: MatrixRef<'_>,
        labels: &[i64],
        classes: &[i64],
    ) -> Result<()> {
        if points.rows() == 0 {
            return Err(KnnError::EmptyBase.into());
        }
        if labels.len() != points.rows() {
            return Err(ClassifyError::Labels(format!(
                "{} labels for {} points",
                labels.len(),
                points.rows()
            )));
        }
        if classes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ClassifyError::Labels(
                "the class list must be ascending and without repeats".into(),
            ));
        }
        if classes.len() > u32::MAX as usize {
            return Err(ClassifyError::Labels("too many classes".into()));
        }
        let index = labels
            .iter()
            .enumerate()
            .map(|(i, l)| {
                classes.binary_search(l).map(|c| c as u32).map_err(|_| {
                    ClassifyError::Labels(format!(
                        "point {i} has label {l}, which is not one of the {} classes",
                        classes.len()
                    ))
                })
            })
            .collect::<Result<Vec<u32>>>()?;
        self.fitted = Some(Fitted {
            points: Matrix::new("labelled points", points.as_slice().to_vec(), points.dim())?,
            labels: index,
            classes: classes.to_vec(),
        });
        Ok(())
    }

    /// The classes, ascending (empty before `fit`).
    pub fn classes(&self) -> &[i64] {
        self.fitted.as_ref().map_or(&[], |f| &f.classes)
    }

    /// The predicted label of every row of `points`.
    pub fn predict(&self, points: MatrixRef<'_>) -> Result<Vec<i64>> {
        Ok(self.classify(points, false)?.labels)
    }

    /// `rows × classes` probabilities, row-major, columns in the order of [`Classifier::classes`]:
    /// each class's share of the (weighted) votes.
    pub fn predict_proba(&self, points: MatrixRef<'_>) -> Result<Vec<f64>> {
        Ok(self.classify(points, true)?.proba.unwrap_or_default())
    }

    /// Labels, and probabilities when `proba`, with the run's counters.
    pub fn classify(&self, points: MatrixRef<'_>, proba: bool) -> Result<Prediction> {
        let f = self.fitted.as_ref().ok_or(ClassifyError::NotFitted)?;
        if points.dim() != f.points.dim() {
            return Err(KnnError::DimMismatch {
                base: f.points.dim(),
                queries: points.dim(),
            }
            .into());
        }
        if let Mode::Sequential = self.params.mode {
            if f.points.rows() + points.rows() > u32::MAX as usize {
                return Err(KnnError::TooManyPoints {
                    n: f.points.rows() + points.rows(),
                }
                .into());
            }
        }
        // Mahalanobis is L2 in the whitened space (the covariance from the labelled points
        // unless given): the same keys the engine ranks by.
        let whitened;
        let (train, queries, metric) = match &self.params.metric {
            Metric::Mahalanobis(cov) => {
                whitened = whiten(cov, f.points.view(), points)?;
                (whitened.0.view(), whitened.1.view(), Metric::L2)
            }
            m => (f.points.view(), points, m.clone()),
        };
        let problem = Problem {
            knn: &self.knn,
            train,
            train_labels: &f.labels,
            queries,
            k: self.params.k,
            metric: &metric,
            weights: self.params.weights,
            classes: f.classes.len(),
        };
        let votes = match self.params.mode {
            Mode::Batch => batch(&problem, proba)?,
            Mode::Sequential => sequential::classify(&problem, proba)?,
        };
        Ok(Prediction {
            labels: votes.class.iter().map(|&c| f.classes[c as usize]).collect(),
            proba: votes.scores,
            classes: f.classes.clone(),
            stats: votes.stats,
        })
    }
}

/// Labelled points and queries in the whitened space of `cov` (estimated from `train`).
fn whiten(cov: &Covariance, train: MatrixRef<'_>, q: MatrixRef<'_>) -> Result<(Matrix, Matrix)> {
    let w = knn_core::prepare::whitener(cov, train)?;
    let map = |m: MatrixRef<'_>| {
        let d = m.dim();
        let mut out = vec![0.0f32; m.rows() * d];
        out.par_chunks_mut(d)
            .zip(m.as_slice().par_chunks(d))
            .for_each(|(o, x)| w(x, o));
        Matrix::new("whitened points", out, d)
    };
    Ok((map(train)?, map(q)?))
}

/// Exact keys of `q` to the base points `ids`, in (key, id) order.
pub(crate) fn keyed(
    metric: &Metric,
    q: &[f32],
    base: MatrixRef<'_>,
    ids: &[u32],
) -> Vec<(f64, u32)> {
    let mut v: Vec<(f64, u32)> = ids
        .iter()
        .map(|&b| (metric.exact_key(q, base.row(b as usize)), b))
        .collect();
    v.sort_unstable_by(by_key_then_id);
    v
}

/// Batch mode: one search against the labelled points, one vote per query.
fn batch(p: &Problem<'_>, want_scores: bool) -> Result<Votes> {
    let m = p.queries.rows();
    if m == 0 {
        return Ok(Votes {
            class: Vec::new(),
            scores: want_scores.then(Vec::new),
            stats: Stats::default(),
        });
    }
    let nn = p.knn.search(p.train, p.queries, p.k, p.metric)?;
    let decide = |i: usize, scores: &mut [f64]| {
        let nb: Vec<(f64, u32)> = keyed(p.metric, p.queries.row(i), p.train, nn.ids_of(i))
            .into_iter()
            .map(|(key, id)| (key, p.train_labels[id as usize]))
            .collect();
        vote(&nb, p.weights, p.metric, scores)
    };
    let mut class = vec![0u32; m];
    let scores = if want_scores {
        let mut s = vec![0.0f64; m * p.classes];
        class
            .par_iter_mut()
            .zip(s.par_chunks_mut(p.classes))
            .enumerate()
            .for_each(|(i, (c, s))| {
                *c = decide(i, s);
                normalise(s);
            });
        Some(s)
    } else {
        class
            .par_iter_mut()
            .enumerate()
            .for_each_init(|| vec![0.0f64; p.classes], |s, (i, c)| *c = decide(i, s));
        None
    };
    Ok(Votes {
        class,
        scores,
        stats: Stats::default(),
    })
}

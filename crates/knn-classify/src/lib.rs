//! # knn-classify
//!
//! k-nearest-neighbour classification on the exact `knn` engine (seed 003).
//!
//! | task | call |
//! |---|---|
//! | classify new points by their k nearest labelled points | [`Classifier::fit`], [`Classifier::predict`] |
//! | class probabilities (shares of the votes) | [`Classifier::predict_proba`] |
//! | labels, probabilities and counters in one call | [`Classifier::classify`] |
//! | each classified point joins the labelled set (seed 003) | [`Params::mode`] = [`Mode::Sequential`] |
//! | 1/distance votes | [`Params::weights`] = [`Weights::Distance`] |
//! | read / write the seed's CSV (`numels,newels,classes,dim`) | [`SeedCsv::read`], [`fill_predictions`] |
//! | generate the seed's CSV | [`generate_seed_csv`], [`SeedCsv::write`] |
//! | separate files (npy, CSV, ivecs) | [`files`] |
//!
//! ## The vote (scikit-learn's `KNeighborsClassifier`)
//! - Neighbours: the exact k nearest by (distance, id), ties to the smaller id: labelled points
//!   have ids `0..n` in input order.
//! - [`Weights::Uniform`]: each neighbour counts 1. [`Weights::Distance`]: `1/d`; when some
//!   neighbours are at distance exactly 0, only they vote, 1 each.
//! - The class with the largest total wins; equal totals go to the **smallest class label**.
//!   Totals are f64 sums in (distance, id) order; distances are recomputed in f64.
//! - Probabilities: each class's total over the sum of all totals.
//!
//! ## Sequential mode
//! New points are taken in input order; each, once classified, joins the labelled set (id
//! `n + j` for new point `j`) for the points after it. The result equals the one-by-one loop
//! exactly, but is computed for all points at once: candidate lists from two engine searches,
//! then the dependencies resolved in waves (see [`sequential`](crate::sequential) internals in
//! `src/sequential.rs`).
//!
//! ```
//! use knn_classify::{Classifier, Mode, Params};
//! use knn::{Device, MatrixRef, Options};
//! let train = [0.0f32, 10.0];
//! let labels = [0, 1];
//! // A chain: 6 is nearest to 10 (class 1); then 4 is nearest to 6, and 3 to 4.
//! let new = [6.0f32, 4.0, 3.0];
//! let cpu = Options { device: Device::Cpu, ..Options::default() };
//! let mut seq = Classifier::new(Params { k: 1, mode: Mode::Sequential, ..Params::default() }, &cpu)?;
//! seq.fit(MatrixRef::new("train", &train, 1)?, &labels)?;
//! assert_eq!(seq.predict(MatrixRef::new("new", &new, 1)?)?, [1, 1, 1]);
//! // In batch mode, 4 and 3 only see the labelled points: nearest is 0.
//! let mut batch = Classifier::new(Params { k: 1, ..Params::default() }, &cpu)?;
//! batch.fit(MatrixRef::new("train", &train, 1)?, &labels)?;
//! assert_eq!(batch.predict(MatrixRef::new("new", &new, 1)?)?, [1, 0, 0]);
//! # Ok::<(), knn_classify::ClassifyError>(())
//! ```

mod classifier;
mod error;
pub mod files;
mod seed_csv;
mod sequential;
mod vote;

pub use classifier::{Classifier, Mode, Params, Prediction, Stats};
pub use error::{ClassifyError, Result};
pub use seed_csv::{fill_predictions, generate_seed_csv, split_rows, write_atomically, SeedCsv};
pub use vote::Weights;

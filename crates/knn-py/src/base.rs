//! The base set the bindings search: rows kept with their dimension, metric and options.
//!
//! Until `knn::Index` lands this holds its own copy of the rows and asks a [`Knn`] per call;
//! the Python class only sees [`Base`], so moving to the index changes this file alone.

use knn::{Device, Knn, KnnError, MatrixRef, Metric, Neighbors, Options, Result, Symmetry};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

/// A validated base: `rows.len() / dim` points of dimension `dim`, row-major f32.
#[derive(Clone)]
pub struct Base {
    rows: Arc<Vec<f32>>,
    dim: usize,
    metric: Metric,
    opts: Options,
}

impl Base {
    /// Validates `rows` (finite, non-empty, the metric's domain and shape) and checks that the
    /// device of `opts` can be used.
    pub fn new(rows: Vec<f32>, dim: usize, metric: Metric, opts: Options) -> Result<Self> {
        let view = MatrixRef::new("base", &rows, dim)?;
        if view.rows() == 0 {
            return Err(KnnError::EmptyBase);
        }
        metric.check_shape(dim)?;
        metric.check_domain("base", view)?;
        with_knn(&opts, |_| Ok(()))?;
        Ok(Self {
            rows: Arc::new(rows),
            dim,
            metric,
            opts,
        })
    }

    /// Number of base points.
    pub fn len(&self) -> usize {
        self.rows.len() / self.dim
    }

    /// Dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The metric.
    pub fn metric(&self) -> &Metric {
        &self.metric
    }

    /// The device the calls run on (`Auto` resolved).
    pub fn device(&self) -> Result<Device> {
        with_knn(&self.opts, |knn| Ok(knn.device()))
    }

    /// The rows, row-major.
    pub fn rows(&self) -> &[f32] {
        &self.rows
    }

    fn view(&self) -> MatrixRef<'_> {
        // Validated when they were given (new, add).
        MatrixRef::new_unchecked_values("base", &self.rows, self.dim).expect("validated rows")
    }

    /// The k nearest base points of every query.
    pub fn search(&self, queries: MatrixRef<'_>, k: usize) -> Result<Neighbors> {
        with_knn(&self.opts, |knn| {
            knn.search(self.view(), queries, k, &self.metric)
        })
    }

    /// The kNN graph of the base (own id excluded), pairs computed once where `symmetric` says.
    pub fn graph(&self, k: usize, symmetric: Symmetry) -> Result<Neighbors> {
        let opts = Options {
            symmetric,
            ..self.opts.clone()
        };
        with_knn(&opts, |knn| knn.graph(self.view(), k, &self.metric))
    }

    /// Appends rows (validated like the base); their ids continue the base's.
    pub fn add(&mut self, rows: MatrixRef<'_>) -> Result<()> {
        if rows.dim() != self.dim {
            return Err(KnnError::Option(format!(
                "the added rows have d={}, the index has d={}",
                rows.dim(),
                self.dim
            )));
        }
        self.metric.check_domain("added rows", rows)?;
        Arc::make_mut(&mut self.rows).extend_from_slice(rows.as_slice());
        Ok(())
    }
}

thread_local! {
    /// This thread's engines, one per set of options (`Knn` is shared between threads by
    /// reference only; a CUDA engine is worth keeping between calls).
    static ENGINES: RefCell<Vec<(String, Rc<Knn>)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's engine for `opts`, made on first use.
fn with_knn<R>(opts: &Options, f: impl FnOnce(&Knn) -> Result<R>) -> Result<R> {
    let key = format!("{opts:?}");
    let found = ENGINES.with(|e| {
        e.borrow()
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, knn)| knn.clone())
    });
    let knn = match found {
        Some(knn) => knn,
        None => {
            let knn = Rc::new(Knn::new(opts)?);
            ENGINES.with(|e| e.borrow_mut().push((key, knn.clone())));
            knn
        }
    };
    f(&knn)
}

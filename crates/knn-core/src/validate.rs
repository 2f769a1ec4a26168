//! Checking the caller's arguments before any work: shapes and sizes, then values against the
//! metric's domain.

use crate::error::{KnnError, Result};
use crate::matrix::MatrixRef;
use crate::metric::Metric;

/// Checks the shapes and sizes shared by search (`queries` given) and graph (`None`): a base
/// that is not empty, k between 1 and the points available, the same dimension; returns the
/// points available to each query. The values are checked apart (see [`check_base`]).
pub fn validate(
    metric: &Metric,
    base: MatrixRef<'_>,
    queries: Option<MatrixRef<'_>>,
    k: usize,
) -> Result<usize> {
    if base.rows() == 0 {
        return Err(KnnError::EmptyBase);
    }
    if base.rows() > u32::MAX as usize {
        return Err(KnnError::TooManyPoints { n: base.rows() });
    }
    if k == 0 {
        return Err(KnnError::ZeroK);
    }
    if let Some(q) = queries {
        if q.dim() != base.dim() {
            return Err(KnnError::DimMismatch {
                base: base.dim(),
                queries: q.dim(),
            });
        }
    }
    metric.check_shape(base.dim())?;
    let available = base.rows() - usize::from(queries.is_none());
    if k > available {
        let hint = if queries.is_none() {
            format!(
                " (a graph excludes each point itself: {} points less one)",
                base.rows()
            )
        } else {
            String::new()
        };
        return Err(KnnError::KTooLarge {
            k,
            n: available,
            hint,
        });
    }
    Ok(available)
}

/// Checks the values against the metric's domain (a pass over them; see
/// [`Metric::check_domain`]).
pub(crate) fn check_domains(
    metric: &Metric,
    base: Option<MatrixRef<'_>>,
    queries: Option<MatrixRef<'_>>,
) -> Result<()> {
    if let Some(b) = base {
        metric.check_domain("base", b)?;
    }
    if let Some(q) = queries {
        metric.check_domain("queries", q)?;
    }
    Ok(())
}

/// Checks a base on its own, as a search of it would (an index's, once): at least one point,
/// at most 2³² − 1, a dimension the metric accepts, values in its domain. NaN and ±inf are
/// refused when the matrix is made ([`MatrixRef::new`]).
pub fn check_base(metric: &Metric, base: MatrixRef<'_>) -> Result<()> {
    validate(metric, base, Some(base), 1)?;
    check_domains(metric, Some(base), None)
}

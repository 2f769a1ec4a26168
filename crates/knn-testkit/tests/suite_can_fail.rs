//! The suite must catch a wrong engine: one that claims its first `width` base points are the
//! nearest, with a floor of +∞.

use knn_core::{CandidateRequest, Candidates, Engine, ExprPlan, Result};

struct Liar;

impl Engine for Liar {
    fn name(&self) -> String {
        "liar".into()
    }
    fn candidates(&self, req: &CandidateRequest<'_>) -> Result<Candidates> {
        Ok(first_width(req, |x, y| req.kernel.direct_f32(x, y)))
    }

    /// The first `width` points with their true f32 keys, claimed complete.
    fn candidates_expr(&self, req: &CandidateRequest<'_>, plan: &ExprPlan) -> Result<Candidates> {
        Ok(first_width(req, |x, y| plan.program().key_f32(x, y)))
    }
}

/// The first `width` base points of each query (its excluded point skipped) with their true keys,
/// sorted, claimed complete (floor +∞).
fn first_width(req: &CandidateRequest<'_>, key: impl Fn(&[f32], &[f32]) -> f32) -> Candidates {
    let (nq, w) = (req.queries.rows(), req.width);
    let mut ids = Vec::with_capacity(nq * w);
    let mut keys = Vec::with_capacity(nq * w);
    for i in 0..nq {
        let mut row: Vec<(f32, u32)> = (0..req.base.rows() as u32)
            .filter(|&b| req.exclude.is_none_or(|e| e[i] != b))
            .take(w)
            .map(|b| (key(req.queries.row(i), req.base.row(b as usize)), b))
            .collect();
        row.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        keys.extend(row.iter().map(|r| r.0));
        ids.extend(row.iter().map(|r| r.1));
    }
    Candidates {
        width: w,
        ids,
        keys,
        floor: vec![f32::INFINITY; nq],
        floor_bounds_rounding: false,
    }
}

#[test]
#[should_panic(expected = "cases failed on engine liar")]
fn a_lying_engine_fails_the_suite() {
    knn_testkit::check_tile_edges(&Liar, &[16]);
}

#[test]
#[should_panic(expected = "expression checks failed on engine liar")]
fn a_lying_engine_fails_the_expression_suite() {
    knn_testkit::check_expr(&Liar);
}

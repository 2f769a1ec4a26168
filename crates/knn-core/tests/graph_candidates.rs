//! The pipeline takes `Engine::graph_candidates` for whole graphs only, and its answer is the
//! graph's.

use knn_core::synth::{generate, Distribution};
use knn_core::{
    graph, graph_rows, oracle, search, CandidateRequest, Candidates, Engine, GraphRequest, Matrix,
    Metric, Result,
};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Exact f32 keys of every pair, sorted; `graph_candidates` answers all rows at once (as the
/// one-sided call with `exclude[i] = i` would) and counts its calls.
#[derive(Default)]
struct Counting {
    graph_calls: AtomicUsize,
}

impl Engine for Counting {
    fn name(&self) -> String {
        "counting".into()
    }

    fn candidates(&self, req: &CandidateRequest<'_>) -> Result<Candidates> {
        let (nq, nb, w) = (req.queries.rows(), req.base.rows(), req.width);
        let (mut ids, mut keys, mut floor) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..nq {
            let q = req.queries.row(i);
            let mut row: Vec<(f32, u32)> = (0..nb as u32)
                .filter(|&b| req.exclude.is_none_or(|e| e[i] != b))
                .map(|b| (req.kernel.exact(q, req.base.row(b as usize)) as f32, b))
                .collect();
            row.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            row.truncate(w);
            floor.push(if w >= req.available() {
                f32::INFINITY
            } else {
                row[w - 1].0.next_down().next_down()
            });
            keys.extend(row.iter().map(|r| r.0));
            ids.extend(row.iter().map(|r| r.1));
        }
        Ok(Candidates {
            width: w,
            ids,
            keys,
            floor,
            floor_bounds_rounding: true,
        })
    }

    fn graph_candidates(&self, graph: GraphRequest<'_>) -> Option<Result<Candidates>> {
        self.graph_calls.fetch_add(1, Ordering::Relaxed);
        let exclude: Vec<u32> = (0..graph.points.rows() as u32).collect();
        Some(self.candidates(&CandidateRequest {
            base: graph.points,
            queries: graph.points,
            kernel: graph.kernel,
            width: graph.width,
            exclude: Some(&exclude),
            precise: graph.precise,
            base_key: None,
            exact_data: false,
            exact_from: None,
        }))
    }
}

#[test]
fn whole_graphs_only() {
    let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
    let p = Matrix::new("p", generate(u, 300, 6, 4), 6).unwrap();
    let engine = Counting::default();
    for metric in [Metric::L2, Metric::L1, Metric::Cosine, Metric::InnerProduct] {
        let before = engine.graph_calls.load(Ordering::Relaxed);
        let g = graph(&engine, p.view(), 7, &metric).unwrap();
        assert_eq!(engine.graph_calls.load(Ordering::Relaxed), before + 1);
        assert_eq!(g.ids, oracle(p.view(), None, 7, &metric).unwrap().ids);
    }
    let calls = engine.graph_calls.load(Ordering::Relaxed);
    let piece = graph_rows(&engine, p.view(), 10..50, 7, &Metric::L2, &|_, _| {}).unwrap();
    let whole = graph(&engine, p.view(), 7, &Metric::L2).unwrap();
    assert_eq!(piece.ids, whole.ids[10 * 7..50 * 7]);
    search(&engine, p.view(), p.view(), 3, &Metric::L2).unwrap();
    assert_eq!(engine.graph_calls.load(Ordering::Relaxed), calls + 1);
}

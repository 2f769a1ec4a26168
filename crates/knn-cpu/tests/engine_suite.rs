//! The shared engine suite on the CPU engine, with 1 and 2 threads, each graph case computed
//! both one-sided and symmetrically (each unordered pair once).

use knn_core::Symmetry;
use knn_cpu::CpuEngine;
use knn_testkit as kit;

fn engines() -> Vec<CpuEngine> {
    let mut all = Vec::new();
    for symmetry in [Symmetry::Off, Symmetry::On] {
        all.extend([
            CpuEngine::new(Some(1)).unwrap().with_symmetry(symmetry),
            CpuEngine::new(Some(2)).unwrap().with_symmetry(symmetry),
            CpuEngine::new(Some(2))
                .unwrap()
                .without_int8()
                .with_symmetry(symmetry),
            CpuEngine::new(Some(2))
                .unwrap()
                .f32_only()
                .with_symmetry(symmetry),
        ]);
    }
    all
}

#[test]
fn tile_edges() {
    for e in engines() {
        kit::check_tile_edges(&e, &[16, 256, 512]);
    }
}

#[test]
fn metrics() {
    for e in engines() {
        kit::check_metrics(&e);
    }
}

#[test]
fn adversarial() {
    for e in engines() {
        kit::check_adversarial(&e);
    }
}

#[test]
fn errors() {
    kit::check_errors(&CpuEngine::default());
}

#[test]
fn expressions() {
    for e in [
        CpuEngine::new(Some(1)).unwrap(),
        CpuEngine::new(Some(2)).unwrap(),
    ] {
        kit::check_expr(&e);
    }
}

/// One engine's plans kept per base key: requests of two bases under their own keys, in turns,
/// repeated, and a request of the first base under a new key, each give the candidates a fresh
/// engine gives.
#[test]
fn kept_plans_follow_the_base_key() {
    use knn_core::synth::{generate, Distribution};
    use knn_core::{base_key, CandidateRequest, Engine, Kernel, Matrix, MatrixRef};
    fn request<'a>(
        base: MatrixRef<'a>,
        q: MatrixRef<'a>,
        key: u64,
        kernel: Kernel,
    ) -> CandidateRequest<'a> {
        CandidateRequest {
            base,
            queries: q,
            kernel,
            width: 24,
            exclude: None,
            precise: false,
            base_key: Some(key),
            exact_data: true,
            exact_from: None,
        }
    }
    let u = Distribution::Uniform { lo: -1.0, hi: 3.0 };
    let d = 40;
    let a = Matrix::new("a", generate(u, 3000, d, 1), d).unwrap();
    let b = Matrix::new("b", generate(u, 2000, d, 2), d).unwrap();
    let q = Matrix::new("q", generate(u, 70, d, 3), d).unwrap();
    for (i, engine) in engines().into_iter().enumerate() {
        let (ka, kb) = (base_key(), base_key());
        for kernel in [Kernel::SqL2, Kernel::NegDot] {
            for (base, key) in [(&a, ka), (&b, kb), (&a, ka), (&b, kb), (&a, base_key())] {
                let got = engine
                    .candidates(&request(base.view(), q.view(), key, kernel))
                    .unwrap();
                // A new engine of the same kind (a clone would share the kept plans).
                let fresh = engines().swap_remove(i);
                let want = fresh
                    .candidates(&request(base.view(), q.view(), base_key(), kernel))
                    .unwrap();
                assert_eq!(got.ids, want.ids, "{kernel:?}");
                assert_eq!(got.keys, want.keys, "{kernel:?}");
            }
        }
    }
}

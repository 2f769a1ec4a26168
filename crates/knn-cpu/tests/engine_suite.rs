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

//! The shared engine suite on the CPU engine, with 1 and 2 threads.

use knn_cpu::CpuEngine;
use knn_testkit as kit;

fn engines() -> Vec<CpuEngine> {
    vec![
        CpuEngine::new(Some(1)).unwrap(),
        CpuEngine::new(Some(2)).unwrap(),
        CpuEngine::new(Some(2)).unwrap().without_int8(),
        CpuEngine::new(Some(2)).unwrap().f32_only(),
    ]
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

//! Tests of `grid`.

use super::*;
use crate::staging::STAGE_CHUNK;

#[test]
fn geometry_follows_count_and_shape() {
    let g = geometry(&[0.0, 0.0, 0.0], &[1.0, 1.0, 1.0], 1 << 21, 2.0);
    let cells: usize = g.g.iter().map(|&x| x as usize).product();
    assert!((1 << 19..=1 << 21).contains(&cells), "{g:?}");
    // A flat box gets one cell along its flat axis and keeps lo + g·size = hi.
    let g = geometry(&[0.0, 5.0], &[4.0, 5.0], 1000, 2.0);
    assert_eq!(g.g[1], 1);
    assert!((g.lo[0] + g.g[0] as f32 * g.size[0] - 4.0).abs() < 1e-5);
    // Huge counts stay under the cell cap.
    let g = geometry(&[0.0; 3], &[1.0, 1e6, 1.0], 1 << 31, 0.5);
    assert!(g.g.iter().map(|&x| x as usize).product::<usize>() <= MAX_CELLS);
}

#[test]
fn bounding_box_folds_rows() {
    let rows: Vec<f32> = vec![1.0, -2.0, 3.0, -4.0, 5.0, 0.5];
    let b = bytes_of(&rows);
    let (lo, hi) = bbox_fold(3)(bbox_empty(), b);
    assert_eq!((lo, hi), ([-4.0, -2.0, 0.5], [1.0, 5.0, 3.0]));
    let (lo, hi) = bbox_merge(
        bbox_fold(2)(bbox_empty(), &b[..8]),
        bbox_fold(2)(bbox_empty(), &b[8..]),
    );
    assert_eq!(
        (lo[..2].to_vec(), hi[..2].to_vec()),
        (vec![1.0, -4.0], vec![5.0, 0.5])
    );
    // Chunks and pieces hold whole rows for d = 1, 2, 3.
    for d in 1..=3 {
        assert_eq!(STAGE_CHUNK % (4 * d), 0);
        assert_eq!(PIECE % (4 * d), 0);
        assert_eq!(STAGE_CHUNK % PIECE, 0);
    }
}

//! HDF5: the ann-benchmarks layout and what other writers do, from files h5py wrote
//! (`tests/data/make_hdf5.py` makes them); errors name the file and the dataset.

mod common;

use std::path::{Path, PathBuf};

use common::assert_err;
use knn_io::hdf5::{self, Hdf5Path};
use knn_io::{read_f32, read_f32_with, read_i64, read_i64_with, ReadOptions};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn named(file: &str, dataset: &str) -> PathBuf {
    PathBuf::from(format!("{}:{dataset}", data(file).display()))
}

fn with_dataset(dataset: &str) -> ReadOptions {
    ReadOptions {
        dataset: Some(dataset.to_owned()),
        ..ReadOptions::default()
    }
}

#[test]
fn ann_benchmarks_layout() {
    let f = data("ann.hdf5");
    let train = read_f32_with(&f, &with_dataset("train")).unwrap();
    let test = read_f32_with(&f, &with_dataset("test")).unwrap();
    assert_eq!((train.rows, train.cols), (300, 8));
    assert_eq!((test.rows, test.cols), (25, 8));
    assert!(train
        .data
        .iter()
        .all(|v| v.fract() == 0.0 && (0.0..256.0).contains(v)));
    let ids = read_i64_with(&f, &with_dataset("neighbors")).unwrap();
    assert_eq!((ids.rows, ids.cols), (25, 10));
    let dist = read_f32_with(&f, &with_dataset("distances")).unwrap();
    assert_eq!((dist.rows, dist.cols), (25, 10));
    // The stored neighbours are the true ones: check the first query's nearest by hand.
    let q = test.row(0);
    let d = |i: usize| -> f64 {
        let b = train.row(i);
        q.iter()
            .zip(b)
            .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let best = (0..train.rows)
        .min_by(|&a, &b| d(a).total_cmp(&d(b)).then(a.cmp(&b)))
        .unwrap();
    assert_eq!(ids.row(0)[0], best as i64);
    assert!((f64::from(dist.row(0)[0]) - d(best)).abs() < 1e-4);
    assert_eq!(
        hdf5::file_attribute(&f, "distance").unwrap().as_deref(),
        Some("euclidean")
    );
    assert_eq!(hdf5::file_attribute(&f, "nothing").unwrap(), None);
    assert!(hdf5::has_dataset(&f, "neighbors").unwrap());
    assert!(!hdf5::has_dataset(&f, "gt").unwrap());
}

#[test]
fn a_dataset_named_after_the_file_wins() {
    let f = named("ann.hdf5", "test");
    assert_eq!(
        hdf5::parse(&f),
        Some(Hdf5Path {
            file: data("ann.hdf5"),
            dataset: Some("test".into())
        })
    );
    // The name after ':' beats the caller's default.
    let t = read_f32_with(&f, &with_dataset("train")).unwrap();
    assert_eq!(t.rows, 25);
    assert_eq!(read_f32(&f, None).unwrap().rows, 25);
}

#[test]
fn chunked_compressed_and_other_types() {
    let f = data("angular.hdf5");
    // float64, chunked, deflate + shuffle.
    let train = read_f32_with(&f, &with_dataset("train")).unwrap();
    assert_eq!((train.rows, train.cols), (120, 6));
    // Chunks that do not divide the shape (9 x 6 in chunks of 4 x 3).
    let test = read_f32(&named("angular.hdf5", "test"), None).unwrap();
    assert_eq!((test.rows, test.cols), (9, 6));
    // int64, compressed.
    let ids = read_i64(&named("angular.hdf5", "neighbors"), None).unwrap();
    assert_eq!((ids.rows, ids.cols), (9, 5));
    assert!(ids.data.iter().all(|&i| (0..120).contains(&i)));
    // A big-endian int16 in a group.
    let t = read_i64(&named("angular.hdf5", "grp/ids"), None).unwrap();
    assert_eq!(t.data, (0..12).collect::<Vec<i64>>());
    assert_eq!(
        read_f32(&named("angular.hdf5", "grp/ids"), None)
            .unwrap()
            .data[11],
        11.0
    );
    // float16.
    let t = read_f32(&named("angular.hdf5", "half"), None).unwrap();
    assert_eq!(t.data, [0.5, 1.5, 2.0, -3.0]);
    // A fixed-length string attribute.
    assert_eq!(
        hdf5::file_attribute(&f, "distance").unwrap().as_deref(),
        Some("angular")
    );
}

#[test]
fn newest_file_format() {
    let f = data("latest.hdf5");
    let t = read_f32_with(&f, &with_dataset("train")).unwrap();
    assert_eq!((t.rows, t.cols), (120, 6));
    let same = read_f32_with(&data("angular.hdf5"), &with_dataset("train")).unwrap();
    // The same values (stored as float32 here, float64 there).
    assert_eq!(t.data, same.data);
    assert_eq!(hdf5::file_attribute(&f, "distance").unwrap(), None);
}

#[test]
fn errors_name_the_file_and_the_dataset() {
    let f = data("ann.hdf5");
    let name = f.display().to_string();
    assert_err(
        read_f32_with(&f, &with_dataset("queries")),
        &[
            &format!("{name}: no dataset 'queries'"),
            "distances, neighbors, test, train",
            ":NAME",
        ],
    );
    // Several datasets and none named: which one?
    assert_err(read_f32(&f, None), &["which dataset?", "train"]);
    // Ids must be integers.
    assert_err(
        read_i64_with(&f, &with_dataset("train")),
        &["dataset 'train': holds floating-point values"],
    );
    let a = data("angular.hdf5");
    assert_err(
        read_f32(&named("angular.hdf5", "cube"), None),
        &["dataset 'cube': has 3 dimensions"],
    );
    assert_err(
        read_f32(&named("angular.hdf5", "names"), None),
        &["dataset 'names': holds text, not numbers"],
    );
    assert_err(
        read_f32(&named("angular.hdf5", "grp"), None),
        &[&a.display().to_string(), "'grp'"],
    );
    // Not an HDF5 file at all.
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("fake.hdf5");
    std::fs::write(&fake, b"1,2,3\n").unwrap();
    assert_err(read_f32(&fake, None), &["fake.hdf5: not an HDF5 file"]);
    let missing = dir.path().join("missing.h5");
    assert_err(read_f32(&missing, None), &["missing.h5"]);
}

#[test]
fn found_by_its_signature_under_any_name() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("vectors.data");
    std::fs::copy(data("ann.hdf5"), &odd).unwrap();
    assert!(hdf5::is_hdf5(&odd));
    let t = read_f32_with(&odd, &with_dataset("test")).unwrap();
    assert_eq!(t.rows, 25);
}

#[test]
fn bytes_readers_match_path_readers() {
    let bytes = std::fs::read(data("angular.hdf5")).unwrap();
    let a = hdf5::read_f32_from_bytes(&bytes, Some("train"), "mem.hdf5").unwrap();
    let b = read_f32_with(&data("angular.hdf5"), &with_dataset("train")).unwrap();
    assert_eq!(a, b);
    let ids = hdf5::read_i64_from_bytes(&bytes, Some("neighbors"), "mem.hdf5").unwrap();
    assert_eq!(ids.cols, 5);
    assert_err(
        hdf5::read_f32_from_bytes(&bytes[..100], Some("train"), "mem.hdf5"),
        &["mem.hdf5: "],
    );
}

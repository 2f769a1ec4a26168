//! Paths: format detection, file errors, and atomic replacement of outputs.

mod common;

use std::path::Path;

use common::assert_err;
use knn_io::{read_f32, read_i64, write_f32, write_i64, Format, IoError, Table};

#[test]
fn format_from_extension() {
    for (name, want) in [
        ("a.fvecs", Format::Fvecs),
        ("dir.x/b.IVECS", Format::Ivecs),
        ("c.bvecs", Format::Bvecs),
        ("d.npy", Format::Npy),
        ("e.csv", Format::Csv),
        ("f.txt", Format::Csv),
    ] {
        assert_eq!(Format::from_path(Path::new(name)).unwrap(), want, "{name}");
    }
    for name in ["a.dat", "noext", "x.npy.gz", "dir.fvecs/x"] {
        let e = Format::from_path(Path::new(name)).unwrap_err();
        assert!(matches!(e, IoError::UnknownFormat { .. }), "{name}");
        let msg = e.to_string();
        assert!(msg.starts_with(name), "{msg}");
        assert!(msg.contains("name the format"), "{msg}");
    }
}

#[test]
fn format_from_str() {
    for f in Format::ALL {
        assert_eq!(f.to_string().parse::<Format>().unwrap(), f);
        assert_eq!(f.name().to_uppercase().parse::<Format>().unwrap(), f);
    }
    let e = "parquet".parse::<Format>().unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown format 'parquet' (expected one of: fvecs, ivecs, bvecs, npy, csv)"
    );
    let e = "HDF5".parse::<Format>().unwrap_err().to_string();
    assert!(e.contains("an HDF5 input needs no format"), "{e}");
}

#[test]
fn explicit_format_overrides_the_extension() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vectors.bin");
    let t = Table {
        data: vec![1.0f32, 2.0, 3.0, 4.0],
        rows: 2,
        cols: 2,
    };
    assert_err(
        write_f32(&path, None, &t),
        &["vectors.bin: cannot tell the format"],
    );
    write_f32(&path, Some(Format::Fvecs), &t).unwrap();
    assert_eq!(read_f32(&path, Some(Format::Fvecs)).unwrap(), t);
    assert_err(read_f32(&path, None), &["vectors.bin"]);
}

#[test]
fn missing_files_and_directories() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.fvecs");
    let e = read_f32(&missing, None).unwrap_err();
    assert!(matches!(e, IoError::Io { .. }));
    assert!(e.to_string().starts_with(&missing.display().to_string()));
    assert_eq!(e.file(), missing.display().to_string());

    let sub = dir.path().join("sub.npy");
    std::fs::create_dir(&sub).unwrap();
    assert_err(read_i64(&sub, None), &["sub.npy: is a directory"]);

    let t = Table {
        data: vec![1i64],
        rows: 1,
        cols: 1,
    };
    let nodir = dir.path().join("no/such/dir/out.ivecs");
    assert_err(
        write_i64(&nodir, None, &t),
        &["out.ivecs", "the folder", "does not exist"],
    );
}

/// The files in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn writes_replace_atomically_and_leave_no_temporary_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.npy");
    let first = Table {
        data: vec![1.0f32; 6],
        rows: 2,
        cols: 3,
    };
    write_f32(&path, None, &first).unwrap();
    let second = Table {
        data: vec![2.0f32; 4],
        rows: 4,
        cols: 1,
    };
    write_f32(&path, None, &second).unwrap();
    assert_eq!(read_f32(&path, None).unwrap(), second);
    assert_eq!(listing(dir.path()), ["out.npy"]);

    // A failed write (here: the target is a directory, so the final rename fails) removes its
    // temporary file and leaves the directory as it was.
    let target = dir.path().join("taken.csv");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("keep"), b"x").unwrap();
    let e = write_f32(&target, None, &first).unwrap_err();
    assert!(
        e.to_string().starts_with(&target.display().to_string()),
        "{e}"
    );
    assert_eq!(listing(dir.path()), ["out.npy", "taken.csv"]);
    assert_eq!(listing(&target), ["keep"]);

    // A write refused before it starts keeps the existing file untouched.
    let ids = dir.path().join("ids.ivecs");
    let good = Table {
        data: vec![1i64, 2],
        rows: 1,
        cols: 2,
    };
    write_i64(&ids, None, &good).unwrap();
    let before = std::fs::read(&ids).unwrap();
    let bad = Table {
        data: vec![1i64, i64::MAX],
        rows: 1,
        cols: 2,
    };
    assert_err(write_i64(&ids, None, &bad), &["does not fit in i32"]);
    assert_eq!(std::fs::read(&ids).unwrap(), before);
}

#[test]
fn inconsistent_tables_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = Table {
        data: vec![1.0f32; 5],
        rows: 2,
        cols: 3,
    };
    assert!(!t.is_consistent());
    for name in ["a.fvecs", "a.npy", "a.csv"] {
        assert_err(
            write_f32(&dir.path().join(name), None, &t),
            &[name, "cannot write a table of 2 x 3 with 5 values"],
        );
    }
    assert!(listing(dir.path()).is_empty());
}

#[test]
fn every_format_round_trips_through_files() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, cols) = (37, 5);
    let floats: Vec<f32> = (0..rows * cols).map(|k| k as f32 * 0.37 - 20.0).collect();
    let ints: Vec<i64> = (0..rows * cols).map(|k| k as i64 * 7919 - 500).collect();
    let ft = Table {
        data: floats,
        rows,
        cols,
    };
    let it = Table {
        data: ints,
        rows,
        cols,
    };
    for f in [Format::Fvecs, Format::Npy, Format::Csv] {
        let path = dir.path().join(format!("f.{f}"));
        write_f32(&path, None, &ft).unwrap();
        assert_eq!(read_f32(&path, None).unwrap(), ft, "{f}");
    }
    for f in [Format::Ivecs, Format::Npy, Format::Csv] {
        let path = dir.path().join(format!("i.{f}"));
        write_i64(&path, None, &it).unwrap();
        assert_eq!(read_i64(&path, None).unwrap(), it, "{f}");
        let as_f32 = read_f32(&path, None).unwrap();
        let want: Vec<f32> = it.data.iter().map(|&v| v as f32).collect();
        assert_eq!(as_f32.data, want, "{f}");
    }
}

#[test]
fn a_large_table_round_trips() {
    // 200k x 16 values (12.8 MB as fvecs), enough to cross every buffer boundary.
    let dir = tempfile::tempdir().unwrap();
    let (rows, cols) = (200_000, 16);
    let t = Table {
        data: (0..rows * cols).map(|k| (k % 1_000_003) as f32).collect(),
        rows,
        cols,
    };
    for f in [Format::Fvecs, Format::Npy] {
        let path = dir.path().join(format!("big.{f}"));
        write_f32(&path, None, &t).unwrap();
        assert_eq!(read_f32(&path, None).unwrap(), t, "{f}");
    }
}

//! Writing never destroys what it should not: symbolic links stay links, devices and pipes are
//! written through, folders and missing folders are named.

use knn_io::{output_target, write_i64, write_i64_to, Format, OutputTarget, Table};
use std::path::Path;

fn table() -> Table<i64> {
    Table {
        data: vec![1, 2, 3, 4],
        rows: 2,
        cols: 2,
    }
}

#[test]
fn a_symlink_to_a_file_keeps_the_link_and_replaces_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.csv");
    std::fs::write(&real, "old\n").unwrap();
    let link = dir.path().join("link.csv");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert_eq!(
        output_target(&link).unwrap(),
        OutputTarget::Replace(std::fs::canonicalize(&real).unwrap())
    );
    write_i64(&link, None, &table()).unwrap();
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_to_string(&real).unwrap(), "1,2\n3,4\n");
}

#[test]
fn devices_pipes_and_descriptors_are_written_through() {
    assert_eq!(
        output_target(Path::new("/dev/null")).unwrap(),
        OutputTarget::Stream
    );
    write_i64(Path::new("/dev/null"), Some(Format::Csv), &table()).unwrap();
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    if Path::new("/proc/self/fd").exists() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("out");
        std::os::unix::fs::symlink("/proc/self/fd/2", &link).unwrap();
        assert_eq!(output_target(&link).unwrap(), OutputTarget::Stream);
    }
    // A FIFO: a reader on the other end gets the bytes, the FIFO stays a FIFO.
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
        };
        write_i64(&fifo, Some(Format::Csv), &table()).unwrap();
        assert_eq!(reader.join().unwrap(), "1,2\n3,4\n");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    }
}

#[test]
fn folders_and_missing_folders_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let e = write_i64(dir.path(), Some(Format::Npy), &table()).unwrap_err();
    assert!(
        e.to_string().contains("is a folder; name a file in it"),
        "{e}"
    );
    let missing = dir.path().join("no/such/out.npy");
    let e = write_i64(&missing, None, &table()).unwrap_err();
    let want = format!(
        "the folder {} does not exist",
        dir.path().join("no/such").display()
    );
    assert!(e.to_string().contains(&want), "{e}");
    let dangling = dir.path().join("dangling.npy");
    std::os::unix::fs::symlink(dir.path().join("nowhere.npy"), &dangling).unwrap();
    let e = write_i64(&dangling, None, &table()).unwrap_err();
    assert!(e.to_string().contains("which does not exist"), "{e}");
    assert!(std::fs::symlink_metadata(&dangling).is_ok());
}

#[test]
fn stream_writers_give_the_bytes_of_the_files() {
    let dir = tempfile::tempdir().unwrap();
    for format in [Format::Npy, Format::Csv, Format::Ivecs] {
        let path = dir.path().join(format!("t.{format}"));
        write_i64(&path, None, &table()).unwrap();
        let mut bytes = Vec::new();
        write_i64_to(&mut bytes, format, &table(), "stdout").unwrap();
        assert_eq!(bytes, std::fs::read(&path).unwrap(), "{format}");
    }
}

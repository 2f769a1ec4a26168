//! `--checkpoint FILE`: long searches and graphs in pieces that survive interruption.
//!
//! Rows are computed in chunks; after each chunk its ids and distances are appended to the
//! checkpoint file and flushed. Rerunning the same command reads the finished chunks back and
//! goes on from there: rows do not depend on how the work was cut (every row is exact and
//! ordered by (distance, id)), so a resumed run gives the uninterrupted run's result. Ctrl-C
//! stops after the chunk in progress, with everything before it saved (a second Ctrl-C exits at
//! once; a chunk cut short is dropped on resume).
//!
//! File: `KNNCKPT1`, then the run's fingerprint, row count and k (u64 little-endian each), then
//! records `start, end` (u64) followed by `(end − start)·k` ids (u32) and as many distances
//! (f32, or f64 for a run on float64 inputs: the distances it writes). The fingerprint covers
//! the command, k, the metric, the precision of a float64 run and each input file's path, size
//! and modification time: a checkpoint of other arguments or changed inputs is refused.

use crate::output::Distance;
use anyhow::{bail, Context, Result};
use knn::Neighbors;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const MAGIC: &[u8; 8] = b"KNNCKPT1";
const HEADER: u64 = 32;

/// Set by Ctrl-C: stop after the chunk in progress.
static STOP: AtomicBool = AtomicBool::new(false);
static PRESSES: AtomicUsize = AtomicUsize::new(0);

/// Installs the Ctrl-C handler (once per process).
fn install_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = ctrlc::set_handler(|| {
            if PRESSES.fetch_add(1, Ordering::SeqCst) > 0 {
                eprintln!("\ninterrupted again: stopping now (the checkpoint holds every finished chunk)");
                std::process::exit(130);
            }
            eprintln!("\ninterrupted: finishing the chunk in progress, then saving (Ctrl-C again to stop now)");
            STOP.store(true, Ordering::SeqCst);
        });
    });
}

/// A fingerprint of what determines the result: command, k, metric, inputs (path, size, mtime).
pub fn fingerprint(command: &str, k: usize, metric: &str, inputs: &[&Path]) -> Result<u64> {
    let mut parts: Vec<String> = vec![command.into(), k.to_string(), metric.into()];
    for p in inputs {
        // `data.hdf5:test` names a dataset of the file `data.hdf5`.
        let (p, dataset) = match knn_io::hdf5::parse(p) {
            Some(h) => (h.file, h.dataset.unwrap_or_default()),
            None => (p.to_path_buf(), String::new()),
        };
        let p = p.as_path();
        let meta = std::fs::metadata(p).with_context(|| format!("reading {}", p.display()))?;
        let canon = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        parts.push(format!(
            "{}{dataset}|{}|{}",
            canon.display(),
            meta.len(),
            mtime
        ));
    }
    // FNV-1a over the parts: stable across runs and machines.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in &parts {
        for b in p.bytes().chain([0xff]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x1000_0000_01b3);
        }
    }
    Ok(h)
}

/// Rows computed in chunks, saved to and resumed from a checkpoint file.
pub struct Checkpointed<D: Distance> {
    path: PathBuf,
    file: File,
    out: Neighbors<D>,
    done: usize,
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

impl<D: Distance> Checkpointed<D> {
    /// Opens `path`, resuming its finished rows when it was made for the same `fingerprint`,
    /// or starts it anew when it does not exist.
    pub fn open(path: &Path, fingerprint: u64, rows: usize, k: usize) -> Result<Self> {
        let name = path.display();
        let mut out = Neighbors {
            k,
            ids: vec![0; rows * k],
            distances: vec![D::UNWRITTEN; rows * k],
        };
        let mut done = 0usize;
        let exists = path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("opening checkpoint {name}"))?;
        let mut header = [0u8; HEADER as usize];
        let len = file.metadata()?.len();
        if exists && len > 0 {
            file.read_exact(&mut header).with_context(|| {
                format!("{name}: not a knn checkpoint (shorter than its header)")
            })?;
            if &header[..8] != MAGIC {
                bail!("{name}: not a knn checkpoint; refusing to overwrite it (choose another --checkpoint file)");
            }
            let (f, r, kk) = (u64_at(&header, 8), u64_at(&header, 16), u64_at(&header, 24));
            if f != fingerprint || r != rows as u64 || kk != k as u64 {
                bail!(
                    "{name}: this checkpoint was made for other arguments or inputs (or the inputs changed since); remove it to start over"
                );
            }
            // Finished records, in order; a record cut short by a kill is dropped.
            let mut reader = BufReader::new(&mut file);
            let mut pos = HEADER;
            loop {
                let mut se = [0u8; 16];
                if reader.read_exact(&mut se).is_err() {
                    break;
                }
                let (start, end) = (u64_at(&se, 0) as usize, u64_at(&se, 8) as usize);
                if start != done || end <= start || end > rows {
                    bail!("{name}: damaged checkpoint (record for rows {start}..{end} after {done} finished rows); remove it to start over");
                }
                let n = (end - start) * k;
                let mut ids = vec![0u8; n * 4];
                let mut dists = vec![0u8; n * D::BYTES];
                if reader.read_exact(&mut ids).is_err() || reader.read_exact(&mut dists).is_err() {
                    break;
                }
                for (j, c) in ids.chunks_exact(4).enumerate() {
                    out.ids[start * k + j] = u32::from_le_bytes(c.try_into().expect("4"));
                }
                for (j, c) in dists.chunks_exact(D::BYTES).enumerate() {
                    out.distances[start * k + j] = D::get(c);
                }
                done = end;
                pos += 16 + ((4 + D::BYTES) * n) as u64;
            }
            drop(reader);
            file.set_len(pos)?;
            file.seek(SeekFrom::Start(pos))?;
        } else {
            header[..8].copy_from_slice(MAGIC);
            header[8..16].copy_from_slice(&fingerprint.to_le_bytes());
            header[16..24].copy_from_slice(&(rows as u64).to_le_bytes());
            header[24..32].copy_from_slice(&(k as u64).to_le_bytes());
            file.write_all(&header)?;
            file.sync_data()?;
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            out,
            done,
        })
    }

    /// Rows already finished (from an earlier run).
    pub fn done(&self) -> usize {
        self.done
    }

    /// Computes the remaining rows in chunks with `rows_of(range)`, saving each chunk.
    /// Returns `None` when stopped by Ctrl-C (everything finished is saved), or, as if it had
    /// come, after `stop_after` chunks (a test hook: `--checkpoint-stop-after`).
    pub fn run(
        mut self,
        chunk: usize,
        stop_after: Option<usize>,
        mut rows_of: impl FnMut(std::ops::Range<usize>) -> knn::Result<Neighbors<D>>,
    ) -> Result<Option<Neighbors<D>>> {
        install_handler();
        let rows = self.out.rows();
        let k = self.out.k;
        let mut chunks = 0;
        while self.done < rows {
            if STOP.load(Ordering::SeqCst) || stop_after.is_some_and(|n| chunks >= n) {
                eprintln!(
                    "stopped: {} of {rows} rows saved in {}; run the same command again to resume",
                    self.done,
                    self.path.display()
                );
                return Ok(None);
            }
            let (start, end) = (self.done, (self.done + chunk).min(rows));
            let part = rows_of(start..end)?;
            let mut rec = Vec::with_capacity(16 + part.ids.len() * (4 + D::BYTES));
            rec.extend_from_slice(&(start as u64).to_le_bytes());
            rec.extend_from_slice(&(end as u64).to_le_bytes());
            part.ids
                .iter()
                .for_each(|v| rec.extend_from_slice(&v.to_le_bytes()));
            part.distances.iter().for_each(|v| v.put(&mut rec));
            self.file
                .write_all(&rec)
                .and_then(|_| self.file.sync_data())
                .with_context(|| format!("writing checkpoint {}", self.path.display()))?;
            self.out.ids[start * k..end * k].copy_from_slice(&part.ids);
            self.out.distances[start * k..end * k].copy_from_slice(&part.distances);
            self.done = end;
            chunks += 1;
        }
        Ok(Some(self.out))
    }
}

/// Removes the checkpoint file (after the results were written).
pub fn remove(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// Rows per chunk: about 1/64 of the work, at least 4096 rows.
pub fn chunk_rows(rows: usize) -> usize {
    rows.div_ceil(64).max(4096)
}

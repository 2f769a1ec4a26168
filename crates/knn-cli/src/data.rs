//! Reading inputs, writing results, and `knn generate`.

use crate::args::GenerateArgs;
use anyhow::{bail, Result};
use knn::synth::{generate as synth, Distribution};
use knn::{Matrix, MatrixRef};
use knn_io::{Format, Table};
use std::path::Path;
use std::process::ExitCode;

pub fn parse_format(s: &Option<String>) -> Result<Option<Format>> {
    s.as_deref()
        .map(|f| f.parse::<Format>().map_err(|e| anyhow::anyhow!("{e}")))
        .transpose()
}

/// Points to search: a float32 `.npy` used in place from a memory map (no copy; pages the
/// system may drop and re-read, so inputs larger than memory work), an fvecs/ivecs/bvecs file
/// too large for memory converted once into a mapped temporary file (see [`spill`]), or a
/// matrix read from any other file. Validated either way (NaN/inf named by file, row, column).
pub enum Points {
    /// Read (and converted) into memory.
    Owned(Matrix),
    /// Mapped in place, or a mapped temporary float32 copy.
    Mapped(knn_io::MappedF32),
}

impl Points {
    /// The matrix (already validated when loaded).
    pub fn view(&self) -> MatrixRef<'_> {
        match self {
            Points::Owned(m) => m.view(),
            Points::Mapped(m) => MatrixRef::new_unchecked_values("points", m.values(), m.cols())
                .expect("shape checked when mapped"),
        }
    }
    /// Rows.
    pub fn rows(&self) -> usize {
        self.view().rows()
    }
    /// Dimension.
    pub fn dim(&self) -> usize {
        self.view().dim()
    }
}

/// Loads points for search and graph: float32 `.npy` files are mapped in place, record files
/// too large for memory go through a mapped temporary copy, others are read.
pub fn load_points(path: &Path, format: Option<Format>) -> Result<Points> {
    let mapped = match knn_io::map_f32(path, format)? {
        Some(m) => Some(m),
        None if spill(path, format) => knn_io::spill_f32(path, format, &std::env::temp_dir())?,
        None => None,
    };
    if let Some(m) = mapped {
        let name = path.display().to_string();
        MatrixRef::new(&name, m.values(), m.cols())?; // NaN/inf named by row and column
        return Ok(Points::Mapped(m));
    }
    load_matrix(path, format).map(Points::Owned)
}

/// Whether an fvecs/ivecs/bvecs file is read through a temporary float32 copy on disk (in the
/// system's temporary folder, `TMPDIR`) instead of into memory: when its values as float32
/// would take more than half of the memory available (`MemAvailable`). `KNN_SPILL=always` or
/// `never` decides instead.
fn spill(path: &Path, format: Option<Format>) -> bool {
    let kind = format.or_else(|| Format::from_path(path).ok());
    let widen = match kind {
        Some(Format::Fvecs | Format::Ivecs) => 1,
        Some(Format::Bvecs) => 4,
        _ => return false,
    };
    match std::env::var("KNN_SPILL").as_deref() {
        Ok("always") => return true,
        Ok("never") => return false,
        _ => {}
    }
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    available_memory().is_some_and(|avail| size.saturating_mul(widen) > avail / 2)
}

/// `MemAvailable` of `/proc/meminfo`, in bytes (None elsewhere).
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Reads a matrix of points into memory, validated (NaN/inf named by file, row, column).
pub fn load_matrix(path: &Path, format: Option<Format>) -> Result<Matrix> {
    let t = knn_io::read_f32(path, format)?;
    let name = path.display().to_string();
    if t.rows == 0 {
        bail!("{name}: no points in the file");
    }
    Ok(Matrix::new(&name, t.data, t.cols)?)
}

/// Output checks live with the writers (`crate::output`).
pub use crate::output::check_output;

/// `knn generate`.
pub fn generate(a: &GenerateArgs, quiet: bool) -> Result<ExitCode> {
    let dist: Distribution = a.distribution.parse().map_err(anyhow::Error::msg)?;
    if a.dim == 0 {
        bail!("--dim must be at least 1");
    }
    let format = match parse_format(&a.format)? {
        Some(f) => f,
        None => Format::from_path(&a.output)?,
    };
    check_output(&a.output, a.force, &[])?;
    if let Some(classes) = a.classes {
        return generate_seed_csv(a, format, classes, quiet);
    }
    let t = Table {
        data: synth(dist, a.rows, a.dim, a.seed),
        rows: a.rows,
        cols: a.dim,
    };
    knn_io::write_f32(&a.output, Some(format), &t)?;
    if !quiet {
        eprintln!(
            "generate: {} {} points of dimension {} (seed {}) written to {}",
            a.rows,
            a.distribution,
            a.dim,
            a.seed,
            a.output.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `knn generate --classes C`: seed 003's CSV.
fn generate_seed_csv(
    a: &GenerateArgs,
    format: Format,
    classes: usize,
    quiet: bool,
) -> Result<ExitCode> {
    if format != Format::Csv {
        bail!(
            "{}: --classes writes seed 003's CSV format; name a .csv output",
            a.output.display()
        );
    }
    let (numels, newels) = knn_classify::split_rows(a.rows, a.new_share)?;
    let csv = knn_classify::generate_seed_csv(numels, newels, classes, a.dim, a.seed)?;
    csv.write(&a.output)?;
    if !quiet {
        eprintln!(
            "generate: seed-003 CSV with {numels} labelled and {newels} new points of dimension {}, {classes} classes (seed {}) written to {}",
            a.dim,
            a.seed,
            a.output.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

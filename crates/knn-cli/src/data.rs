//! Reading inputs, writing results, and `knn generate`.

use crate::args::{GenerateArgs, TextArgs};
use anyhow::{bail, Context, Result};
use knn::synth::{generate as synth, Distribution};
use knn::{Matrix, MatrixRef};
use knn_io::{CsvOptions, Delimiter, Format, Header, ReadOptions, Table};
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
    /// The rows for a [`knn::Index`]: moved, or shared in place (a memory map).
    pub fn into_rows(self) -> knn::Rows {
        match self {
            Points::Owned(m) => knn::Rows::from(m),
            Points::Mapped(m) => knn::Rows::Shared(std::sync::Arc::new(SharedMap(m))),
        }
    }
}

/// A memory-mapped float32 matrix as the rows of an index.
struct SharedMap(knn_io::MappedF32);

impl AsRef<[f32]> for SharedMap {
    fn as_ref(&self) -> &[f32] {
        self.0.values()
    }
}

/// Points in the precision their file holds: float32 (and everything that converts to it
/// exactly), or float64 (float64 `.npy` and HDF5 data, decimal text), kept exact.
pub enum Data {
    /// float32 points.
    F32(Points),
    /// float64 points, row-major, validated (finite, within the float32 range).
    F64 { values: Vec<f64>, dim: usize },
}

impl Data {
    /// Rows.
    pub fn rows(&self) -> usize {
        match self {
            Data::F32(p) => p.rows(),
            Data::F64 { values, dim } => values.len() / dim,
        }
    }
    /// Dimension.
    pub fn dim(&self) -> usize {
        match self {
            Data::F32(p) => p.dim(),
            Data::F64 { dim, .. } => *dim,
        }
    }
    /// Whether the values are float64.
    pub fn is_f64(&self) -> bool {
        matches!(self, Data::F64 { .. })
    }
    /// The values as the library takes them (`knn::given`).
    pub fn given(&self) -> knn::given::Given<'_> {
        match self {
            Data::F32(p) => knn::given::Given::F32(p.view().as_slice()),
            Data::F64 { values, .. } => knn::given::Given::F64(values),
        }
    }
    /// The rows for a [`knn::Index`], in their precision (float32 ones moved or shared in
    /// place).
    pub fn into_rows(self) -> knn::Rows {
        match self {
            Data::F32(points) => points.into_rows(),
            Data::F64 { values, .. } => knn::Rows::OwnedF64(values),
        }
    }
    /// The values in f64 (float32 ones widened exactly).
    pub fn to_f64(&self) -> std::borrow::Cow<'_, [f64]> {
        match self {
            Data::F32(p) => p.view().as_slice().iter().map(|&v| f64::from(v)).collect(),
            Data::F64 { values, .. } => std::borrow::Cow::Borrowed(values),
        }
    }
}

/// Points of `name` from a table read in the precision of its file: float64 values are kept
/// (validated as the engines validate them: NaN, infinities and values beyond the float32
/// range named by row and column), float32 ones validated into a matrix.
pub fn data_from(values: knn_io::Values, name: &str) -> Result<Data> {
    if values.rows() == 0 {
        bail!("{name}: no points in the file");
    }
    match values {
        knn_io::Values::F32(t) => Ok(Data::F32(Points::Owned(Matrix::new(name, t.data, t.cols)?))),
        knn_io::Values::F64(t) => {
            knn::given::round_to_f32(name, &t.data, t.cols)?;
            Ok(Data::F64 {
                values: t.data,
                dim: t.cols,
            })
        }
    }
}

/// Loads points for search, graph and verify in the precision of their file (see [`Data`]);
/// `float32`: every file as float32 (its float32 rounding), as [`load_points`] reads it.
pub fn load_data(path: &Path, options: &ReadOptions, float32: bool) -> Result<Data> {
    if float32 {
        return load_points(path, options).map(Data::F32);
    }
    if let Some(points) = mapped_points(path, options)? {
        return Ok(Data::F32(points));
    }
    let values = knn_io::read_values_with(path, options)?;
    data_from(values, &path.display().to_string())
}

/// Loads points for search and graph: float32 `.npy` files are mapped in place, record files
/// too large for memory go through a mapped temporary copy, others are read.
pub fn load_points(path: &Path, options: &ReadOptions) -> Result<Points> {
    match mapped_points(path, options)? {
        Some(points) => Ok(points),
        None => load_matrix_with(path, options).map(Points::Owned),
    }
}

/// A float32 `.npy` file mapped in place, or a record file too large for memory through a
/// mapped temporary copy; `None` for other files.
fn mapped_points(path: &Path, options: &ReadOptions) -> Result<Option<Points>> {
    let format = options.format;
    let mapped = match knn_io::map_f32(path, format)? {
        Some(m) => Some(m),
        None if spill(path, format) => knn_io::spill_f32(path, format, &std::env::temp_dir())?,
        None => None,
    };
    let Some(m) = mapped else {
        return Ok(None);
    };
    let name = path.display().to_string();
    MatrixRef::new(&name, m.values(), m.cols())?; // NaN/inf named by row and column
    Ok(Some(Points::Mapped(m)))
}

/// What the command line says about reading the points of `role` (an HDF5 file's dataset:
/// `train` for base points, `test` for queries): the format (`None`: from the name), the
/// text flags, and NaN or infinities refused where they are (line and column in text files).
pub fn input_options(
    format: &Option<String>,
    text: &TextArgs,
    dataset: Option<&str>,
) -> Result<ReadOptions> {
    let header = match (text.header, text.no_header) {
        (true, _) => Header::Present,
        (_, true) => Header::Absent,
        _ => Header::Auto,
    };
    let delimiter = text
        .delimiter
        .as_deref()
        .map(|d| {
            d.parse::<Delimiter>()
                .map_err(|e| anyhow::anyhow!("--delimiter: {e}"))
        })
        .transpose()?;
    Ok(ReadOptions {
        format: parse_format(format)?,
        csv: CsvOptions {
            header,
            delimiter,
            finite_only: true,
        },
        dataset: dataset.map(str::to_owned),
    })
}

/// The HDF5 dataset base points are read from when the file name names none (ann-benchmarks).
pub const BASE_DATASET: &str = "train";
/// The HDF5 dataset queries are read from when the file name names none (ann-benchmarks).
pub const QUERY_DATASET: &str = "test";

/// The metric the `distance` attribute of the HDF5 files among `inputs` names, for when
/// neither `-m` nor `--metric-expr` is given (ann-benchmarks: `euclidean`, `angular`).
pub fn metric_of_inputs(inputs: &[&Path]) -> Result<Option<String>> {
    let mut found: Option<(String, String)> = None;
    for input in inputs {
        let Some(h) = knn_io::hdf5::parse(input) else {
            continue;
        };
        let Some(distance) = knn_io::hdf5::file_attribute(&h.file, "distance")? else {
            continue;
        };
        let file = h.file.display().to_string();
        let metric = match distance.to_ascii_lowercase().as_str() {
            "euclidean" | "l2" => "l2",
            "angular" | "cosine" => "cosine",
            "sqeuclidean" => "sqeuclidean",
            "manhattan" | "l1" | "cityblock" => "l1",
            "chebyshev" | "linf" => "linf",
            "ip" | "dot" | "inner_product" => "ip",
            "hellinger" => "hellinger",
            _ => bail!(
                "{file}: its distance attribute says '{distance}', a metric knn does not \
                 compute; give one with -m (l2, cosine, ip, l1, linf, ...)"
            ),
        };
        match &found {
            Some((m, other)) if m != metric => bail!(
                "{other} and {file} name different metrics in their distance attributes; give \
                 one with -m"
            ),
            Some(_) => {}
            None => found = Some((metric.to_owned(), file)),
        }
    }
    Ok(found.map(|(m, _)| m))
}

/// Ground truth to compare a result with: ids, and distances when the file has them (an
/// HDF5 file of ann-benchmarks: its `neighbors` and `distances`).
pub struct Truth {
    pub ids: Table<i64>,
    pub distances: Option<Table<f32>>,
}

/// Reads `--truth`: ids of any id format; from an HDF5 file its `neighbors` (int32 or int64)
/// and, when present, its `distances` of the same shape.
pub fn load_truth(path: &Path) -> Result<Truth> {
    let Some(h) = knn_io::hdf5::parse(path) else {
        return Ok(Truth {
            ids: knn_io::read_i64(path, None)?,
            distances: None,
        });
    };
    if let Some(dataset) = &h.dataset {
        let ids = knn_io::read_i64_with(path, &ReadOptions::default())
            .with_context(|| format!("ids of {}:{dataset}", h.file.display()))?;
        return Ok(Truth {
            ids,
            distances: None,
        });
    }
    let named = |d: &str| ReadOptions {
        dataset: Some(d.to_owned()),
        ..ReadOptions::default()
    };
    let ids = knn_io::read_i64_with(path, &named("neighbors"))?;
    let distances = if knn_io::hdf5::has_dataset(&h.file, "distances")? {
        let d = knn_io::read_f32_with(path, &named("distances"))?;
        if (d.rows, d.cols) != (ids.rows, ids.cols) {
            bail!(
                "{}: distances is {} x {} but neighbors is {} x {}",
                h.file.display(),
                d.rows,
                d.cols,
                ids.rows,
                ids.cols
            );
        }
        Some(d)
    } else {
        None
    };
    Ok(Truth { ids, distances })
}

/// Absolute slack on the true k-th distance within which a listed neighbour counts as a tie
/// (ann-benchmarks' own, its `knn_threshold`).
pub const TIE_EPSILON: f64 = 1e-3;

/// Recall of `result` (its first k columns) against `truth` with ties, from the truth alone
/// (the result's own distances are not trusted): an entry counts when its id is among the
/// true k, or is listed further on in the truth's row at a distance no more than the true
/// k-th plus [`TIE_EPSILON`] (a tie the truth broke otherwise). The fraction of all entries.
pub fn recall_with_ties<D>(
    result: &knn::Neighbors<D>,
    truth: &Table<i64>,
    distances: &Table<f32>,
) -> f64 {
    let k = result.k;
    if k == 0 || result.rows() == 0 {
        return 1.0;
    }
    let mut hits = 0usize;
    for i in 0..result.rows() {
        let (ids, dist) = (truth.row(i), distances.row(i));
        let kth = f64::from(dist[k - 1]) + TIE_EPSILON;
        let tied = ids
            .iter()
            .zip(dist)
            .enumerate()
            .take_while(|&(j, (_, &d))| j < k || f64::from(d) <= kth)
            .map(|(_, (&id, _))| id)
            .collect::<Vec<i64>>();
        hits += result
            .ids_of(i)
            .iter()
            .filter(|&&id| tied.contains(&i64::from(id)))
            .count();
    }
    hits as f64 / (result.rows() * k) as f64
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
    let csv = CsvOptions {
        finite_only: true,
        ..CsvOptions::default()
    };
    load_matrix_with(
        path,
        &ReadOptions {
            format,
            csv,
            dataset: None,
        },
    )
}

/// [`load_matrix`] with everything the command line says about the file; NaN and infinities
/// in a text file are named by line and column, in other files by row and column.
pub fn load_matrix_with(path: &Path, options: &ReadOptions) -> Result<Matrix> {
    let t = knn_io::read_f32_with(path, options)?;
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

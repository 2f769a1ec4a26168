//! Where results go, checked before any work is done: never over an input, never over an
//! existing file without `--force`, and always in the format the file's name says. `-` is
//! standard output; devices and pipes (`/dev/stdout`, a FIFO) are written through.

use anyhow::{bail, Context, Result};
use knn::Neighbors;
use knn_io::{Format, IoError, OutputTarget, Table};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The path that means standard output (`-o -`) or standard input (`-q -`).
pub const STD_STREAM: &str = "-";

/// Whether `path` is `-`.
pub fn is_std_stream(path: &Path) -> bool {
    path.as_os_str() == STD_STREAM
}

/// Whether `path` is standard output or a device, pipe or descriptor written through.
fn is_stream(path: &Path) -> bool {
    is_std_stream(path) || matches!(knn_io::output_target(path), Ok(OutputTarget::Stream))
}

/// How a path is named in messages.
pub fn shown(path: &Path) -> String {
    if is_std_stream(path) {
        "standard output".to_owned()
    } else {
        path.display().to_string()
    }
}

/// The format of the output `path`: the one its name says. `given` (the `flag`,
/// `--output-format`) must agree with it; it decides for standard output, streams and names
/// without a known extension. Standard output and streams default to CSV.
pub fn output_format(path: &Path, given: Option<Format>, flag: &str) -> Result<Format> {
    let named = if is_std_stream(path) {
        None
    } else {
        Format::from_path(path).ok()
    };
    match (named, given) {
        (Some(n), Some(g)) if n != g => bail!(
            "{}: the name says {n} but {flag} says {g}; a file holds what its name says: \
             rename the output (e.g. {}) or leave out {flag}",
            path.display(),
            path.with_extension(g.name()).display()
        ),
        (Some(n), _) => Ok(n),
        (None, Some(g)) => Ok(g),
        (None, None) if is_stream(path) => Ok(Format::Csv),
        (None, None) => bail!(
            "{}: cannot tell the format from the file name (.npy, .ivecs, .csv); name the file \
             with one of these extensions or give {flag} npy|ivecs|csv",
            path.display()
        ),
    }
}

/// Refuses an output that would replace an input, or an existing file without `force`; says
/// which folder is missing, or that the output is a folder. Standard output, devices and pipes
/// are written through and need no `--force`.
pub fn check_output(path: &Path, force: bool, inputs: &[&Path]) -> Result<()> {
    if is_std_stream(path) {
        return Ok(());
    }
    match knn_io::output_target(path)? {
        OutputTarget::New | OutputTarget::Stream => Ok(()),
        OutputTarget::Replace(real) => {
            let canon = |p: &Path| std::fs::canonicalize(p).ok();
            if inputs.iter().any(|i| canon(i).as_ref() == Some(&real)) {
                bail!("{}: refusing to overwrite an input file", path.display());
            }
            if !force {
                let via = if real.as_path() != path && path.is_symlink() {
                    format!(" (a link to {})", real.display())
                } else {
                    String::new()
                };
                bail!(
                    "{}{via}: file exists (use --force to replace it)",
                    path.display()
                );
            }
            Ok(())
        }
    }
}

/// Default distances path next to the ids: `x.npy` → `x.dist.npy`, `x.ivecs` → `x.fvecs`,
/// `x.csv` → `x.dist.csv`.
pub fn distances_path(ids: &Path, format: Format) -> PathBuf {
    let stem = ids
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match format {
        Format::Ivecs | Format::Fvecs => format!("{stem}.fvecs"),
        Format::Npy => format!("{stem}.dist.npy"),
        _ => format!("{stem}.dist.csv"),
    };
    ids.with_file_name(name)
}

/// A distance type of results: f32, or f64 for runs on float64 inputs.
pub trait Distance: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// Bytes of one value in a checkpoint.
    const BYTES: usize;
    /// What a row not yet computed holds.
    const UNWRITTEN: Self;
    /// The type in words, for messages.
    const NAME: &'static str;
    /// Appends the little-endian bytes of `self`.
    fn put(self, out: &mut Vec<u8>);
    /// The value of `BYTES` little-endian bytes.
    fn get(bytes: &[u8]) -> Self;
    /// Writes a table of distances to `path` in `format`.
    fn write(path: &Path, format: Format, t: &Table<Self>) -> Result<(), IoError>;
    /// Writes a table of distances to `w` in `format`.
    fn write_to(w: &mut dyn Write, format: Format, t: &Table<Self>) -> Result<(), IoError>;
}

impl Distance for f32 {
    const BYTES: usize = 4;
    const UNWRITTEN: f32 = f32::NAN;
    const NAME: &'static str = "float32";
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(bytes: &[u8]) -> f32 {
        f32::from_le_bytes(bytes.try_into().expect("4 bytes"))
    }
    fn write(path: &Path, format: Format, t: &Table<f32>) -> Result<(), IoError> {
        knn_io::write_f32(path, Some(format), t)
    }
    fn write_to(mut w: &mut dyn Write, format: Format, t: &Table<f32>) -> Result<(), IoError> {
        knn_io::write_f32_to(&mut w, format, t, "standard output")
    }
}

impl Distance for f64 {
    const BYTES: usize = 8;
    const UNWRITTEN: f64 = f64::NAN;
    const NAME: &'static str = "float64";
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(bytes: &[u8]) -> f64 {
        f64::from_le_bytes(bytes.try_into().expect("8 bytes"))
    }
    fn write(path: &Path, format: Format, t: &Table<f64>) -> Result<(), IoError> {
        knn_io::write_f64(path, Some(format), t)
    }
    fn write_to(mut w: &mut dyn Write, format: Format, t: &Table<f64>) -> Result<(), IoError> {
        knn_io::write_f64_to(&mut w, format, t, "standard output")
    }
}

/// Where the results of a search or graph go.
#[derive(Debug)]
pub struct Plan {
    ids: PathBuf,
    ids_format: Format,
    /// `None`: in the ids' CSV, side by side; or not written (a binary stream without
    /// `--distances`).
    distances: Option<(PathBuf, Format)>,
}

impl Plan {
    /// The plan for `-o ids [--distances d] [--output-format f]`, checked (see
    /// [`check_output`]) before any work.
    pub fn new(
        ids: &Path,
        distances: Option<&Path>,
        given: Option<Format>,
        force: bool,
        inputs: &[&Path],
    ) -> Result<Plan> {
        check_output(ids, force, inputs)?;
        let ids_format = output_format(ids, given, "--output-format")?;
        let distances_given = distances;
        let distances = match distances {
            Some(d) => {
                check_output(d, force, inputs)?;
                let f = output_format(d, given.map(distance_format), "--output-format")?;
                Some((d.to_path_buf(), f))
            }
            None if is_stream(ids) => None,
            None => Some((distances_path(ids, ids_format), distance_format(ids_format))),
        };
        if let (Some((d, _)), None) = (&distances, distances_given) {
            check_output(d, force, inputs)?;
        }
        Ok(Plan {
            ids: ids.to_path_buf(),
            ids_format,
            distances,
        })
    }

    /// Refuses, before any work, a distances file that cannot hold float64 values (fvecs),
    /// for a run on float64 inputs.
    pub fn check_float64(&self, inputs: &str) -> Result<()> {
        if let Some((path, Format::Fvecs)) = &self.distances {
            bail!(
                "{}: fvecs holds float32 values, but the distances of {inputs} are float64; \
                 name a .npy or .csv distances file (--distances {}), or give --float32 to \
                 compute on the float32 rounding of the inputs",
                path.display(),
                path.with_extension("dist.npy").display()
            );
        }
        Ok(())
    }

    /// Writes the results; returns what the summary says about where they went.
    pub fn write<D: Distance>(&self, nn: &Neighbors<D>) -> Result<String> {
        let rows = nn.rows();
        let ids = Table {
            data: nn.ids.iter().map(|&i| i64::from(i)).collect(),
            rows,
            cols: nn.k,
        };
        let side_by_side = self.distances.is_none() && self.ids_format == Format::Csv;
        if side_by_side {
            let text = side_by_side_csv(nn);
            write_bytes(&self.ids, text.as_bytes())?;
            return Ok(format!(
                "ids and distances side by side ({} ids, then {} distances a row) in {}",
                nn.k,
                nn.k,
                shown(&self.ids)
            ));
        }
        if is_std_stream(&self.ids) {
            let out = std::io::stdout();
            knn_io::write_i64_to(&mut out.lock(), self.ids_format, &ids, "standard output")?;
        } else {
            knn_io::write_i64(&self.ids, Some(self.ids_format), &ids)?;
        }
        let Some((path, format)) = &self.distances else {
            return Ok(format!(
                "ids in {}; distances not written (give --distances FILE, or --output-format \
                 csv for both side by side)",
                shown(&self.ids)
            ));
        };
        let d = Table {
            data: nn.distances.clone(),
            rows,
            cols: nn.k,
        };
        if is_std_stream(path) {
            let out = std::io::stdout();
            D::write_to(&mut out.lock(), *format, &d)?;
        } else {
            D::write(path, *format, &d)?;
        }
        Ok(format!(
            "ids in {}, distances in {}",
            shown(&self.ids),
            shown(path)
        ))
    }
}

/// The format of distances that go with ids in `format` (ivecs ids: fvecs distances).
fn distance_format(format: Format) -> Format {
    match format {
        Format::Ivecs => Format::Fvecs,
        f => f,
    }
}

/// One row per query: its k ids, then its k distances (shortest text that reads back to the
/// same float32, or float64 for a run on float64 inputs).
pub fn side_by_side_csv<D: Distance>(nn: &Neighbors<D>) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(nn.ids.len() * 16);
    for i in 0..nn.rows() {
        for (j, id) in nn.ids_of(i).iter().enumerate() {
            let _ = write!(s, "{}{id}", if j > 0 { "," } else { "" });
        }
        for d in nn.distances_of(i) {
            let _ = write!(s, ",{d:?}");
        }
        s.push('\n');
    }
    s
}

/// Writes `bytes` to standard output (`-`) or to `path` (atomically, or through a stream).
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    if is_std_stream(path) {
        let out = std::io::stdout();
        let mut lock = out.lock();
        lock.write_all(bytes)
            .and_then(|()| lock.flush())
            .context("writing to standard output")?;
        return Ok(());
    }
    knn_classify::write_atomically(path, bytes)?;
    Ok(())
}

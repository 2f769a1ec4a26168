//! Seed 003's CSV format: one file of labelled points and points to classify.
//!
//! ```text
//! 5,2,5,3                          numels,newels,classes,dim
//! 28.604126,59.192734,51.113876,0  dim coordinates, then the class in [0, classes)
//! ...
//! -47.902969,18.415474,-41.363827,-1   class -1: to classify
//! ```
//! The header's four cells are non-negative integers (`classes`, `dim` ≥ 1); then exactly
//! `numels + newels` rows of `dim` finite numbers and a class, `newels` of them with class −1.
//! Rows may come in any order: labelled rows are the labelled set (ids in file order), rows with
//! −1 are the new points in file order (the order sequential mode takes them in). Spaces around
//! cells, `\r\n` line ends, a byte-order mark and blank lines are accepted. Every error names
//! the line and the column (both from 1).
//!
//! [`fill_predictions`] writes the input back with every −1 replaced by the predicted class and
//! every other byte unchanged, so two classifiers' outputs can be compared with `sort | diff` as
//! in the seed. Files are written to a temporary file and renamed into place: a failure never
//! leaves a half-written output.

use crate::error::{ClassifyError, Result};
use knn::synth::Rng;
use std::path::Path;

/// A parsed seed-003 CSV file.
#[derive(Clone, Debug, PartialEq)]
pub struct SeedCsv {
    /// Labelled rows (header).
    pub numels: usize,
    /// Rows to classify (header).
    pub newels: usize,
    /// Number of classes: labels are in `0..classes` (header).
    pub classes: usize,
    /// Coordinates per point (header).
    pub dim: usize,
    /// `(numels + newels) × dim` coordinates, row-major, in file order.
    pub points: Vec<f32>,
    /// The class of every row, in file order; −1 for rows to classify.
    pub labels: Vec<i64>,
}

/// What a header cell names, for messages.
const HEADER: [&str; 4] = ["numels", "newels", "classes", "dim"];

/// Longest cell text quoted in an error message.
const MAX_QUOTED: usize = 40;

fn quoted(cell: &str) -> String {
    if cell.chars().count() > MAX_QUOTED {
        format!("'{}...'", cell.chars().take(MAX_QUOTED).collect::<String>())
    } else {
        format!("'{cell}'")
    }
}

/// Lines of `bytes` with their numbers (from 1), line ends and a byte-order mark removed.
fn lines(bytes: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let trailing_newline = bytes.last() == Some(&b'\n');
    let mut all: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    if trailing_newline {
        all.pop();
    }
    all.into_iter()
        .enumerate()
        .map(|(i, l)| (i + 1, l.strip_suffix(b"\r").unwrap_or(l)))
}

fn is_blank(line: &[u8]) -> bool {
    line.iter().all(|b| b.is_ascii_whitespace())
}

impl SeedCsv {
    /// Reads and validates the file at `path`.
    pub fn read(path: &Path) -> Result<SeedCsv> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|error| ClassifyError::File {
            file: name.clone(),
            error,
        })?;
        SeedCsv::parse(&bytes, &name)
    }

    /// Parses and validates the bytes of a file; `name` starts every error message.
    pub fn parse(bytes: &[u8], name: &str) -> Result<SeedCsv> {
        let err = |line: usize, column: usize, message: String| ClassifyError::Csv {
            file: name.to_owned(),
            line,
            column,
            message,
        };
        let mut it = lines(bytes).filter(|(_, l)| !is_blank(l));
        let Some((hline, header)) = it.next() else {
            return Err(ClassifyError::CsvShape {
                file: name.into(),
                message: "empty file: expected the header numels,newels,classes,dim".into(),
            });
        };
        let header = std::str::from_utf8(header)
            .map_err(|_| err(hline, 1, "the header is not text".into()))?;
        let cells: Vec<&str> = header.split(',').map(str::trim).collect();
        if cells.len() != 4 {
            return Err(err(
                hline,
                cells.len().min(4) + 1,
                format!(
                    "the header has {} cells; expected 4: numels,newels,classes,dim",
                    cells.len()
                ),
            ));
        }
        let mut h = [0usize; 4];
        for (c, cell) in cells.iter().enumerate() {
            h[c] = cell.parse().map_err(|_| {
                err(
                    hline,
                    c + 1,
                    format!(
                        "{} {} is not a non-negative integer",
                        HEADER[c],
                        quoted(cell)
                    ),
                )
            })?;
        }
        let [numels, newels, classes, dim] = h;
        if classes == 0 {
            return Err(err(hline, 3, "classes must be at least 1".into()));
        }
        if dim == 0 {
            return Err(err(hline, 4, "dim must be at least 1".into()));
        }
        let rows = numels
            .checked_add(newels)
            .filter(|r| r.checked_mul(dim + 1).is_some())
            .ok_or_else(|| err(hline, 1, "numels + newels is too large".into()))?;
        // A header may lie: reserve no more than the file could hold (2 bytes a cell at least).
        let cap = rows.min(bytes.len() / (2 * (dim + 1)) + 1);
        let mut points = Vec::with_capacity(cap * dim);
        let mut labels = Vec::with_capacity(cap);
        let mut new_rows = 0usize;
        let mut last_line = hline;
        for (ln, line) in it {
            last_line = ln;
            if labels.len() == rows {
                return Err(err(
                    ln,
                    1,
                    format!(
                        "more rows than the header's numels + newels = {numels} + {newels} = {rows}"
                    ),
                ));
            }
            let text =
                std::str::from_utf8(line).map_err(|_| err(ln, 1, "the line is not text".into()))?;
            let n_cells = text.bytes().filter(|&b| b == b',').count() + 1;
            if n_cells != dim + 1 {
                let (column, what) = if n_cells <= dim {
                    (
                        n_cells + 1,
                        format!("the row has {n_cells} cells; expected"),
                    )
                } else {
                    (dim + 2, "the row has more than".to_owned())
                };
                return Err(err(
                    ln,
                    column,
                    format!(
                        "{what} dim + 1 = {} cells ({dim} coordinates, then the class)",
                        dim + 1
                    ),
                ));
            }
            for (c, cell) in text.split(',').enumerate() {
                let cell = cell.trim();
                if c < dim {
                    let v: f32 = cell
                        .parse()
                        .map_err(|_| err(ln, c + 1, format!("{} is not a number", quoted(cell))))?;
                    if !v.is_finite() {
                        let what = if v.is_nan() {
                            "NaN"
                        } else if cell.to_ascii_lowercase().contains("inf") {
                            "infinite"
                        } else {
                            "beyond the f32 range"
                        };
                        return Err(err(
                            ln,
                            c + 1,
                            format!("{} is {what}; coordinates must be finite", quoted(cell)),
                        ));
                    }
                    points.push(v);
                } else {
                    let label: i64 = cell.parse().map_err(|_| {
                        err(
                            ln,
                            c + 1,
                            format!("the class {} is not an integer", quoted(cell)),
                        )
                    })?;
                    if label < -1 || label >= classes as i64 {
                        return Err(err(
                            ln,
                            c + 1,
                            format!(
                                "class {label} is outside [-1, {classes}) (-1 marks a point to classify; the header has classes={classes})"
                            ),
                        ));
                    }
                    new_rows += usize::from(label == -1);
                    labels.push(label);
                }
            }
        }
        if labels.len() != rows {
            return Err(err(
                last_line + 1,
                1,
                format!(
                    "the file ends after {} rows; the header says numels + newels = {numels} + {newels} = {rows}",
                    labels.len()
                ),
            ));
        }
        if new_rows != newels {
            return Err(err(
                hline,
                2,
                format!("the header says newels = {newels}, but {new_rows} rows have class -1"),
            ));
        }
        Ok(SeedCsv {
            numels,
            newels,
            classes,
            dim,
            points,
            labels,
        })
    }

    /// Number of rows (`numels + newels`).
    pub fn rows(&self) -> usize {
        self.labels.len()
    }

    /// The labelled rows: coordinates (`numels × dim`) and classes, in file order.
    pub fn labelled(&self) -> (Vec<f32>, Vec<i64>) {
        let mut pts = Vec::with_capacity(self.numels * self.dim);
        let mut lab = Vec::with_capacity(self.numels);
        for (r, &l) in self.labels.iter().enumerate() {
            if l >= 0 {
                pts.extend_from_slice(&self.points[r * self.dim..(r + 1) * self.dim]);
                lab.push(l);
            }
        }
        (pts, lab)
    }

    /// The rows to classify (`newels × dim`), in file order.
    pub fn unlabelled(&self) -> Vec<f32> {
        let mut pts = Vec::with_capacity(self.newels * self.dim);
        for (r, &l) in self.labels.iter().enumerate() {
            if l < 0 {
                pts.extend_from_slice(&self.points[r * self.dim..(r + 1) * self.dim]);
            }
        }
        pts
    }

    /// The file's text: the header, then rows of coordinates (shortest form that reads back to
    /// the same `f32`) and class.
    pub fn to_bytes(&self) -> Vec<u8> {
        use std::fmt::Write as _;
        let mut s = String::with_capacity(self.rows() * (self.dim + 1) * 10 + 32);
        let _ = writeln!(
            s,
            "{},{},{},{}",
            self.numels, self.newels, self.classes, self.dim
        );
        for (r, l) in self.labels.iter().enumerate() {
            for v in &self.points[r * self.dim..(r + 1) * self.dim] {
                let _ = write!(s, "{v},");
            }
            let _ = writeln!(s, "{l}");
        }
        s.into_bytes()
    }

    /// Writes the file to `path` atomically (temporary file, then rename).
    pub fn write(&self, path: &Path) -> Result<()> {
        write_atomically(path, &self.to_bytes())
    }
}

/// The input file's bytes with the class cell of every row marked −1 replaced by the next of
/// `predictions` (in file order); every other byte is kept. `bytes` should have passed
/// [`SeedCsv::parse`]; the number of −1 rows must equal `predictions.len()`.
pub fn fill_predictions(bytes: &[u8], name: &str, predictions: &[i64]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(bytes.len() + predictions.len() * 4);
    let mut next = 0usize;
    let mut header_seen = false;
    let mut rest = bytes;
    while !rest.is_empty() {
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .map_or(rest.len(), |p| p + 1);
        let (line, tail) = rest.split_at(end);
        rest = tail;
        let body_len =
            line.len() - usize::from(line.ends_with(b"\n")) - usize::from(line.ends_with(b"\r\n"));
        let body = &line[..body_len];
        if is_blank(body) || !header_seen {
            header_seen |= !is_blank(body);
            out.extend_from_slice(line);
            continue;
        }
        let cut = body.iter().rposition(|&b| b == b',').map_or(0, |p| p + 1);
        if body[cut..].trim_ascii() == b"-1" {
            let Some(p) = predictions.get(next) else {
                return Err(ClassifyError::CsvShape {
                    file: name.into(),
                    message: format!(
                        "more rows with class -1 than the {} predictions",
                        predictions.len()
                    ),
                });
            };
            next += 1;
            out.extend_from_slice(&body[..cut]);
            out.extend_from_slice(p.to_string().as_bytes());
            out.extend_from_slice(&line[body_len..]);
        } else {
            out.extend_from_slice(line);
        }
    }
    if next != predictions.len() {
        return Err(ClassifyError::CsvShape {
            file: name.into(),
            message: format!(
                "{} rows with class -1 but {} predictions",
                next,
                predictions.len()
            ),
        });
    }
    Ok(out)
}

/// Writes `bytes` to `path`: a new or regular file into a temporary file next to it, synced,
/// then renamed over it (behind symbolic links, over the file they lead to), so `path` is
/// either untouched or complete; a device or pipe (`/dev/stdout`) is written through.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    Ok(knn_io::write_bytes(path, bytes)?)
}

/// Labelled and new row counts for `rows` rows of which a share `share_new` (0..=1) is to be
/// classified (rounded to the nearest row).
pub fn split_rows(rows: usize, share_new: f64) -> Result<(usize, usize)> {
    if !(0.0..=1.0).contains(&share_new) {
        return Err(ClassifyError::Option(format!(
            "the share of new rows must be in [0, 1], got {share_new}"
        )));
    }
    let newels = ((rows as f64) * share_new).round() as usize;
    Ok((rows - newels.min(rows), newels.min(rows)))
}

/// A seed-003 data set, as the seed's generator makes it: `numels` labelled rows then `newels`
/// rows of class −1, coordinates uniform in [−100, 100], classes uniform in `0..classes`, from
/// `seed` (same seed, same file, on every machine). Write it with [`SeedCsv::write`].
pub fn generate_seed_csv(
    numels: usize,
    newels: usize,
    classes: usize,
    dim: usize,
    seed: u64,
) -> Result<SeedCsv> {
    if classes == 0 || dim == 0 {
        return Err(ClassifyError::Option(
            "classes and dim must be at least 1".into(),
        ));
    }
    let rows = numels + newels;
    let mut rng = Rng::new(seed);
    let mut points = Vec::with_capacity(rows * dim);
    let mut labels = Vec::with_capacity(rows);
    for r in 0..rows {
        for _ in 0..dim {
            points.push((-100.0 + 200.0 * rng.uniform()) as f32);
        }
        labels.push(if r < numels {
            rng.below(classes as u64) as i64
        } else {
            -1
        });
    }
    Ok(SeedCsv {
        numels,
        newels,
        classes,
        dim,
        points,
        labels,
    })
}

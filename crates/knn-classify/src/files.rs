//! Separate files: labelled points, their labels and points to classify in any format of
//! `knn_io` (npy, CSV, fvecs/ivecs/bvecs); predicted labels and probabilities written back.
//!
//! Labels are what scikit-learn takes: integers, floating-point numbers or text
//! ([`Labels`]). [`encode`] turns them into class codes `0..C`, the classes ordered as
//! `numpy.unique` orders them (numbers ascending, text by code point); [`decode`] turns
//! predicted codes back into labels of the same kind.

use crate::error::{ClassifyError, Result};
use knn::Matrix;
pub use knn_io::Labels;
use knn_io::{CsvOptions, Format, Header, Table};
use std::cmp::Ordering;
use std::path::{Path, PathBuf};

/// Reads a matrix of points, validated: at least one row, every value finite (else an error
/// naming the file, row and column).
pub fn read_points(path: &Path, format: Option<Format>) -> Result<Matrix> {
    let t = knn_io::read_f32(path, format)?;
    let name = path.display().to_string();
    if t.rows == 0 {
        return Err(ClassifyError::Labels(format!(
            "{name}: no points in the file"
        )));
    }
    Ok(Matrix::new(&name, t.data, t.cols)?)
}

/// Reads the labels of `rows` points: a 1-D npy array (or one column or row), or a CSV file
/// with one label per line (a first line more than `rows` is a header).
pub fn read_labels(path: &Path, format: Option<Format>, rows: usize) -> Result<Labels> {
    read_labels_with(path, format, &CsvOptions::default(), rows)
}

/// [`read_labels`] of a text file with the header and delimiter of `csv`: with
/// [`Header::Present`] the first line is always a header, with [`Header::Absent`] never (not
/// even text above `rows` labels), with [`Header::Auto`] as [`read_labels`] decides.
pub fn read_labels_with(
    path: &Path,
    format: Option<Format>,
    csv: &CsvOptions,
    rows: usize,
) -> Result<Labels> {
    let mut labels = knn_io::read_labels_with(path, format, csv)?;
    if csv.header == Header::Auto && labels.len() == rows + 1 {
        if let Labels::Text(cells) = &mut labels {
            // Text labels under a header line: the header cannot be told by its look.
            cells.remove(0);
            labels = Labels::from_cells(std::mem::take(cells));
        }
    }
    if labels.len() != rows {
        return Err(ClassifyError::Labels(format!(
            "{}: {} labels for {rows} labelled points (one label per point, in the same order)",
            path.display(),
            labels.len()
        )));
    }
    Ok(labels)
}

/// Labels as class codes.
#[derive(Clone, Debug, PartialEq)]
pub struct Classes {
    /// The distinct labels, ordered as `numpy.unique` orders them: scikit-learn's `classes_`.
    pub classes: Labels,
    /// The class of each label: its index in `classes`.
    pub codes: Vec<i64>,
}

/// The classes of `labels` and the code of each (see [`Classes`]). Floats `-0.0` and `0.0`
/// are one class, as in NumPy.
pub fn encode(labels: &Labels) -> Classes {
    /// The distinct `values`, sorted by `cmp`, and the index of each value among them.
    fn codes<T: Clone + PartialEq>(
        values: &[T],
        cmp: impl Fn(&T, &T) -> Ordering,
    ) -> (Vec<T>, Vec<i64>) {
        let mut classes = values.to_vec();
        classes.sort_unstable_by(&cmp);
        classes.dedup();
        let codes = values
            .iter()
            .map(|v| {
                let i = classes.binary_search_by(|c| cmp(c, v));
                i.expect("a class of its own") as i64
            })
            .collect();
        (classes, codes)
    }
    let (classes, codes) = match labels {
        Labels::Int(v) => {
            let (c, k) = codes(v, Ord::cmp);
            (Labels::Int(c), k)
        }
        Labels::Float(v) => {
            let v: Vec<f64> = v.iter().map(|&x| x + 0.0).collect(); // -0.0 is 0.0
            let (c, k) = codes(&v, f64::total_cmp);
            (Labels::Float(c), k)
        }
        Labels::Text(v) => {
            let (c, k) = codes(v, Ord::cmp);
            (Labels::Text(c), k)
        }
    };
    Classes { classes, codes }
}

/// The labels of class codes `codes` (indices into `classes`), of the classes' kind.
pub fn decode(classes: &Labels, codes: &[i64]) -> Labels {
    let pick = |c: i64| c as usize;
    match classes {
        Labels::Int(c) => Labels::Int(codes.iter().map(|&k| c[pick(k)]).collect()),
        Labels::Float(c) => Labels::Float(codes.iter().map(|&k| c[pick(k)]).collect()),
        Labels::Text(c) => Labels::Text(codes.iter().map(|&k| c[pick(k)].clone()).collect()),
    }
}

/// Writes one label per point, as a 1-D array of their kind (npy `<i8`, `<f8`, `<U`n), one
/// per line (CSV) or one per record (ivecs, integers), atomically.
pub fn write_labels(path: &Path, format: Option<Format>, labels: &Labels) -> Result<()> {
    Ok(knn_io::write_labels(path, format, labels)?)
}

/// The file that names the columns of a probability file that has no header: `P.classes.npy`
/// next to `P.npy`.
pub fn classes_sidecar(proba: &Path) -> PathBuf {
    let stem = proba
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    proba.with_file_name(format!("{stem}.classes.npy"))
}

/// The probability table as CSV: a header naming the class of each column, then one row per
/// point.
pub fn proba_csv(classes: &Labels, proba: &[f64]) -> String {
    let c = classes.len();
    let mut out: String = (0..c)
        .map(|i| classes.csv_cell(i))
        .collect::<Vec<_>>()
        .join(",");
    out.push('\n');
    if c == 0 {
        return out;
    }
    for row in proba.chunks_exact(c) {
        let cells: Vec<String> = row.iter().map(|p| format!("{p:?}")).collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// Writes `rows × classes` probabilities, columns in the order of `classes`: CSV with a header
/// of the classes, or npy float64 (as scikit-learn's `predict_proba` gives them) with the
/// classes in [`classes_sidecar`] (returned).
pub fn write_proba(
    path: &Path,
    format: Option<Format>,
    classes: &Labels,
    proba: &[f64],
) -> Result<Option<PathBuf>> {
    let format = match format {
        Some(f) => f,
        None => Format::from_path(path)?,
    };
    match format {
        Format::Csv => {
            crate::write_atomically(path, proba_csv(classes, proba).as_bytes())?;
            Ok(None)
        }
        Format::Npy => {
            let t = Table {
                data: proba.to_vec(),
                rows: proba.len() / classes.len().max(1),
                cols: classes.len(),
            };
            knn_io::write_f64(path, Some(Format::Npy), &t)?;
            let sidecar = classes_sidecar(path);
            knn_io::write_labels(&sidecar, Some(Format::Npy), classes)?;
            Ok(Some(sidecar))
        }
        f => Err(ClassifyError::Option(format!(
            "{}: probabilities are written as .npy (with the classes in {}) or .csv (with a \
             header of the classes), not {f}",
            path.display(),
            classes_sidecar(path).display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_ordered_as_numpy_unique_orders_them() {
        let l = Labels::Text(vec![
            "b".into(),
            "B".into(),
            "a".into(),
            "b".into(),
            "é".into(),
        ]);
        let c = encode(&l);
        assert_eq!(
            c.classes,
            Labels::Text(vec!["B".into(), "a".into(), "b".into(), "é".into()])
        );
        assert_eq!(c.codes, [2, 0, 1, 2, 3]);
        assert_eq!(decode(&c.classes, &c.codes), l);
        let f = encode(&Labels::Float(vec![2.0, -0.0, 0.0, 10.0]));
        assert_eq!(f.classes, Labels::Float(vec![0.0, 2.0, 10.0]));
        assert_eq!(f.codes, [1, 0, 0, 2]);
        let i = encode(&Labels::Int(vec![10, -3, 10]));
        assert_eq!(
            (i.classes, i.codes),
            (Labels::Int(vec![-3, 10]), vec![1, 0, 1])
        );
    }

    #[test]
    fn proba_csv_names_the_columns() {
        let c = Labels::Text(vec!["a,b".into(), "c".into()]);
        assert_eq!(proba_csv(&c, &[0.25, 0.75]), "\"a,b\",c\n0.25,0.75\n");
    }
}

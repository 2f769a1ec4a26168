//! `knn classify`: label new points by the classes of their k nearest labelled points
//! (seed 003), from the seed's CSV or from separate files.

use crate::args::{EngineArgs, MetricArgs, TextArgs};
use crate::data::{input_options, parse_format, Data, Points, BASE_DATASET, QUERY_DATASET};
use crate::output::{check_output, is_std_stream, output_format, shown, write_bytes};
use crate::run::{engine, in_words, input_format_hint, metric, read_points};
use crate::timing::{self, timed};
use anyhow::{bail, Context, Result};
use clap::Args;
use knn::MatrixRef;
use knn_classify::files::{self, Labels};
use knn_classify::{fill_predictions, Classifier, Mode, Params, SeedCsv, Weights};
use knn_io::Format;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `knn classify`.
#[derive(Args, Debug)]
pub struct ClassifyArgs {
    /// Seed-003 CSV input: header `numels,newels,classes,dim`, then one row per point
    /// (coordinates, then the class; -1 marks a point to classify). A .csv output (-o) is the
    /// same file with every -1 replaced by the predicted class; a .npy or .ivecs output holds
    /// the predicted classes alone, in file order.
    #[arg(long, required_unless_present = "train", conflicts_with_all = ["train", "labels", "queries"])]
    pub csv: Option<PathBuf>,
    /// Labelled points (.npy, .csv, .fvecs, .bvecs, .ivecs, .hdf5: its dataset `train`, or
    /// the one named as FILE.hdf5:NAME); with --labels and --queries. `-` reads standard input
    /// (npy or CSV). Classification computes on float32 values: float64 points (float64 .npy,
    /// text) are rounded to float32.
    #[arg(long, requires_all = ["labels", "queries"])]
    pub train: Option<PathBuf>,
    /// Labels of the --train points, one per point, as scikit-learn takes them: integers, text
    /// or floating-point numbers (.npy of any of these, NumPy unicode included; .csv with one
    /// label per line, a header line allowed; .ivecs). Classes are ordered as numpy.unique
    /// orders them.
    #[arg(long)]
    pub labels: Option<PathBuf>,
    /// Points to classify, same dimension as --train (.hdf5: its dataset `test`, or
    /// FILE.hdf5:NAME). `-` reads standard input (npy or CSV).
    #[arg(long, short = 'q')]
    pub queries: Option<PathBuf>,
    /// Neighbours that vote (1 ..= labelled points).
    #[arg(short = 'k', long, default_value_t = 5)]
    pub k: usize,
    /// Vote weights: uniform (majority) or distance (1/d; exact matches alone vote when there
    /// are any). Equal totals go to the smallest class label.
    #[arg(long, default_value = "uniform")]
    pub weights: String,
    /// batch (each new point against the labelled points) or sequential (seed 003: new points
    /// in file order, each joining the labelled set once classified).
    #[arg(long, default_value = "batch")]
    pub mode: String,
    /// Input format of --train/--labels/--queries, overriding the extensions.
    #[arg(long)]
    pub input_format: Option<String>,
    /// How --train, --labels and --queries text files are read (the seed CSV of --csv has a
    /// layout of its own: these flags are refused with it).
    #[command(flatten)]
    pub text: TextArgs,
    #[command(flatten)]
    pub metric: MetricArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Output: the predicted label of every query, as a 1-D array of the labels' kind (.npy:
    /// int64, float64 or unicode; .csv: one per line; .ivecs: integers), or with --csv and a
    /// .csv name the filled-in seed CSV. `-` writes to standard output (CSV).
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Format of the output (npy, csv, ivecs) for standard output and names without one of
    /// these extensions; a name that says a format must agree with it.
    #[arg(long)]
    pub output_format: Option<String>,
    /// Also write class probabilities, one row per query and one column per class, classes
    /// ordered as numpy.unique orders them: .csv with a header naming the classes, or .npy
    /// (float64, as scikit-learn's predict_proba) with the classes in P.classes.npy next to it.
    #[arg(long)]
    pub proba: Option<PathBuf>,
    /// Replace output files that already exist (never an input file).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub timing: crate::args::TimingArgs,
}

/// Labelled points, their classes, points to classify (computed on in float32: float64 inputs
/// are rounded).
struct Inputs {
    train: Points,
    /// The class of each labelled point: an index into `classes`.
    codes: Vec<i64>,
    /// The classes, ordered as `numpy.unique` orders them.
    classes: Labels,
    queries: Points,
    /// The seed CSV's bytes, to fill in.
    csv: Option<Vec<u8>>,
}

/// Reads the points of `path` for classification in float32, with the text flags (a 1-D npy
/// array is refused as scikit-learn refuses it; `-` is standard input, once).
fn read_matrix(
    a: &ClassifyArgs,
    path: &Path,
    dataset: &str,
    stdin_taken: &mut bool,
) -> Result<Points> {
    let options = input_options(&a.input_format, &a.text, Some(dataset))?;
    match read_points(path, &options, true, stdin_taken)? {
        Data::F32(points) => Ok(points),
        Data::F64 { .. } => unreachable!("read in float32"),
    }
}

fn read_inputs(a: &ClassifyArgs) -> Result<Inputs> {
    if let Some(path) = &a.csv {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let name = path.display().to_string();
        let f = SeedCsv::parse(&bytes, &name)?;
        if f.numels == 0 {
            bail!("{name}: no labelled rows (numels = 0)");
        }
        let (train, labels) = f.labelled();
        let queries = f.unlabelled();
        return Ok(Inputs {
            train: Points::Owned(knn::Matrix::new(&name, train, f.dim)?),
            codes: labels,
            classes: Labels::Int((0..f.classes as i64).collect()),
            // newels may be 0: an empty matrix of the right dimension.
            queries: Points::Owned(knn::Matrix::new(&name, queries, f.dim)?),
            csv: Some(bytes),
        });
    }
    let (Some(t), Some(l), Some(q)) = (&a.train, &a.labels, &a.queries) else {
        bail!("give --csv FILE, or --train, --labels and --queries");
    };
    if is_std_stream(t) && is_std_stream(q) {
        bail!("only one input can be read from standard input (-); give the other as a file");
    }
    let mut stdin_taken = false;
    let train = read_matrix(a, t, BASE_DATASET, &mut stdin_taken)?;
    let csv = input_options(&a.input_format, &a.text, None)?.csv;
    let fmt = parse_format(&a.input_format)?;
    let labels = files::read_labels_with(l, fmt, &csv, train.rows())
        .map_err(|e| input_format_hint(e.into()))?;
    let encoded = files::encode(&labels);
    let queries = read_matrix(a, q, QUERY_DATASET, &mut stdin_taken)?;
    Ok(Inputs {
        train,
        codes: encoded.codes,
        classes: encoded.classes,
        queries,
        csv: None,
    })
}

/// `knn classify`.
pub fn classify(a: &ClassifyArgs, quiet: bool) -> Result<ExitCode> {
    let text_flags = a.text.header || a.text.no_header || a.text.delimiter.is_some();
    if a.csv.is_some() && text_flags {
        bail!(
            "--header, --no-header and --delimiter are for the text files of --train, --labels \
             and --queries; the seed CSV of --csv has its own layout (a header \
             numels,newels,classes,dim, then comma-separated rows)"
        );
    }
    let weights: Weights = a.weights.parse()?;
    let mode: Mode = a.mode.parse()?;
    let params = Params {
        k: a.k,
        metric: metric(&a.metric)?,
        weights,
        mode,
    };
    // Refuse to overwrite before doing any work.
    let inputs_paths: Vec<&Path> = [&a.csv, &a.train, &a.labels, &a.queries]
        .into_iter()
        .flatten()
        .map(PathBuf::as_path)
        .collect();
    for out in [&a.output, &a.proba].into_iter().flatten() {
        check_output(out, a.force, &inputs_paths)?;
    }
    let output_format = match &a.output {
        Some(o) => Some(output_format(
            o,
            parse_format(&a.output_format)?,
            "--output-format",
        )?),
        None => None,
    };
    let proba_format = match &a.proba {
        Some(p) => Some(proba_format(p)?),
        None => None,
    };
    if let (Some(p), Some(Format::Npy)) = (&a.proba, proba_format) {
        check_output(&files::classes_sidecar(p), a.force, &inputs_paths)?;
    }
    let input = read_inputs(a)?;
    if let (Some(out), Some(format)) = (&a.output, output_format) {
        let seed_csv = a.csv.is_some() && format == Format::Csv;
        let fits = match (format, &input.classes) {
            (Format::Npy | Format::Csv, _) | (Format::Ivecs, Labels::Int(_)) => true,
            _ => seed_csv,
        };
        if !fits {
            bail!(
                "{}: the labels are {}, which format {format} cannot hold; name a .npy or .csv \
                 output",
                shown(out),
                input.classes.kind()
            );
        }
    }
    let mut clf = Classifier::with_engine(params, engine(&a.engine)?)?;
    let train = input.train.view();
    let class_codes: Vec<i64> = (0..input.classes.len() as i64).collect();
    clf.fit_with_classes(train, &input.codes, &class_codes)?;
    let queries: MatrixRef<'_> = input.queries.view();
    let (p, times) = timed(a.timing.repeat, || clf.classify(queries, a.proba.is_some()))?;
    let (med, runs) = timing::summary(&times, a.timing.timing_json.as_deref())?;
    let predicted = files::decode(&input.classes, &p.labels);
    let mut written = Vec::new();
    if let (Some(out), Some(format)) = (&a.output, output_format) {
        match (&input.csv, &a.csv, format) {
            (Some(bytes), Some(csv), Format::Csv) => {
                let filled = fill_predictions(bytes, &csv.display().to_string(), &p.labels)?;
                write_bytes(out, &filled)?;
                written.push(format!("the seed CSV filled in: {}", shown(out)));
            }
            _ if is_std_stream(out) => {
                let stdout = std::io::stdout();
                knn_io::write_labels_to(&mut stdout.lock(), format, &predicted, "standard output")?;
                written.push("predicted labels: standard output".to_owned());
            }
            _ => {
                files::write_labels(out, Some(format), &predicted)?;
                written.push(format!("predicted labels: {}", shown(out)));
            }
        }
    }
    if let (Some(path), Some(proba)) = (&a.proba, &p.proba) {
        let sidecar = files::write_proba(path, proba_format, &input.classes, proba)?;
        written.push(match sidecar {
            Some(c) => format!(
                "probabilities: {} (classes of its columns: {})",
                path.display(),
                c.display()
            ),
            None => format!(
                "probabilities: {} (a header names the classes)",
                path.display()
            ),
        });
    }
    if !quiet {
        let waves = if mode == Mode::Sequential {
            format!(
                "; {} waves (largest {}), {} rows widened, {} scanned",
                p.stats.waves, p.stats.largest_wave, p.stats.widened, p.stats.scanned
            )
        } else {
            String::new()
        };
        eprintln!(
            "classify: {} new × {} labelled points (d={}), {} classes ({}), k={}, {} weights, {mode}, {}, {}: {med:.1} ms{runs}{waves}",
            queries.rows(),
            train.rows(),
            train.dim(),
            input.classes.len(),
            input.classes.kind(),
            a.k,
            weights,
            clf.params().metric,
            in_words(&clf.engine_name()),
        );
        if written.is_empty() {
            eprintln!("classify: no --output given, results not written");
        }
        for w in written {
            eprintln!("classify: {w}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The format of the probabilities file: .csv (a header names the classes) or .npy (the
/// classes in a file next to it).
fn proba_format(path: &Path) -> Result<Format> {
    match Format::from_path(path).ok() {
        Some(f @ (Format::Csv | Format::Npy)) => Ok(f),
        _ => bail!(
            "{}: probabilities are written as .csv (a header names the classes) or .npy (the \
             classes in {}); name the file with one of these extensions",
            path.display(),
            files::classes_sidecar(path).display()
        ),
    }
}

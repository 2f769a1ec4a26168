//! `knn classify`: label new points by the classes of their k nearest labelled points
//! (seed 003), from the seed's CSV or from separate files.

use crate::args::{EngineArgs, MetricArgs};
use crate::data::{check_output, load_matrix, parse_format};
use crate::run::{engine, metric};
use anyhow::{bail, Context, Result};
use clap::Args;
use knn::MatrixRef;
use knn_classify::{
    files, fill_predictions, Classifier, Mode, Params, Prediction, SeedCsv, Weights,
};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `knn classify`.
#[derive(Args, Debug)]
pub struct ClassifyArgs {
    /// Seed-003 CSV input: header `numels,newels,classes,dim`, then one row per point
    /// (coordinates, then the class; -1 marks a point to classify). The output (-o) is the same
    /// file with every -1 replaced by the predicted class.
    #[arg(long, required_unless_present = "train", conflicts_with_all = ["train", "labels", "queries"])]
    pub csv: Option<PathBuf>,
    /// Labelled points (.npy, .csv, .fvecs, .bvecs, .ivecs); with --labels and --queries.
    #[arg(long, requires_all = ["labels", "queries"])]
    pub train: Option<PathBuf>,
    /// Labels of the --train points, one integer per point (.npy, .csv, .ivecs).
    #[arg(long)]
    pub labels: Option<PathBuf>,
    /// Points to classify, same dimension as --train.
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
    #[command(flatten)]
    pub metric: MetricArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Output: the filled-in seed CSV (with --csv), else the predicted labels (.npy int64,
    /// .csv, .ivecs), one per query.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Format of the labels output, overriding the extension (npy, csv, ivecs).
    #[arg(long)]
    pub output_format: Option<String>,
    /// Also write class probabilities, rows × classes in ascending class order (.npy float32
    /// or .csv).
    #[arg(long)]
    pub proba: Option<PathBuf>,
    /// Replace output files that already exist (never an input file).
    #[arg(long)]
    pub force: bool,
    /// Run the classification N times and report the median (files are read once).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Write {"median_ms": .., "times_ms": [..]} of the classification to this file.
    #[arg(long)]
    pub timing_json: Option<PathBuf>,
}

/// Labelled points, labels, class list, points to classify.
struct Inputs {
    train: knn::Matrix,
    labels: Vec<i64>,
    classes: Option<Vec<i64>>,
    queries: knn::Matrix,
    /// The seed CSV's bytes, to fill in.
    csv: Option<Vec<u8>>,
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
            train: knn::Matrix::new(&name, train, f.dim)?,
            labels,
            classes: Some((0..f.classes as i64).collect()),
            // newels may be 0: an empty matrix of the right dimension.
            queries: knn::Matrix::new(&name, queries, f.dim)?,
            csv: Some(bytes),
        });
    }
    let (Some(t), Some(l), Some(q)) = (&a.train, &a.labels, &a.queries) else {
        bail!("give --csv FILE, or --train, --labels and --queries");
    };
    let fmt = parse_format(&a.input_format)?;
    let train = load_matrix(t, fmt)?;
    let labels = files::read_labels(l, fmt, train.rows())?;
    let queries = load_matrix(q, fmt)?;
    Ok(Inputs {
        train,
        labels,
        classes: None,
        queries,
        csv: None,
    })
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// `knn classify`.
pub fn classify(a: &ClassifyArgs, quiet: bool) -> Result<ExitCode> {
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
    let output_format = parse_format(&a.output_format)?;
    let input = read_inputs(a)?;
    let mut clf = Classifier::with_engine(params, engine(&a.engine)?)?;
    let train = input.train.view();
    match &input.classes {
        Some(c) => clf.fit_with_classes(train, &input.labels, c)?,
        None => clf.fit(train, &input.labels)?,
    }
    let queries: MatrixRef<'_> = input.queries.view();
    let mut times = Vec::new();
    let mut result: Option<Prediction> = None;
    for _ in 0..a.repeat.max(1) {
        let t = Instant::now();
        result = Some(clf.classify(queries, a.proba.is_some())?);
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let p = result.expect("at least one run");
    let med = median(&times);
    if let Some(path) = &a.timing_json {
        let list: Vec<String> = times.iter().map(|t| format!("{t:.4}")).collect();
        std::fs::write(
            path,
            format!(
                "{{\"median_ms\": {med:.4}, \"times_ms\": [{}]}}\n",
                list.join(", ")
            ),
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(out) = &a.output {
        match (&input.csv, &a.csv) {
            (Some(bytes), Some(csv)) => {
                let filled = fill_predictions(bytes, &csv.display().to_string(), &p.labels)?;
                knn_classify::write_atomically(out, &filled)?;
            }
            _ => files::write_labels(out, output_format, &p.labels)?,
        }
    }
    if let (Some(path), Some(proba)) = (&a.proba, &p.proba) {
        files::write_proba(path, None, p.classes.len(), proba)?;
    }
    if !quiet {
        let runs = if times.len() > 1 {
            format!(" (median of {})", times.len())
        } else {
            String::new()
        };
        let waves = if mode == Mode::Sequential {
            format!(
                "; {} waves (largest {}), {} rows widened, {} scanned",
                p.stats.waves, p.stats.largest_wave, p.stats.widened, p.stats.scanned
            )
        } else {
            String::new()
        };
        eprintln!(
            "classify: {} new × {} labelled (d={}), {} classes, k={}, {} weights, {mode}, {} on {}: {med:.1} ms{runs}{waves}",
            queries.rows(),
            train.rows(),
            train.dim(),
            p.classes.len(),
            a.k,
            weights,
            clf.params().metric,
            clf.engine_name(),
        );
        match &a.output {
            Some(o) => eprintln!("classify: written to {}", o.display()),
            None => eprintln!("classify: no --output given, results not written"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

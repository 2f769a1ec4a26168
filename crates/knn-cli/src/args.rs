//! Command-line arguments: every flag documented here is what `--help` shows.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Exact k-nearest neighbours on CPUs and NVIDIA GPUs.
///
/// Every answer is exact: each row holds a true k-nearest set, ordered by (distance, id),
/// the same on every device and thread count. Start with `knn bench` (a timed run on random
/// data) or `knn search --help`.
#[derive(Parser, Debug)]
#[command(name = "knn", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// No progress bar and no summary line.
    #[arg(long, global = true)]
    pub quiet: bool,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// k nearest base points of every query.
    Search(SearchArgs),
    /// kNN graph: the k nearest other points of every point (its own id excluded).
    Graph(GraphArgs),
    /// Write synthetic data (uniform, gaussian, clustered) in any supported format.
    Generate(GenerateArgs),
    /// Compare a result file with ground truth (ids file, or recomputed exactly from the data).
    Verify(VerifyArgs),
    /// The seed-000 experiment: one row per method and device, timed and checked.
    Bench(BenchArgs),
    /// Label new points by the classes of their k nearest labelled points (seed 003).
    Classify(crate::classify::ClassifyArgs),
    /// Version, devices, threads, SIMD level and the CPU engine's fast paths.
    Info,
}

/// Where and how to compute.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Device: auto (a GPU if usable, else the CPU), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// CPU threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// How the neighbours are found (the answer is the same; the speed differs): auto (the
    /// fastest for the data: grid for 1 to 3 dimensions, else brute), brute (compares every
    /// query with every base point; best for more than 3 dimensions), grid (sorts the base
    /// points into cells and searches the nearby cells first; best for 1 to 3 dimensions with
    /// l2, sqeuclidean, l1 or linf), or global, texture, cublas (the three GPU programs of
    /// seed 000, kept to compare against).
    #[arg(long, default_value = "auto")]
    pub method: String,
    /// Several GPUs at once: all, or CUDA ordinals such as 0,2,3. A search of a base from
    /// 256 MiB gives each GPU a part of the base (every query is searched in every part, the
    /// lists merged); a graph computed symmetrically gives each GPU a share of its pairs (every
    /// point's lists merged from the GPUs' parts); anything else gives each GPU rounds of
    /// queries. The answer is identical to one GPU's.
    #[arg(long, conflicts_with = "device")]
    pub devices: Option<String>,
    /// Cap on the GPU memory used for tiles, e.g. 2GiB, 512MiB, 1e9 (default: 70 % of free
    /// memory). Inputs beyond it are streamed from host memory in tiles.
    #[arg(long)]
    pub gpu_memory: Option<String>,
}

/// The distance.
#[derive(Args, Debug, Clone)]
pub struct MetricArgs {
    /// Metric: l2 (euclidean), sqeuclidean, ip (inner product, largest first), cosine,
    /// l1 (manhattan), linf (chebyshev), hellinger (inputs >= 0), mahalanobis. Default: l2,
    /// or what an HDF5 input's `distance` attribute says (ann-benchmarks: euclidean is l2,
    /// angular is cosine).
    #[arg(long, short = 'm', value_name = "METRIC")]
    pub metric: Option<String>,
    /// For mahalanobis: a d×d covariance file (default: estimated from the base points).
    #[arg(long)]
    pub covariance: Option<PathBuf>,
    /// Your own distance, instead of --metric: 'ACCUMULATION' or 'ACCUMULATION ; FINAL'. The
    /// accumulation runs over the coordinates in order with acc (the running value, from 0),
    /// x (the query's coordinate) and y (the base point's); the smallest final acc is the
    /// nearest. FINAL (acc only, non-decreasing) maps it to the reported distance. It takes
    /// numbers, the operators + - * / and ^n (whole n from 0 to 64), and abs, sqrt, exp, log
    /// (natural), min, max. Examples: 'acc + abs(x - y)' (l1), 'max(acc, abs(x - y))' (linf),
    /// 'acc + (x - y)^2 ; sqrt(acc)' (l2), 'acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)'
    /// (hellinger). Exact like every metric; data on which it is undefined (sqrt of a negative
    /// value, a divisor that can be 0, values beyond the f32 range) is refused, naming the
    /// column of the operation.
    #[arg(long, value_name = "EXPR", conflicts_with = "metric")]
    pub metric_expr: Option<String>,
}

/// How CSV and other text inputs are read.
#[derive(Args, Debug, Clone, Default)]
pub struct TextArgs {
    /// The first line of text inputs holds column names: skip it. Without --header or
    /// --no-header, the first line is skipped only when none of its fields is a number.
    #[arg(long, conflicts_with = "no_header")]
    pub header: bool,
    /// The first line of text inputs is data, even when it holds no number (then it is an
    /// error naming the field).
    #[arg(long)]
    pub no_header: bool,
    /// What separates the values on a line of a text input: ',' ';' '|' (any one character),
    /// tab, or space (runs of spaces and tabs, as NumPy's savetxt writes). Default: found from
    /// the first lines (comma, tab, semicolon or spaces).
    #[arg(long, value_name = "CHAR")]
    pub delimiter: Option<String>,
}

/// Timed runs.
#[derive(Args, Debug, Clone)]
pub struct TimingArgs {
    /// Run the computation N times and report the median (files are read once; search and
    /// graph build their index in the first run and search it again in the later ones).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Write {"median_ms": .., "times_ms": [..]} of the computation to this file.
    #[arg(long)]
    pub timing_json: Option<PathBuf>,
}

/// Where results go.
#[derive(Args, Debug, Clone)]
pub struct OutputArgs {
    /// Output file for the neighbour ids (.npy int64, .ivecs or .csv); its name says the
    /// format. Distances go to `--distances`, by default next to it as <stem>.dist.npy /
    /// <stem>.fvecs / <stem>.dist.csv. `-` writes to standard output (CSV unless
    /// --output-format says otherwise; in CSV each row holds the k ids, then the k distances);
    /// devices and pipes such as /dev/stdout are written through, never replaced.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Output file for the distances (.npy, .fvecs or .csv): float32, or float64 when an
    /// input holds float64 values (.npy float64 or .csv only).
    #[arg(long)]
    pub distances: Option<PathBuf>,
    /// Output format (npy, ivecs, csv) for standard output and names without one of these
    /// extensions; a name that says a format must agree with it.
    #[arg(long)]
    pub output_format: Option<String>,
    /// Replace output files that already exist (never an input file).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub timing: TimingArgs,
    /// Save finished rows to this file as the work goes; rerunning the same command resumes
    /// from it (same result as an uninterrupted run). Ctrl-C stops cleanly with it saved. It is
    /// removed once the results are written.
    #[arg(long, value_name = "FILE")]
    pub checkpoint: Option<PathBuf>,
    /// Test hook: with --checkpoint, stop as Ctrl-C would after N saved chunks.
    #[arg(long, hide = true, value_name = "N")]
    pub checkpoint_stop_after: Option<usize>,
}

/// How float64 inputs are computed on (search and graph).
#[derive(Args, Debug, Clone, Copy)]
pub struct PrecisionArgs {
    /// Compute on the float32 rounding of float64 inputs (float64 .npy or HDF5 data, CSV and
    /// other text, whose decimal numbers are read as float64). Without it such inputs are
    /// kept exact: the answer is exact for the float64 values and distances are written in
    /// float64. The mahalanobis metric and --metric-expr take float32 values and need it for
    /// float64 inputs.
    #[arg(long)]
    pub float32: bool,
}

#[derive(Args, Debug)]
pub struct SearchArgs {
    /// Base points (.fvecs, .bvecs, .ivecs, .npy, .csv, .hdf5); `-` reads standard input (npy
    /// or CSV, or the --input-format). From an HDF5 file its dataset `train` (ann-benchmarks),
    /// or the one named as FILE.hdf5:NAME.
    #[arg(long, short = 'b')]
    pub base: PathBuf,
    /// Query points, same dimension as the base (a 2-D array: one row per query); `-` reads
    /// standard input. From an HDF5 file its dataset `test`, or FILE.hdf5:NAME.
    #[arg(long, short = 'q')]
    pub queries: PathBuf,
    /// Neighbours per query (1 ..= number of base points).
    #[arg(short = 'k', long)]
    pub k: usize,
    /// Input format, overriding the extensions (fvecs, ivecs, bvecs, npy, csv).
    #[arg(long)]
    pub input_format: Option<String>,
    #[command(flatten)]
    pub text: TextArgs,
    #[command(flatten)]
    pub precision: PrecisionArgs,
    #[command(flatten)]
    pub metric: MetricArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Args, Debug)]
pub struct GraphArgs {
    /// The points (.fvecs, .bvecs, .ivecs, .npy, .csv, .hdf5: its dataset `train`, or the one
    /// named as FILE.hdf5:NAME).
    #[arg(long, short = 'p')]
    pub points: PathBuf,
    /// Neighbours per point (1 ..= points − 1).
    #[arg(short = 'k', long)]
    pub k: usize,
    /// Input format, overriding the extension.
    #[arg(long)]
    pub input_format: Option<String>,
    #[command(flatten)]
    pub text: TextArgs,
    #[command(flatten)]
    pub precision: PrecisionArgs,
    /// Compute each unordered pair once and fold it into both points' lists: auto (wherever
    /// it was measured faster: on the CPU 64 points or more, its lists under 1 GiB, and not
    /// l2-type metrics at d <= 64 on CPUs with the int8 kernel; on one GPU 10 000 points or
    /// more for the l2-type, inner-product, cosine and hellinger metrics with d a multiple of
    /// 4, else 40 000 points or more with k above about 25, or l1/linf), on, or off. Same
    /// answer either way. A graph computed with
    /// --checkpoint goes in pieces, one-sided; with several GPUs each takes whole rounds,
    /// one-sided.
    #[arg(long, default_value = "auto", value_name = "auto|on|off")]
    pub symmetric: String,
    #[command(flatten)]
    pub metric: MetricArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Number of points.
    #[arg(long, short = 'n')]
    pub rows: usize,
    /// Dimension.
    #[arg(long, short = 'd')]
    pub dim: usize,
    /// uniform (in [0,1)), gaussian (standard normal) or clustered (100 gaussian blobs, sd 0.01).
    #[arg(long, default_value = "uniform")]
    pub distribution: String,
    /// Random seed (same seed, same data, on every machine).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write seed 003's classification CSV instead: header `numels,newels,classes,dim`, rows
    /// of coordinates uniform in [-100, 100] and a class in [0, C), a share of them (see
    /// --new-share) marked -1 (to classify). The output must be a .csv file.
    #[arg(long, value_name = "C")]
    pub classes: Option<usize>,
    /// With --classes: the share of rows marked -1 (rounded to whole rows).
    #[arg(long, default_value_t = 0.1, requires = "classes")]
    pub new_share: f64,
    /// Output file (.fvecs, .npy, .csv).
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    /// Output format, overriding the extension.
    #[arg(long)]
    pub format: Option<String>,
    /// Replace the output file if it exists.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// Result ids to check (as written by `knn search -o`).
    #[arg(long, short = 'r')]
    pub result: PathBuf,
    /// Result distances (default: next to the ids, as written by `knn search`).
    #[arg(long)]
    pub result_distances: Option<PathBuf>,
    /// Ground-truth ids (.ivecs, .npy, .csv): id recall of the first k columns. An HDF5 file
    /// (ann-benchmarks) gives its `neighbors` and `distances`: a result id the truth lists
    /// after the k-th still counts when its true distance ties the k-th (within 1e-3, as
    /// ann-benchmarks counts ties).
    #[arg(long, short = 't')]
    pub truth: Option<PathBuf>,
    /// Base points: recompute the truth exactly (f64 oracle) and check tie-aware (HDF5: its
    /// `train`).
    #[arg(long, short = 'b')]
    pub base: Option<PathBuf>,
    /// Query points (with --base; HDF5: its `test`); omit for a graph (self-join) result.
    #[arg(long, short = 'q')]
    pub queries: Option<PathBuf>,
    /// Required recall (0..1) for exit code 0.
    #[arg(long, default_value_t = 1.0)]
    pub min_recall: f64,
    #[command(flatten)]
    pub text: TextArgs,
    /// Check against the float32 rounding of float64 inputs (float64 .npy or HDF5 data,
    /// text), as a search run with --float32 computed. Without it the check is against the
    /// float64 values: an answer computed on their float32 rounding fails where the rounding
    /// changed it.
    #[arg(long)]
    pub float32: bool,
    #[command(flatten)]
    pub metric: MetricArgs,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Reference (base) points.
    #[arg(long, default_value_t = 16384)]
    pub refs: usize,
    /// Query points.
    #[arg(long, default_value_t = 4096)]
    pub queries: usize,
    /// Dimension.
    #[arg(long, short = 'd', default_value_t = 128)]
    pub dim: usize,
    /// Neighbours.
    #[arg(short = 'k', long, default_value_t = 16)]
    pub k: usize,
    /// Timed runs per method (median reported), after one warm-up.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Metric (the seed uses l2).
    #[arg(long, short = 'm', default_value = "l2")]
    pub metric: String,
    /// Which devices: all (every usable one), cpu, cuda.
    #[arg(long, default_value = "all")]
    pub devices: String,
    /// Random seed of the data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

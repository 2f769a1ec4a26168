//! `knn search`, `knn graph` and `knn verify`.

use crate::args::{EngineArgs, GraphArgs, MetricArgs, OutputArgs, SearchArgs, VerifyArgs};
use crate::checkpoint::{self, chunk_rows, Checkpointed};
use crate::data::{
    data_from, input_options, load_data, load_matrix, parse_format, Data, BASE_DATASET,
    QUERY_DATASET,
};
use crate::output::{distances_path, is_std_stream, Distance, Plan};
use crate::progress::Progress;
use crate::timing::{self, timed};
use anyhow::{bail, Context, Result};
use knn::{
    CheckReport, Covariance, Device, Index, Knn, KnnError, Method, Metric, MetricExpr, Neighbors,
    Options, Symmetry,
};
use knn_io::{Format, IoError, ReadOptions};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

pub fn metric(a: &MetricArgs) -> Result<Metric> {
    if let Some(text) = &a.metric_expr {
        if a.covariance.is_some() {
            bail!("--covariance is only for --metric mahalanobis, not --metric-expr");
        }
        let e = MetricExpr::parse(text).map_err(|e| anyhow::anyhow!("metric expression: {e}"))?;
        return Ok(Metric::Expr(Arc::new(e)));
    }
    let m: Metric = a.metric.as_deref().unwrap_or("l2").parse()?;
    match (&m, &a.covariance) {
        (Metric::Mahalanobis(_), Some(p)) => {
            let c = load_matrix(p, None).context("covariance")?;
            Ok(Metric::Mahalanobis(Covariance::Given(Arc::new(c))))
        }
        (_, Some(_)) => bail!("--covariance is only for --metric mahalanobis"),
        _ => Ok(m),
    }
}

/// [`metric`], where the `distance` attribute of HDF5 inputs (ann-benchmarks) is the default
/// when neither `-m` nor `--metric-expr` is given.
fn metric_for(a: &MetricArgs, inputs: &[&Path]) -> Result<Metric> {
    if a.metric.is_none() && a.metric_expr.is_none() {
        if let Some(name) = crate::data::metric_of_inputs(inputs)? {
            return metric(&MetricArgs {
                metric: Some(name),
                ..a.clone()
            });
        }
    }
    metric(a)
}

pub fn engine(a: &EngineArgs) -> Result<Knn> {
    engine_with_symmetry(a, Symmetry::Auto)
}

/// [`engine`] with the symmetric mode of `knn graph`.
fn engine_with_symmetry(a: &EngineArgs, symmetric: Symmetry) -> Result<Knn> {
    let opts = options(a, symmetric)?;
    let knn = Knn::new(&opts)?;
    gpu_memory_note(&opts, knn.device());
    Ok(knn)
}

/// What the engine flags say, as the library's options.
fn options(a: &EngineArgs, symmetric: Symmetry) -> Result<Options> {
    let device: Device = a.device.parse()?;
    let method: Method = a.method.parse()?;
    let gpu_memory = a.gpu_memory.as_deref().map(parse_bytes).transpose()?;
    let gpus = match a.devices.as_deref() {
        None => Vec::new(),
        Some(list) => knn::parse_gpus(list).context("--devices")?,
    };
    Ok(Options {
        device,
        threads: a.threads,
        method,
        gpu_memory,
        gpus,
        symmetric,
    })
}

/// A note when `--gpu-memory` was given but no GPU is in use.
fn gpu_memory_note(opts: &Options, used: Device) {
    if opts.device == Device::Auto && used == Device::Cpu && opts.gpu_memory.is_some() {
        eprintln!(
            "note: no usable GPU ({}), --gpu-memory ignored",
            knn::gpu_status()
        );
    }
}

/// Parses a byte count: `2GiB`, `512MiB`, `64KiB`, `1GB`, `1e9` or plain bytes.
pub fn parse_bytes(s: &str) -> Result<usize> {
    let t = s.trim();
    let split = t
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => (1u64 << 20) as f64,
        "gib" => (1u64 << 30) as f64,
        "tib" => (1u64 << 40) as f64,
        u => bail!("'{s}': unknown size unit '{u}' (B, KB, MB, GB, KiB, MiB, GiB, TiB)"),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("'{s}' is not a size (e.g. 2GiB, 512MiB, 1e9)"))?;
    let bytes = v * mult;
    if !bytes.is_finite() || bytes < 1.0 || bytes > usize::MAX as f64 {
        bail!("'{s}': a size must be at least 1 byte");
    }
    Ok(bytes as usize)
}

/// Where the results go, checked before any work (see [`Plan::new`]).
fn plan(out: &OutputArgs, inputs: &[&Path]) -> Result<Option<Plan>> {
    out.output
        .as_deref()
        .map(|o| {
            Plan::new(
                o,
                out.distances.as_deref(),
                parse_format(&out.output_format)?,
                out.force,
                inputs,
            )
        })
        .transpose()
}

#[allow(clippy::too_many_arguments)]
fn finish<D: Distance>(
    what: &str,
    unit: &str,
    nn: &Neighbors<D>,
    times: &[f64],
    out: &OutputArgs,
    plan: Option<Plan>,
    quiet: bool,
    describe: String,
) -> Result<ExitCode> {
    let (med, runs) = timing::summary(times, out.timing.timing_json.as_deref())?;
    let written = plan.map(|p| p.write(nn)).transpose()?;
    if let (Some(c), Some(_)) = (&out.checkpoint, &written) {
        checkpoint::remove(c);
    }
    if !quiet {
        let rate = nn.rows() as f64 / (med / 1e3);
        eprintln!("{what}: {describe}: {med:.1} ms{runs}, {rate:.0} {unit}/s");
        match written {
            Some(where_) => eprintln!("{what}: {where_}"),
            None => eprintln!("{what}: no --output given, results not written"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the whole computation (`repeat` times), or, with `--checkpoint`, the rows in saved
/// chunks (`rows_of(range)`). `None`: stopped by Ctrl-C with the checkpoint saved.
#[allow(clippy::too_many_arguments)]
fn compute<D: Distance>(
    what: &str,
    out: &OutputArgs,
    rows: usize,
    k: usize,
    fingerprint: impl FnOnce() -> Result<u64>,
    inputs: &[&Path],
    quiet: bool,
    rows_of: impl Fn(std::ops::Range<usize>, &Progress) -> knn::Result<Neighbors<D>>,
) -> Result<Option<(Neighbors<D>, Vec<f64>)>> {
    let progress = Progress::new(what, rows, quiet);
    let Some(path) = &out.checkpoint else {
        let r = timed(out.timing.repeat, || rows_of(0..rows, &progress))?;
        progress.finish();
        return Ok(Some(r));
    };
    if out.timing.repeat > 1 {
        bail!("--checkpoint runs the computation once: leave out --repeat");
    }
    if inputs.iter().any(|p| is_std_stream(p)) {
        bail!("--checkpoint needs input files: standard input cannot be read again to resume");
    }
    let canon = |p: &Path| std::fs::canonicalize(p).ok();
    if canon(path).is_some() && inputs.iter().any(|i| canon(i) == canon(path)) {
        bail!("{}: the checkpoint cannot be an input file", path.display());
    }
    let state = Checkpointed::<D>::open(path, fingerprint()?, rows, k)?;
    if state.done() > 0 && !quiet {
        eprintln!(
            "{what}: resuming from {}: {} of {rows} rows already done",
            path.display(),
            state.done()
        );
    }
    let t = Instant::now();
    let stop_after = out.checkpoint_stop_after;
    let result = state.run(chunk_rows(rows), stop_after, |r| rows_of(r, &progress))?;
    progress.finish();
    Ok(result.map(|nn| (nn, vec![t.elapsed().as_secs_f64() * 1e3])))
}

/// The metric as the checkpoint fingerprint sees it (the covariance file is an input), and
/// the precision of a float64 run (its checkpoint holds float64 distances).
fn metric_tag<D: Distance>(a: &MetricArgs) -> String {
    let metric = match &a.metric_expr {
        Some(e) => format!("expr:{e}"),
        None => a.metric.as_deref().unwrap_or("l2").to_ascii_lowercase(),
    };
    match D::BYTES {
        4 => metric,
        _ => format!("{metric}|{}", D::NAME),
    }
}

/// Reads the points of `path` for search and graph in the precision of the file (see
/// [`Data`]; `float32`: rounded to float32); `-` is standard input (read whole, at most once:
/// `stdin_taken`). A 1-D npy array is refused with scikit-learn's hint.
pub fn read_points(
    path: &Path,
    options: &ReadOptions,
    float32: bool,
    stdin_taken: &mut bool,
) -> Result<Data> {
    let format = options.format;
    if !is_std_stream(path) {
        if let Ok(dims) = knn_io::array_dims(path, format) {
            refuse_one_d(dims, &path.display().to_string())?;
        }
        return load_data(path, options, float32).map_err(input_format_hint);
    }
    if std::mem::replace(stdin_taken, true) {
        bail!("only one input can be read from standard input (-); give the other as a file");
    }
    let name = "standard input";
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut bytes)
        .context("reading standard input")?;
    let format = match format {
        Some(f) => f,
        None if bytes.starts_with(b"\x93NUMPY") => Format::Npy,
        None if !bytes.iter().take(1 << 16).any(|&b| b == 0) => Format::Csv,
        None => bail!(
            "standard input: neither an npy file nor text; give --input-format \
             (fvecs, ivecs, bvecs, npy, csv)"
        ),
    };
    refuse_one_d(knn_io::array_dims_from_bytes(&bytes, format, name), name)?;
    if float32 {
        let t = match format {
            Format::Csv => knn_io::read_csv_f32_from_bytes(&bytes, &options.csv, name)?,
            _ => knn_io::read_f32_from_bytes(&bytes, format, name)?,
        };
        return data_from(knn_io::Values::F32(t), name);
    }
    data_from(
        knn_io::read_values_from_bytes(&bytes, format, &options.csv, name)?,
        name,
    )
}

/// A float64 run: refuses the metrics that take float32 values (Mahalanobis, expressions)
/// with the fix, and a distances file that cannot hold float64, before any work.
fn check_float64(metric: &Metric, plan: Option<&Plan>, inputs: &[(&Path, &Data)]) -> Result<()> {
    let files: Vec<String> = inputs
        .iter()
        .filter(|(_, d)| d.is_f64())
        .map(|(p, _)| {
            if is_std_stream(p) {
                "standard input".to_owned()
            } else {
                p.display().to_string()
            }
        })
        .collect();
    let hold = if files.len() == 1 { "holds" } else { "hold" };
    let files = files.join(" and ");
    knn::given::check_given(metric, true).map_err(|e| {
        anyhow::anyhow!(
            "{e}. {files} {hold} float64 values (float64 .npy or HDF5 data, or decimal text): \
             give --float32 to compute on their float32 rounding"
        )
    })?;
    if let Some(plan) = plan {
        plan.check_float64(&files)?;
    }
    Ok(())
}

/// The index of a search or graph run (`knn search`/`graph` build one, in the precision of
/// the inputs), built at the first computation that needs it: the first run's time includes
/// building it (checking, preparing and placing the base on its device), as a one-off search
/// does; later runs (`--repeat`, checkpoint chunks) search the same index.
struct LazyIndex {
    rows: std::sync::Mutex<Option<knn::Rows>>,
    dim: usize,
    metric: Metric,
    opts: Options,
    index: std::sync::OnceLock<Index>,
}

impl LazyIndex {
    fn new(rows: knn::Rows, dim: usize, metric: &Metric, opts: Options) -> LazyIndex {
        LazyIndex {
            rows: std::sync::Mutex::new(Some(rows)),
            dim,
            metric: metric.clone(),
            opts,
            index: std::sync::OnceLock::new(),
        }
    }

    /// The index, built now if it is not yet.
    fn get(&self) -> knn::Result<&Index> {
        if let Some(index) = self.index.get() {
            return Ok(index);
        }
        let rows = self.rows.lock().map(|mut r| r.take()).ok().flatten();
        let rows = rows.ok_or_else(|| KnnError::Option("the index could not be built".into()))?;
        let index = Index::new(rows, self.dim, self.metric.clone(), &self.opts)?;
        gpu_memory_note(&self.opts, index.device());
        Ok(self.index.get_or_init(|| index))
    }

    /// How and where it computed, in the user's words ("brute force on the CPU", "exact grid
    /// on GPU 0").
    fn in_words(&self) -> String {
        match self.index.get().map(Index::engine_name) {
            Some(Ok(name)) => in_words(&name),
            _ => "not computed".to_owned(),
        }
    }
}

/// A 1-D array is refused as scikit-learn refuses it: one point or one coordinate per point?
pub fn refuse_one_d(dims: Option<usize>, name: &str) -> Result<()> {
    if dims == Some(1) {
        bail!(
            "{name}: Expected 2D array, got 1D array instead. Reshape your data either using \
             array.reshape(-1, 1) if your data has a single feature or array.reshape(1, -1) if \
             it contains a single sample."
        );
    }
    Ok(())
}

/// Points an unknown input extension to `--input-format`.
pub fn input_format_hint(e: anyhow::Error) -> anyhow::Error {
    match e.downcast_ref::<IoError>() {
        Some(io @ IoError::UnknownFormat { .. }) => anyhow::anyhow!(
            "{}",
            io.to_string().replace(
                "name the format explicitly",
                "name it with --input-format (fvecs, ivecs, bvecs, npy, csv)"
            )
        ),
        _ => e,
    }
}

/// Names the file behind a Hellinger negative-value error (the engine knows "base" and
/// "queries" only).
fn name_the_file(e: anyhow::Error, base: &Path, queries: &Path) -> anyhow::Error {
    let Some(KnnError::Negative {
        what,
        row,
        col,
        value,
    }) = e.downcast_ref::<KnnError>()
    else {
        return e;
    };
    let file = match what.as_str() {
        "base" => base,
        "queries" => queries,
        _ => return e,
    };
    let file = if is_std_stream(file) {
        "standard input".to_owned()
    } else {
        file.display().to_string()
    };
    anyhow::anyhow!(
        "{file}: row {row}, column {col} is {value}, but the Hellinger distance needs values >= 0 \
         (it compares distributions: counts, frequencies, histograms)"
    )
}

/// A method (of `--method`, or of an engine's name) in the user's words.
fn method_in_words(m: &str) -> &str {
    match m {
        "cpu" | "fused" | "brute" => "brute force",
        "grid" => "exact grid",
        "global" => "seed 000's global-memory kernel",
        "texture" => "seed 000's texture-memory kernel",
        "cublas" => "seed 000's cuBLAS kernel",
        other => other,
    }
}

/// The method and device of the engine named `name` in the user's words: "brute force on the
/// CPU", "exact grid on GPU 0", "brute force on GPUs 0, 1".
pub fn in_words(name: &str) -> String {
    let parts: Vec<&str> = name.split('+').collect();
    let method = method_in_words;
    let gpu = |p: &str| -> Option<(String, String)> {
        let rest = p.strip_prefix("cuda:")?;
        let (n, m) = rest.split_once('/').unwrap_or((rest, "fused"));
        Some((n.to_owned(), method(m).to_owned()))
    };
    match parts[..] {
        ["cpu"] => "brute force on the CPU".to_owned(),
        ["grid"] => "exact grid on the CPU".to_owned(),
        [one] => match gpu(one) {
            Some((n, m)) => format!("{m} on GPU {n}"),
            None => one.to_owned(),
        },
        _ => {
            let gpus: Option<Vec<(String, String)>> = parts.iter().map(|p| gpu(p)).collect();
            match gpus {
                Some(g) => format!(
                    "{} on GPUs {}",
                    g[0].1,
                    g.iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => name.to_owned(),
            }
        }
    }
}

pub fn search(a: &SearchArgs, quiet: bool) -> Result<ExitCode> {
    let base_options = input_options(&a.input_format, &a.text, Some(BASE_DATASET))?;
    let query_options = input_options(&a.input_format, &a.text, Some(QUERY_DATASET))?;
    let mut inputs: Vec<&Path> = vec![&a.base, &a.queries];
    inputs.extend(a.metric.covariance.as_deref());
    let plan = plan(&a.out, &inputs)?;
    if is_std_stream(&a.base) && is_std_stream(&a.queries) {
        bail!("only one input can be read from standard input (-); give the other as a file");
    }
    let mut stdin_taken = false;
    let float32 = a.precision.float32;
    let base = read_points(&a.base, &base_options, float32, &mut stdin_taken)?;
    let queries = read_points(&a.queries, &query_options, float32, &mut stdin_taken)?;
    let metric = metric_for(&a.metric, &[&a.base, &a.queries])?;
    let f64_run = base.is_f64() || queries.is_f64();
    if f64_run {
        check_float64(
            &metric,
            plan.as_ref(),
            &[(&a.base, &base), (&a.queries, &queries)],
        )?;
    }
    let (nb, nq, dim) = (base.rows(), queries.rows(), base.dim());
    if queries.dim() != dim {
        return Err(KnnError::DimMismatch {
            base: dim,
            queries: queries.dim(),
        }
        .into());
    }
    let index = LazyIndex::new(
        base.into_rows(),
        dim,
        &metric,
        options(&a.engine, Symmetry::Auto)?,
    );
    let run = Run {
        what: "search",
        unit: "queries",
        out: &a.out,
        rows: nq,
        k: a.k,
        metric_args: &a.metric,
        inputs: &inputs,
        quiet,
    };
    let describe = |precision: &str| {
        format!(
            "{nq} queries × {nb} base points (d={dim}), k={}, {metric}, {}{precision}",
            a.k,
            index.in_words()
        )
    };
    let named = |e| name_the_file(e, &a.base, &a.queries);
    if f64_run {
        let q = queries.to_f64();
        run.go(
            plan,
            named,
            |r, progress| {
                let offset = r.start;
                index
                    .get()?
                    .search_f64(&q[r.start * dim..r.end * dim], a.k, &|d, _| {
                        progress.update(offset + d, nq)
                    })
            },
            || describe(", float64 values"),
        )
    } else {
        let Data::F32(queries) = queries else {
            unreachable!("float32 queries")
        };
        run.go(
            plan,
            named,
            |r, progress| {
                let offset = r.start;
                let q = queries.view().slice_rows(r.start, r.end);
                index
                    .get()?
                    .search_with_progress(q, a.k, &|d, _| progress.update(offset + d, nq))
            },
            || describe(""),
        )
    }
}

pub fn graph(a: &GraphArgs, quiet: bool) -> Result<ExitCode> {
    let mut inputs: Vec<&Path> = vec![&a.points];
    inputs.extend(a.metric.covariance.as_deref());
    let plan = plan(&a.out, &inputs)?;
    let options = input_options(&a.input_format, &a.text, Some(BASE_DATASET))?;
    let points = read_points(&a.points, &options, a.precision.float32, &mut false)?;
    let metric = metric_for(&a.metric, &[&a.points])?;
    let symmetric: Symmetry = a.symmetric.parse().context("--symmetric")?;
    let f64_run = points.is_f64();
    if f64_run {
        check_float64(&metric, plan.as_ref(), &[(&a.points, &points)])?;
    }
    let (n, dim) = (points.rows(), points.dim());
    let opts = self::options(&a.engine, symmetric)?;
    let index = LazyIndex::new(points.into_rows(), dim, &metric, opts);
    let run = Run {
        what: "graph",
        unit: "points",
        out: &a.out,
        rows: n,
        k: a.k,
        metric_args: &a.metric,
        inputs: &inputs,
        quiet,
    };
    let describe = |precision: &str| {
        format!(
            "{n} points (d={dim}), k={}, {metric}, {}{precision}",
            a.k,
            index.in_words()
        )
    };
    let named = |e| name_the_file(e, &a.points, &a.points);
    if f64_run {
        run.go(
            plan,
            named,
            |r, progress| {
                let offset = r.start;
                index
                    .get()?
                    .graph_rows_f64(r, a.k, &|d, _| progress.update(offset + d, n))
            },
            || describe(", float64 values"),
        )
    } else {
        run.go(
            plan,
            named,
            |r, progress| {
                let offset = r.start;
                index
                    .get()?
                    .graph_rows(r, a.k, &|d, _| progress.update(offset + d, n))
            },
            || describe(""),
        )
    }
}

/// What a search or graph run computes and where its results go, for [`Run::go`].
struct Run<'a> {
    what: &'a str,
    unit: &'a str,
    out: &'a OutputArgs,
    rows: usize,
    k: usize,
    metric_args: &'a MetricArgs,
    inputs: &'a [&'a Path],
    quiet: bool,
}

impl Run<'_> {
    /// Computes the rows (`rows_of`, see [`compute`]), names the input file in its errors
    /// (`named`), writes the results and the summary (`describe`). Exit code 130: stopped by
    /// Ctrl-C with the checkpoint saved.
    fn go<D: Distance>(
        &self,
        plan: Option<Plan>,
        named: impl Fn(anyhow::Error) -> anyhow::Error,
        rows_of: impl Fn(std::ops::Range<usize>, &Progress) -> knn::Result<Neighbors<D>>,
        describe: impl FnOnce() -> String,
    ) -> Result<ExitCode> {
        let fingerprint = || {
            let tag = metric_tag::<D>(self.metric_args);
            checkpoint::fingerprint(self.what, self.k, &tag, self.inputs)
        };
        let computed = compute(
            self.what,
            self.out,
            self.rows,
            self.k,
            fingerprint,
            self.inputs,
            self.quiet,
            rows_of,
        )
        .map_err(named)?;
        let Some((nn, times)) = computed else {
            return Ok(ExitCode::from(130));
        };
        let (what, unit) = (self.what, self.unit);
        finish(
            what,
            unit,
            &nn,
            &times,
            self.out,
            plan,
            self.quiet,
            describe(),
        )
    }
}

/// A result file: its ids, and its distances (float32 or float64, as written) in f64.
fn read_result(ids: &Path, dists: Option<&Path>) -> Result<Neighbors<f64>> {
    let t = knn_io::read_i64(ids, None)?;
    let ids_format = Format::from_path(ids)?;
    let dpath = dists
        .map(Path::to_path_buf)
        .unwrap_or_else(|| distances_path(ids, ids_format));
    let d = knn_io::read_f64(&dpath, None)
        .with_context(|| format!("result distances {}", dpath.display()))?;
    if (d.rows, d.cols) != (t.rows, t.cols) {
        bail!(
            "{} is {}×{} but {} is {}×{}",
            ids.display(),
            t.rows,
            t.cols,
            dpath.display(),
            d.rows,
            d.cols
        );
    }
    let mut out = Vec::with_capacity(t.data.len());
    for (i, &v) in t.data.iter().enumerate() {
        let id = u32::try_from(v).map_err(|_| {
            anyhow::anyhow!(
                "{}: row {}, column {}: id {v} is not a valid point id",
                ids.display(),
                i / t.cols.max(1),
                i % t.cols.max(1)
            )
        })?;
        out.push(id);
    }
    Ok(Neighbors {
        k: t.cols,
        ids: out,
        distances: d.data,
    })
}

pub fn verify(a: &VerifyArgs, quiet: bool) -> Result<ExitCode> {
    let result = read_result(&a.result, a.result_distances.as_deref())?;
    let k = result.k;
    let mut ok = true;
    if let Some(t) = &a.truth {
        let crate::data::Truth {
            ids: truth,
            distances,
        } = crate::data::load_truth(t)?;
        if truth.rows != result.rows() || truth.cols < k {
            bail!(
                "{} has {} rows of {} ids; the result has {} rows of k={}",
                t.display(),
                truth.rows,
                truth.cols,
                result.rows(),
                k
            );
        }
        let ids: Vec<u32> = truth
            .data
            .iter()
            .map(|&v| v.clamp(0, u32::MAX as i64) as u32)
            .collect();
        let result_ids = Neighbors::<f32> {
            k,
            ids: result.ids.clone(),
            distances: Vec::new(),
        };
        let recall = knn::id_recall(&result_ids, &ids, truth.cols);
        match &distances {
            Some(d) => {
                let with_ties = crate::data::recall_with_ties(&result, &truth, d);
                ok &= with_ties >= a.min_recall;
                println!(
                    "id recall against {}: {recall:.6}; with ties (ids the truth lists after \
                     the k-th, within {} of its distance, count too): {with_ties:.6}",
                    t.display(),
                    crate::data::TIE_EPSILON
                );
            }
            None => {
                ok &= recall >= a.min_recall;
                println!(
                    "id recall against {}: {recall:.6} (ties not recognised without the data)",
                    t.display()
                );
            }
        }
    }
    if let Some(b) = &a.base {
        // A 1-D array is refused as search refuses it (one point or one coordinate per point?).
        let load = |path: &Path, dataset: &str| -> Result<Data> {
            if let Ok(dims) = knn_io::array_dims(path, None) {
                refuse_one_d(dims, &path.display().to_string())?;
            }
            load_data(
                path,
                &input_options(&None, &a.text, Some(dataset))?,
                a.float32,
            )
        };
        let base = load(b, BASE_DATASET)?;
        let queries = a
            .queries
            .as_deref()
            .map(|q| load(q, QUERY_DATASET))
            .transpose()?;
        let mut inputs: Vec<&Path> = vec![b];
        inputs.extend(a.queries.as_deref());
        let metric = metric_for(&a.metric, &inputs)?;
        let mut files = vec![(b.as_path(), &base)];
        files.extend(a.queries.as_deref().zip(queries.as_ref()));
        let f64_rows = files.iter().any(|(_, d)| d.is_f64());
        if f64_rows {
            check_float64(&metric, None, &files)?;
        }
        if let Some(q) = &queries {
            if q.dim() != base.dim() {
                return Err(KnnError::DimMismatch {
                    base: base.dim(),
                    queries: q.dim(),
                }
                .into());
            }
        }
        let t0 = Instant::now();
        let rows = result.rows();
        let progress = Progress::new("verify: the exact truth", rows, quiet);
        let rep = CheckReport::of_given(
            base.given(),
            queries.as_ref().map(Data::given),
            base.dim(),
            k,
            &metric,
            &result,
            knn::DEFAULT_TOLERANCE,
            Some(&|done| progress.update(done, rows)),
        );
        progress.finish();
        let rep = rep?;
        ok &= rep.passed() && rep.recall >= a.min_recall;
        let values = if f64_rows { "float64 values, " } else { "" };
        println!(
            "exact check ({} rows, {metric}, {values}f64 oracle, {:.1} s): tie-aware recall {:.6}, worst distance error {:.3e} (relative), {} bad rows{}",
            rep.rows,
            t0.elapsed().as_secs_f64(),
            rep.recall,
            rep.max_distance_error,
            rep.bad_rows,
            rep.first_problem.map(|p| format!("; first: {p}")).unwrap_or_default()
        );
    }
    if a.truth.is_none() && a.base.is_none() {
        bail!("give --truth (ids) or --base [--queries] (recompute exactly) to verify against");
    }
    if !quiet {
        eprintln!("verify: {}", if ok { "PASSED" } else { "FAILED" });
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_bytes("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("512 MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1e9").unwrap(), 1_000_000_000);
        assert_eq!(parse_bytes("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        for bad in ["", "GiB", "-1GiB", "0", "2 parsecs", "1e999"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}

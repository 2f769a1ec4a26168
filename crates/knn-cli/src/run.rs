//! `knn search`, `knn graph` and `knn verify`.

use crate::args::{EngineArgs, GraphArgs, MetricArgs, OutputArgs, SearchArgs, VerifyArgs};
use crate::checkpoint::{self, chunk_rows, Checkpointed};
use crate::data::{
    input_options, load_matrix, load_points, parse_format, Points, BASE_DATASET, QUERY_DATASET,
};
use crate::output::{distances_path, is_std_stream, Plan};
use crate::progress::Progress;
use crate::timing::{self, timed};
use anyhow::{bail, Context, Result};
use knn::{
    Covariance, Device, Knn, KnnError, Method, Metric, MetricExpr, Neighbors, Options, Symmetry,
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
    let device: Device = a.device.parse()?;
    let method: Method = a.method.parse()?;
    let gpu_memory = a.gpu_memory.as_deref().map(parse_bytes).transpose()?;
    let gpus = match a.devices.as_deref() {
        None => Vec::new(),
        Some(list) => parse_gpus(list)?,
    };
    let knn = Knn::new(&Options {
        device,
        threads: a.threads,
        method,
        gpu_memory,
        gpus,
        symmetric,
    })?;
    if device == Device::Auto && knn.device() == Device::Cpu && gpu_memory.is_some() {
        eprintln!(
            "note: no usable GPU ({}), --gpu-memory ignored",
            knn::gpu_status()
        );
    }
    Ok(knn)
}

/// `all` (every usable GPU) or a comma list of CUDA ordinals.
fn parse_gpus(list: &str) -> Result<Vec<usize>> {
    let gpus: Vec<usize> = if list.trim() == "all" {
        knn::gpu_devices().into_iter().map(|(n, _)| n).collect()
    } else {
        list.split(',')
            .map(|s| {
                let s = s.trim();
                s.strip_prefix("cuda:").unwrap_or(s).parse().map_err(|_| {
                    anyhow::anyhow!("--devices: '{s}' is not a GPU number (e.g. 0,2,3 or all)")
                })
            })
            .collect::<Result<_>>()?
    };
    if gpus.is_empty() {
        bail!("--devices {list}: no usable GPU ({})", knn::gpu_status());
    }
    Ok(gpus)
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
fn finish(
    what: &str,
    unit: &str,
    nn: &Neighbors,
    times: &[f64],
    out: &OutputArgs,
    plan: Option<Plan>,
    quiet: bool,
    describe: String,
) -> Result<ExitCode> {
    let (med, runs) = timing::summary(times, out.timing_json.as_deref())?;
    let written = plan.map(|p| p.write(nn)).transpose()?;
    if let (Some(c), Some(_)) = (&out.checkpoint, &written) {
        Checkpointed::remove(c);
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
fn compute(
    what: &str,
    out: &OutputArgs,
    rows: usize,
    k: usize,
    fingerprint: impl FnOnce() -> Result<u64>,
    inputs: &[&Path],
    quiet: bool,
    rows_of: impl Fn(std::ops::Range<usize>, &Progress) -> knn::Result<Neighbors>,
) -> Result<Option<(Neighbors, Vec<f64>)>> {
    let progress = Progress::new(what, rows, quiet);
    let Some(path) = &out.checkpoint else {
        let r = timed(out.repeat, || rows_of(0..rows, &progress))?;
        progress.finish();
        return Ok(Some(r));
    };
    if out.repeat > 1 {
        bail!("--checkpoint runs the computation once: leave out --repeat");
    }
    if inputs.iter().any(|p| is_std_stream(p)) {
        bail!("--checkpoint needs input files: standard input cannot be read again to resume");
    }
    let canon = |p: &Path| std::fs::canonicalize(p).ok();
    if canon(path).is_some() && inputs.iter().any(|i| canon(i) == canon(path)) {
        bail!("{}: the checkpoint cannot be an input file", path.display());
    }
    let state = Checkpointed::open(path, fingerprint()?, rows, k)?;
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

/// The metric as the checkpoint fingerprint sees it (the covariance file is an input).
fn metric_tag(a: &MetricArgs) -> String {
    match &a.metric_expr {
        Some(e) => format!("expr:{e}"),
        None => a.metric.as_deref().unwrap_or("l2").to_ascii_lowercase(),
    }
}

/// Reads the points of `path` for search and graph; `-` is standard input (read whole, at
/// most once: `stdin_taken`). A 1-D npy array is refused with scikit-learn's hint.
fn read_points(path: &Path, options: &ReadOptions, stdin_taken: &mut bool) -> Result<Points> {
    let format = options.format;
    if !is_std_stream(path) {
        if let Ok(dims) = knn_io::array_dims(path, format) {
            refuse_one_d(dims, &path.display().to_string())?;
        }
        return load_points(path, options).map_err(input_format_hint);
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
    let t = match format {
        Format::Csv => knn_io::read_csv_f32_from_bytes(&bytes, &options.csv, name)?,
        _ => knn_io::read_f32_from_bytes(&bytes, format, name)?,
    };
    if t.rows == 0 {
        bail!("{name}: no points");
    }
    Ok(Points::Owned(knn::Matrix::new(name, t.data, t.cols)?))
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

/// The method and device of the engine named `name` in the user's words: "brute force on the
/// CPU", "exact grid on GPU 0", "brute force on GPUs 0, 1".
pub fn in_words(name: &str) -> String {
    let parts: Vec<&str> = name.split('+').collect();
    fn method(m: &str) -> &str {
        match m {
            "cpu" | "fused" | "brute" => "brute force",
            "grid" => "exact grid",
            "global" => "seed 000's global-memory kernel",
            "texture" => "seed 000's texture-memory kernel",
            "cublas" => "seed 000's cuBLAS kernel",
            other => other,
        }
    }
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
    let base = read_points(&a.base, &base_options, &mut stdin_taken)?;
    let queries = read_points(&a.queries, &query_options, &mut stdin_taken)?;
    let metric = metric_for(&a.metric, &[&a.base, &a.queries])?;
    let knn = engine(&a.engine)?;
    let Some((nn, times)) = compute(
        "search",
        &a.out,
        queries.rows(),
        a.k,
        || checkpoint::fingerprint("search", a.k, &metric_tag(&a.metric), &inputs),
        &inputs,
        quiet,
        |r, progress| {
            let offset = r.start;
            let q = queries.view().slice_rows(r.start, r.end);
            knn.search_with_progress(base.view(), q, a.k, &metric, &|d, _| {
                progress.update(offset + d, queries.rows())
            })
        },
    )
    .map_err(|e| name_the_file(e, &a.base, &a.queries))?
    else {
        return Ok(ExitCode::from(130));
    };
    let describe = format!(
        "{} queries × {} base points (d={}), k={}, {}, {}",
        queries.rows(),
        base.rows(),
        base.dim(),
        a.k,
        metric,
        in_words(&knn.engine_for(base.rows(), base.dim(), &metric)?.name())
    );
    finish(
        "search", "queries", &nn, &times, &a.out, plan, quiet, describe,
    )
}

pub fn graph(a: &GraphArgs, quiet: bool) -> Result<ExitCode> {
    let mut inputs: Vec<&Path> = vec![&a.points];
    inputs.extend(a.metric.covariance.as_deref());
    let plan = plan(&a.out, &inputs)?;
    let options = input_options(&a.input_format, &a.text, Some(BASE_DATASET))?;
    let points = read_points(&a.points, &options, &mut false)?;
    let metric = metric_for(&a.metric, &[&a.points])?;
    let symmetric: Symmetry = a.symmetric.parse().context("--symmetric")?;
    let knn = engine_with_symmetry(&a.engine, symmetric)?;
    let n = points.rows();
    let Some((nn, times)) = compute(
        "graph",
        &a.out,
        n,
        a.k,
        || checkpoint::fingerprint("graph", a.k, &metric_tag(&a.metric), &inputs),
        &inputs,
        quiet,
        |r, progress| {
            let offset = r.start;
            if r == (0..n) {
                knn.graph_with_progress(points.view(), a.k, &metric, &|d, _| progress.update(d, n))
            } else {
                knn.graph_rows(points.view(), r, a.k, &metric, &|d, _| {
                    progress.update(offset + d, n)
                })
            }
        },
    )
    .map_err(|e| name_the_file(e, &a.points, &a.points))?
    else {
        return Ok(ExitCode::from(130));
    };
    let describe = format!(
        "{} points (d={}), k={}, {}, {}",
        points.rows(),
        points.dim(),
        a.k,
        metric,
        in_words(&knn.engine_for(points.rows(), points.dim(), &metric)?.name())
    );
    finish(
        "graph", "points", &nn, &times, &a.out, plan, quiet, describe,
    )
}

fn read_result(ids: &Path, dists: Option<&Path>) -> Result<Neighbors> {
    let t = knn_io::read_i64(ids, None)?;
    let ids_format = Format::from_path(ids)?;
    let dpath = dists
        .map(Path::to_path_buf)
        .unwrap_or_else(|| distances_path(ids, ids_format));
    let d = knn_io::read_f32(&dpath, None)
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
        let recall = knn::id_recall(&result, &ids, truth.cols);
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
        let base = load_points(b, &input_options(&None, &a.text, Some(BASE_DATASET))?)?;
        let query_options = input_options(&None, &a.text, Some(QUERY_DATASET))?;
        let queries = a
            .queries
            .as_ref()
            .map(|q| load_points(q, &query_options))
            .transpose()?;
        let mut inputs: Vec<&Path> = vec![b];
        inputs.extend(a.queries.as_deref());
        let metric = metric_for(&a.metric, &inputs)?;
        let t0 = Instant::now();
        let rep = knn::check(
            base.view(),
            queries.as_ref().map(|q| q.view()),
            k,
            &metric,
            &result,
            knn::DEFAULT_TOLERANCE,
        )?;
        ok &= rep.passed() && rep.recall >= a.min_recall;
        println!(
            "exact check ({} rows, {metric}, f64 oracle, {:.1} s): tie-aware recall {:.6}, worst distance error {:.3e} (relative), {} bad rows{}",
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

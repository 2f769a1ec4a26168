//! Times `Classifier::classify` on files, for `bench/classify/*.py` (works before the `knn
//! classify` command is wired in):
//!
//! ```sh
//! cargo run --release -p knn-classify --example classify_bench -- \
//!     --train X.npy --labels y.npy --queries Q.npy -k 15 [--weights distance] \
//!     [--mode sequential] [--threads 2] [--repeat 3] [--out pred.npy] [--timing-json t.json]
//! ```
//! Files are read once; each run is timed from the call to the labels, median reported.

use knn::{Device, Options};
use knn_classify::{files, Classifier, Params};
use std::path::PathBuf;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut train, mut labels, mut queries, mut out, mut json) = (None, None, None, None, None);
    let mut params = Params::default();
    let (mut threads, mut repeat) = (None, 1usize);
    while let Some(a) = args.next() {
        let mut v = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--train" => train = Some(PathBuf::from(v()?)),
            "--labels" => labels = Some(PathBuf::from(v()?)),
            "--queries" => queries = Some(PathBuf::from(v()?)),
            "-k" => params.k = v()?.parse()?,
            "--weights" => params.weights = v()?.parse()?,
            "--mode" => params.mode = v()?.parse()?,
            "--metric" => params.metric = v()?.parse()?,
            "--threads" => threads = Some(v()?.parse()?),
            "--repeat" => repeat = v()?.parse()?,
            "--out" => out = Some(PathBuf::from(v()?)),
            "--timing-json" => json = Some(PathBuf::from(v()?)),
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    let (Some(train), Some(labels), Some(queries)) = (train, labels, queries) else {
        return Err("give --train, --labels and --queries".into());
    };
    let x = files::read_points(&train, None)?;
    let y = files::encode(&files::read_labels(&labels, None, x.rows())?);
    let q = files::read_points(&queries, None)?;
    let opts = Options {
        device: Device::Cpu,
        threads,
        ..Options::default()
    };
    let mut clf = Classifier::new(params.clone(), &opts)?;
    let classes: Vec<i64> = (0..y.classes.len() as i64).collect();
    clf.fit_with_classes(x.view(), &y.codes, &classes)?;
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..repeat.max(1) {
        let t = Instant::now();
        last = Some(clf.classify(q.view(), false)?);
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let p = last.expect("one run");
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let med = sorted[sorted.len() / 2];
    eprintln!(
        "classify_bench: {} new x {} labelled (d={}), k={}, {}, {}: median {med:.1} ms of {:?}; {:?}",
        q.rows(),
        x.rows(),
        x.dim(),
        params.k,
        params.weights,
        params.mode,
        times.iter().map(|t| t.round()).collect::<Vec<_>>(),
        p.stats
    );
    if let Some(o) = out {
        files::write_labels(&o, None, &files::decode(&y.classes, &p.labels))?;
    }
    if let Some(j) = json {
        let list: Vec<String> = times.iter().map(|t| format!("{t:.3}")).collect();
        std::fs::write(
            j,
            format!(
                "{{\"median_ms\": {med:.3}, \"times_ms\": [{}], \"waves\": {}}}\n",
                list.join(", "),
                p.stats.waves
            ),
        )?;
    }
    Ok(())
}

//! Grid-specific cases: points on cell boundaries, all points in one cell, many identical
//! points, queries far outside the box, k above every cell's population, 1-D and 2-D data,
//! clustered data, adversarial values; each through the pipeline against the f64 oracle, and
//! the engine contract (floors) checked directly on raw candidate lists.

use knn_core::synth::{generate, Distribution, Rng};
use knn_core::{search, CandidateRequest, Engine, Kernel, Matrix, MatrixRef, Metric};
use knn_grid::GridEngine;
use knn_testkit::{self as kit, Case};

fn m(data: Vec<f32>, d: usize) -> Matrix {
    Matrix::new("case", data, d).unwrap()
}

fn uniform(n: usize, d: usize, seed: u64) -> Vec<f32> {
    generate(Distribution::Uniform { lo: 0.0, hi: 1.0 }, n, d, seed)
}

fn clustered(n: usize, d: usize, clusters: usize, spread: f32, seed: u64) -> Vec<f32> {
    generate(Distribution::Clustered { clusters, spread }, n, d, seed)
}

/// Named data sets of dimension 1..=3: (name, base, queries).
fn data_sets() -> Vec<(String, Matrix, Matrix)> {
    let mut sets = Vec::new();
    let mut rng = Rng::new(42);
    for d in [1usize, 2, 3] {
        // Coordinates on multiples of 1/8 in [0, 1]: with 3·8^d points the cells are 1/8 wide,
        // so every point lies on a cell boundary; many duplicates and equal distances.
        let n = 3 * 8usize.pow(d as u32);
        let lattice = |rng: &mut Rng, n: usize| -> Vec<f32> {
            (0..n * d).map(|_| rng.below(9) as f32 / 8.0).collect()
        };
        sets.push((
            format!("boundaries d={d}"),
            m(lattice(&mut rng, n), d),
            m(lattice(&mut rng, 40), d),
        ));
        // All points in one root cell: a tight cloud and one far point stretching the box.
        let mut one = clustered(600, d, 1, 1e-3, 7 + d as u64);
        one.extend(std::iter::repeat_n(1000.0f32, d));
        sets.push((
            format!("one cell d={d}"),
            m(one, d),
            m(clustered(30, d, 1, 1e-3, 8 + d as u64), d),
        ));
        // Everything identical: no grid can split it.
        sets.push((
            format!("all identical d={d}"),
            m(vec![0.25; 150 * d], d),
            m(uniform(10, d, 3), d),
        ));
        // More than 64 identical points among uniform ones, queries at and near them.
        let mut dup = uniform(300, d, 11 + d as u64);
        for _ in 0..200 {
            dup.extend(std::iter::repeat_n(0.5f32, d));
        }
        let mut q = vec![0.5f32; d];
        q.extend(uniform(20, d, 12));
        sets.push((format!("200 identical d={d}"), m(dup, d), m(q, d)));
        // Queries far outside the box in every direction.
        let far: Vec<f32> = (0..24 * d)
            .map(|i| {
                let s = if (i / d + i % d) % 2 == 0 { 1.0 } else { -1.0 };
                s * [1e1f32, 1e4, 1e6][(i / d) % 3] + 0.5
            })
            .collect();
        sets.push((
            format!("far queries d={d}"),
            m(uniform(2000, d, 13 + d as u64), d),
            m(far, d),
        ));
        // Clustered: tight blobs, queries from the same blobs and uniform ones between them.
        let mut cq = clustered(60, d, 20, 1e-4, 14);
        cq.extend(uniform(20, d, 15));
        sets.push((
            format!("clustered d={d}"),
            m(clustered(3000, d, 20, 1e-4, 14), d),
            m(cq, d),
        ));
        // Nested clusters: blobs of blobs (several levels of sub-grids).
        let mut nested = clustered(1000, d, 5, 1e-2, 16);
        nested.extend(clustered(1000, d, 5, 1e-5, 17));
        nested.extend(clustered(500, d, 3, 1e-7, 18));
        let mut nq = clustered(30, d, 5, 1e-5, 17);
        nq.extend(clustered(30, d, 3, 1e-7, 18));
        sets.push((format!("nested clusters d={d}"), m(nested, d), m(nq, d)));
        // Large offset: values near 4e6 with jitter below 1.
        let off: Vec<f32> = uniform(500, d, 19).iter().map(|v| v + 4.0e6).collect();
        let offq: Vec<f32> = uniform(20, d, 20).iter().map(|v| v + 4.0e6).collect();
        sets.push((format!("offset 4e6 d={d}"), m(off, d), m(offq, d)));
        // Near the f32 limits.
        for (limit, scale, seed) in [("max", 3.0e37, 21), ("min", 1.0e-36, 22)] {
            let v: Vec<f32> = generate(Distribution::Uniform { lo: -1.0, hi: 1.0 }, 300, d, seed)
                .iter()
                .map(|v| v * scale)
                .collect();
            let (vb, vq) = v.split_at(250 * d);
            let name = format!("near f32 {limit} d={d}");
            sets.push((name, m(vb.to_vec(), d), m(vq.to_vec(), d)));
        }
    }
    sets
}

#[test]
fn grid_cases_against_the_oracle() {
    let engines = [
        GridEngine::new(Some(1)).unwrap(),
        GridEngine::new(Some(2)).unwrap(),
    ];
    let mut cases = Vec::new();
    for (name, base, queries) in data_sets() {
        let n = base.rows();
        for metric in [Metric::SqL2, Metric::L2, Metric::L1, Metric::Linf] {
            if name.starts_with("near f32 max") && metric == Metric::SqL2 {
                continue; // squared values overflow f32: an error by contract
            }
            // k above every cell's population (cells hold ~3 points; crowded ones are split).
            cases.extend(kit::search_and_graph_cases(
                &name,
                &base,
                &queries,
                &metric,
                &[1, 4, 50, 201, n],
                7.min(n - 1),
            ));
        }
    }
    for e in &engines {
        kit::run_cases(e, &cases);
    }
}

/// The engine contract on raw candidates (no pipeline): rows hold distinct, non-excluded ids
/// sorted by key, keys close to the exact ones, exact keys (when asked) equal to
/// `Kernel::exact`, and the floor below the exact key of every point left out.
fn check_contract(
    e: &GridEngine,
    base: MatrixRef<'_>,
    queries: MatrixRef<'_>,
    kernel: Kernel,
    width: usize,
    exclude: Option<&[u32]>,
) -> Result<(), String> {
    let req = CandidateRequest {
        base,
        queries,
        kernel,
        width,
        exclude,
        precise: false,
        base_key: None,
        exact_data: false,
        exact_from: None,
    };
    let c = e.candidates(&req).map_err(|e| e.to_string())?;
    // The same candidates with exact keys: those are `kernel.exact` of the base rows, bit for
    // bit (the pipeline uses them in place of its own).
    let (c2, exact) = e.candidates_with_exact(&req).map_err(|e| e.to_string())?;
    if c2 != c {
        return Err("candidates_with_exact returned other candidates".into());
    }
    let exact = exact.ok_or("no exact keys")?;
    if exact.len() != c.ids.len() {
        return Err(format!(
            "{} exact keys for {} ids",
            exact.len(),
            c.ids.len()
        ));
    }
    for (j, (&id, &x)) in c.ids.iter().zip(&exact).enumerate() {
        let want = kernel.exact(queries.row(j / width), base.row(id as usize));
        if x.to_bits() != want.to_bits() {
            return Err(format!("candidate {j}: exact key {x} vs {want}"));
        }
    }
    let n = base.rows();
    for i in 0..queries.rows() {
        let ids = &c.ids[i * width..(i + 1) * width];
        let keys = &c.keys[i * width..(i + 1) * width];
        let q = queries.row(i);
        let mut seen = vec![false; n];
        for (j, (&id, &key)) in ids.iter().zip(keys).enumerate() {
            let id = id as usize;
            if id >= n || seen[id] || exclude.is_some_and(|x| x[i] as usize == id) {
                return Err(format!("row {i}: bad id {id} at {j}"));
            }
            seen[id] = true;
            if j > 0 && (keys[j - 1], ids[j - 1]) > (key, id as u32) {
                return Err(format!("row {i}: not sorted at {j}"));
            }
            let exact = kernel.exact(q, base.row(id));
            if (key as f64 - exact).abs() > 1e-5 * exact.abs() + 1e-30 {
                return Err(format!("row {i}: key {key} vs exact {exact}"));
            }
        }
        let floor = c.floor[i] as f64;
        for (b, &returned) in seen.iter().enumerate() {
            if returned || exclude.is_some_and(|x| x[i] as usize == b) {
                continue;
            }
            let exact = kernel.exact(q, base.row(b));
            if exact < floor {
                return Err(format!(
                    "row {i}: floor {floor} above the exact key {exact} of point {b} left out"
                ));
            }
        }
        if (width < req.available()) == floor.is_infinite() {
            return Err(format!("row {i}: floor {floor} with width {width}"));
        }
    }
    Ok(())
}

#[test]
fn raw_candidates_keep_the_engine_contract() {
    let e = GridEngine::new(Some(2)).unwrap();
    let mut failures = Vec::new();
    for (name, base, queries) in data_sets() {
        if name.starts_with("near f32") {
            continue; // the pipeline scales those before an engine sees them
        }
        let n = base.rows();
        for kernel in [Kernel::SqL2, Kernel::L1, Kernel::Linf] {
            for width in [1usize, 2, 17, n / 2, n] {
                let width = width.clamp(1, n);
                if let Err(f) = check_contract(&e, base.view(), queries.view(), kernel, width, None)
                {
                    failures.push(format!("{name} {kernel:?} width={width}: {f}"));
                }
            }
            // Self-join: each point excludes itself.
            let ex: Vec<u32> = (0..n as u32).collect();
            let width = 5.min(n - 1);
            if let Err(f) = check_contract(&e, base.view(), base.view(), kernel, width, Some(&ex)) {
                failures.push(format!("{name} {kernel:?} self-join width={width}: {f}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn same_answer_for_any_thread_count_and_batch() {
    let base = m(clustered(20_000, 3, 30, 1e-3, 5), 3);
    let queries = m(clustered(3000, 3, 30, 1e-3, 6), 3);
    let one = GridEngine::new(Some(1)).unwrap();
    let two = GridEngine::new(Some(2)).unwrap();
    for metric in [Metric::L2, Metric::L1] {
        let a = search(&one, base.view(), queries.view(), 8, &metric).unwrap();
        let b = search(&two, base.view(), queries.view(), 8, &metric).unwrap();
        assert_eq!(a, b);
        // A subset of the queries gives the same rows.
        let sub = MatrixRef::new("q", &queries.view().as_slice()[300..900], 3).unwrap();
        let c = search(&two, base.view(), sub, 8, &metric).unwrap();
        assert_eq!(c.ids[..], a.ids[100 * 8..300 * 8]);
    }
}

#[test]
fn a_base_changed_in_place_is_not_served_a_stale_grid() {
    let e = GridEngine::new(Some(2)).unwrap();
    let mut data = uniform(5000, 3, 9);
    let queries = m(uniform(200, 3, 10), 3);
    for round in 0..3 {
        if round > 0 {
            // Same address and length, different values.
            data.iter_mut().for_each(|v| *v = 1.0 - *v * 0.5);
        }
        let case = Case {
            name: format!("mutated round {round}"),
            base: m(data.clone(), 3),
            queries: Some(queries.clone()),
            k: 3,
            metric: Metric::L2,
        };
        // Through the user's own buffer, so the address repeats.
        let b = MatrixRef::new("base", &data, 3).unwrap();
        let got = search(&e, b, queries.view(), 3, &Metric::L2).unwrap();
        let want = knn_core::oracle(b, Some(queries.view()), 3, &Metric::L2).unwrap();
        assert_eq!(got.ids, want.ids, "{}", case.name);
        case.run(&e).unwrap();
    }
}

#[test]
fn higher_dimensions_stay_exact() {
    let e = GridEngine::new(Some(2)).unwrap();
    for d in [4usize, 7, 20] {
        let base = m(clustered(2000, d, 10, 1e-2, d as u64), d);
        let queries = m(uniform(50, d, 99), d);
        for metric in [Metric::L2, Metric::L1, Metric::Linf] {
            Case {
                name: format!("d={d} {metric}"),
                base: base.clone(),
                queries: Some(queries.clone()),
                k: 10,
                metric,
            }
            .run(&e)
            .unwrap();
        }
    }
}

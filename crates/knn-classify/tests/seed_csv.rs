//! The seed-003 CSV: parsing, errors with line and column, filling in predictions, generation.

use knn::synth::Rng;
use knn_classify::{fill_predictions, generate_seed_csv, split_rows, SeedCsv};

const SEED_EXAMPLE: &str = "5,2,5,3
28.604126,59.192734,51.113876,0
-73.123611,7.033615,62.342010,4
-17.843704,64.565491,-34.666321,4
-9.518784,25.151924,92.620850,2
59.791962,-40.688431,97.609085,2
-47.902969,18.415474,-41.363827,-1
94.361481,84.595779,-59.809090,-1
";

fn f32_of(s: &str) -> f32 {
    s.parse().unwrap()
}

fn err(text: &str) -> String {
    SeedCsv::parse(text.as_bytes(), "data.csv")
        .unwrap_err()
        .to_string()
}

#[test]
fn reads_the_seed_example() {
    let f = SeedCsv::parse(SEED_EXAMPLE.as_bytes(), "data").unwrap();
    assert_eq!((f.numels, f.newels, f.classes, f.dim), (5, 2, 5, 3));
    assert_eq!(f.labels, [0, 4, 4, 2, 2, -1, -1]);
    let (pts, lab) = f.labelled();
    assert_eq!(lab, [0, 4, 4, 2, 2]);
    assert_eq!(
        pts[3..6],
        ["-73.123611", "7.033615", "62.342010"].map(f32_of)
    );
    assert_eq!(
        f.unlabelled()[3..],
        ["94.361481", "84.595779", "-59.809090"].map(f32_of)
    );
}

#[test]
fn accepts_crlf_spaces_bom_blank_lines_and_any_row_order() {
    let text = "\u{feff}2, 1 ,2,2\r\n\r\n1,2,-1\r\n 3 , 4 ,1\r\n5,6,0\r\n\r\n";
    let f = SeedCsv::parse(text.as_bytes(), "x").unwrap();
    assert_eq!(f.labels, [-1, 1, 0]);
    assert_eq!(f.points, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
}

#[test]
fn errors_name_line_and_column() {
    let cases: &[(&str, &str)] = &[
        ("", "data.csv: empty file"),
        ("5,2,5\n", "data.csv: line 1, column 4: the header has 3 cells"),
        ("5,x,5,3\n", "data.csv: line 1, column 2: newels 'x' is not a non-negative integer"),
        ("1,0,0,1\n1,0\n", "data.csv: line 1, column 3: classes must be at least 1"),
        ("1,1,2,0\n", "data.csv: line 1, column 4: dim must be at least 1"),
        // Fewer rows than the header says.
        ("2,1,2,1\n1,0\n2,-1\n", "data.csv: line 4, column 1: the file ends after 2 rows; the header says numels + newels = 2 + 1 = 3"),
        // More rows.
        ("1,1,2,1\n1,0\n2,-1\n3,1\n", "data.csv: line 4, column 1: more rows than the header's numels + newels = 1 + 1 = 2"),
        // The -1 rows disagree with newels.
        ("1,1,2,1\n1,0\n2,1\n", "data.csv: line 1, column 2: the header says newels = 1, but 0 rows have class -1"),
        // Ragged rows.
        ("1,1,2,2\n1,2,0\n3,-1\n", "data.csv: line 3, column 3: the row has 2 cells; expected dim + 1 = 3"),
        ("1,1,2,2\n1,2,0\n3,4,5,-1\n", "data.csv: line 3, column 4: the row has more than dim + 1 = 3 cells"),
        // Non-numeric cells.
        ("1,1,2,2\n1,abc,0\n3,4,-1\n", "data.csv: line 2, column 2: 'abc' is not a number"),
        ("1,1,2,2\n1,2,zero\n3,4,-1\n", "data.csv: line 2, column 3: the class 'zero' is not an integer"),
        ("1,1,2,2\n1,2,1.5\n3,4,-1\n", "data.csv: line 2, column 3: the class '1.5' is not an integer"),
        // Labels outside [-1, classes).
        ("1,1,2,2\n1,2,2\n3,4,-1\n", "data.csv: line 2, column 3: class 2 is outside [-1, 2)"),
        ("1,1,2,2\n1,2,0\n3,4,-2\n", "data.csv: line 3, column 3: class -2 is outside [-1, 2)"),
        // NaN and infinities.
        ("1,1,2,2\n1,2,0\nNaN,4,-1\n", "data.csv: line 3, column 1: 'NaN' is NaN; coordinates must be finite"),
        ("1,1,2,2\n1,-inf,0\n3,4,-1\n", "data.csv: line 2, column 2: '-inf' is infinite"),
        ("1,1,2,2\n1,1e39,0\n3,4,-1\n", "data.csv: line 2, column 2: '1e39' is beyond the f32 range"),
    ];
    for (text, want) in cases {
        let got = err(text);
        assert!(
            got.starts_with(want),
            "input {text:?}:\n got  {got}\n want {want}..."
        );
    }
}

#[test]
fn random_bytes_give_errors_not_panics() {
    let mut rng = Rng::new(1);
    let alphabet = b"0123456789,-.\n\r eNaIf";
    for len in 0..400 {
        let mut bytes: Vec<u8> = (0..len)
            .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
            .collect();
        let _ = SeedCsv::parse(&bytes, "fuzz");
        bytes.insert(0, b'\n');
        let _ = SeedCsv::parse(&bytes, "fuzz");
        let raw: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let _ = SeedCsv::parse(&raw, "fuzz");
    }
    // A header announcing a huge file allocates nothing unreasonable.
    assert!(err("4000000000000,1,2,100000\n1,-1\n").contains("line"));
}

#[test]
fn fill_replaces_only_the_minus_ones() {
    let out = fill_predictions(SEED_EXAMPLE.as_bytes(), "x", &[3, 1]).unwrap();
    let want = SEED_EXAMPLE
        .replace("-41.363827,-1", "-41.363827,3")
        .replace("-59.809090,-1", "-59.809090,1");
    assert_eq!(String::from_utf8(out).unwrap(), want);
    // CRLF and spaces kept.
    let text = "1,1,2,1\r\n 5 , -1 \r\n7,0\r\n";
    let out = fill_predictions(text.as_bytes(), "x", &[1]).unwrap();
    assert_eq!(out, b"1,1,2,1\r\n 5 ,1\r\n7,0\r\n");
    assert!(fill_predictions(SEED_EXAMPLE.as_bytes(), "x", &[1]).is_err());
    assert!(fill_predictions(SEED_EXAMPLE.as_bytes(), "x", &[1, 2, 3]).is_err());
}

#[test]
fn writes_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.csv");
    std::fs::write(&path, "old").unwrap();
    let f = generate_seed_csv(3, 2, 4, 2, 7).unwrap();
    f.write(&path).unwrap();
    assert_eq!(SeedCsv::read(&path).unwrap(), f);
    // A directory that does not exist: an error, and nothing left behind anywhere.
    let bad = dir.path().join("missing").join("out.csv");
    assert!(f.write(&bad).is_err());
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "only out.csv, no temporary file");
}

#[test]
fn generator_is_seeded_and_in_range() {
    let a = generate_seed_csv(1000, 300, 7, 5, 42).unwrap();
    assert_eq!(a, generate_seed_csv(1000, 300, 7, 5, 42).unwrap());
    assert_ne!(a, generate_seed_csv(1000, 300, 7, 5, 43).unwrap());
    assert!(a.points.iter().all(|v| (-100.0..=100.0).contains(v)));
    assert!(a.labels[..1000].iter().all(|l| (0..7).contains(l)));
    assert!(a.labels[1000..].iter().all(|&l| l == -1));
    assert!((0..7).all(|c| a.labels.contains(&c)));
    // The text reads back to exactly the same values.
    assert_eq!(SeedCsv::parse(&a.to_bytes(), "gen").unwrap(), a);
    assert_eq!(split_rows(1000, 0.1).unwrap(), (900, 100));
    assert!(split_rows(10, 1.5).is_err());
}

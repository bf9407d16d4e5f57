//! `infembed mine` on the tiny random BERT fixture: the file it writes holds, for every record,
//! the negatives a brute-force reference picks from the same model's embeddings (every record
//! against every candidate, cosine in f64, the filter written out again here), and training
//! reads it back; bad arguments are one-line errors.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use infembed::Device;
use infembed::data::{InfIrRecord, ReadMode, read_mined_negatives, read_records};
use infembed::encoder::DualEncoder;
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn mine(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_infembed"))
        .arg("mine")
        .args(args)
        .current_dir(root())
        .output()
        .unwrap()
}

fn unit_rows(t: burn::tensor::Tensor<2>) -> Vec<Vec<f64>> {
    let [n, d] = t.dims();
    let v = t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    (0..n)
        .map(|i| {
            let r: Vec<f64> = v[i * d..(i + 1) * d]
                .iter()
                .map(|&x| f64::from(x))
                .collect();
            let norm = r.iter().map(|x| x * x).sum::<f64>().sqrt();
            r.iter().map(|x| x / norm).collect()
        })
        .collect()
}

/// The reference: every distinct passage of the file is a candidate, named by its first
/// field; a record's negatives are the best-scoring candidates that are not labelled relevant
/// to its (I+, Q+) by any row of any record, not its own P1- / P2-, and not above 0.95 times
/// its positive's score (`margin`).
fn reference(
    records: &[InfIrRecord],
    encoder: &DualEncoder,
    per_record: usize,
    margin: Option<f64>,
) -> Vec<Vec<String>> {
    let mut cands: Vec<(String, String)> = Vec::new();
    let mut seen = HashSet::new();
    for (r, rec) in records.iter().enumerate() {
        for (suffix, text) in [
            ("pos", &rec.document_positive),
            ("n1", &rec.hard_negative_document_1),
            ("n2", &rec.hard_negative_document_2),
        ] {
            if seen.insert(text.to_string()) {
                cands.push((format!("r{r}-{suffix}"), text.to_string()));
            }
        }
    }
    let texts: Vec<&str> = cands.iter().map(|c| c.1.as_str()).collect();
    let p = unit_rows(encoder.encode_passages(&texts).unwrap().embeddings);
    let pairs: Vec<(&str, &str)> = records
        .iter()
        .map(|r| (&*r.instruction_positive, &*r.query_positive))
        .collect();
    let q = unit_rows(encoder.encode_queries(&pairs).unwrap().embeddings);
    let positives: Vec<&str> = records.iter().map(|r| &*r.document_positive).collect();
    let pos = unit_rows(encoder.encode_passages(&positives).unwrap().embeddings);
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    records
        .iter()
        .enumerate()
        .map(|(r, rec)| {
            let positive = dot(&q[r], &pos[r]);
            let limit = margin.map_or(f64::INFINITY, |m| positive - (1.0 - m) * positive.abs());
            let mut scored: Vec<(f64, usize)> = Vec::new();
            for (c, (_, text)) in cands.iter().enumerate() {
                let labelled = records.iter().any(|s| {
                    (s.instruction_positive == rec.instruction_positive
                        && s.query_positive == rec.query_positive
                        && &*s.document_positive == text)
                        || (s.instruction_negative == rec.instruction_positive
                            && s.query_positive == rec.query_positive
                            && &*s.hard_negative_document_1 == text)
                        || (s.instruction_positive == rec.instruction_positive
                            && s.query_negative == rec.query_positive
                            && &*s.hard_negative_document_2 == text)
                });
                let own = &*rec.hard_negative_document_1 == text
                    || &*rec.hard_negative_document_2 == text;
                let score = dot(&q[r], &p[c]);
                if !labelled && !own && score <= limit {
                    scored.push((score, c));
                }
            }
            scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            scored
                .into_iter()
                .take(per_record)
                .map(|(_, c)| cands[c].0.clone())
                .collect()
        })
        .collect()
}

/// Runs `infembed mine` with `args` (writing `out`) and checks the file against the reference
/// for `records` and `encoder`; returns how many records the miner scored against every
/// candidate.
fn check(
    args: &[&str],
    out: &Path,
    records: &[InfIrRecord],
    encoder: &DualEncoder,
    margin: Option<f64>,
) -> usize {
    let o = mine(args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    let want = reference(records, encoder, 3, margin);
    let got: Vec<Vec<String>> = std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["negatives"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_string())
                .collect()
        })
        .collect();
    assert_eq!(got, want, "margin {margin:?}");
    if margin.is_none() {
        assert!(got.iter().all(|l| l.len() == 3), "{got:?}");
    }
    // Training reads it back: every id resolves, none is a labelled positive.
    let texts = read_mined_negatives(out, records).unwrap();
    assert_eq!(
        texts.iter().map(Vec::len).collect::<Vec<_>>(),
        got.iter().map(Vec::len).collect::<Vec<_>>()
    );
    // "...; N scored against every candidate); ..."
    let before = stderr
        .split(" scored against every candidate")
        .next()
        .unwrap_or_else(|| panic!("{stderr}"));
    before.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn mined_negatives_are_the_brute_force_choice_and_training_reads_them() {
    // The config's paths are relative to the repository root (where the command ran).
    let text = std::fs::read_to_string(root().join("examples/configs/tiny.toml")).unwrap();
    let config: infembed::train::TrainConfig = toml::from_str(&text).unwrap();
    let records = read_records(root().join(&config.data.train), ReadMode::Strict)
        .unwrap()
        .records;
    let encoder = infembed::load_encoder(
        &root().join(&config.model),
        Some(config.encoder.clone()),
        &Device::flex(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mined.jsonl");
    let out_s = out.to_str().unwrap();
    // The random tiny model scores its positives no better than the rest, so the default
    // margin (0.95 x the positive) leaves few candidates; without it every record gets 3.
    for (extra, margin) in [(None, Some(0.95)), (Some("--no-margin"), None)] {
        let mut args = vec![
            "--config",
            "examples/configs/tiny.toml",
            "--per-record",
            "3",
            "-o",
            out_s,
        ];
        args.extend(extra);
        check(&args, &out, &records, &encoder, margin);
    }

    // 12 records (36 distinct passages) are more than the search's 2 x 3 + 16 hits: the
    // search path, and with a tight margin (the random model scores everything near 0.99),
    // records whose top hits are filtered away, scored against every candidate.
    let many: Vec<InfIrRecord> = (0..12)
        .map(|i| {
            let r = &records[i % records.len()];
            let v = |t: &str| format!("{t} w{i}");
            InfIrRecord::from_texts([
                &v(&r.query_positive),
                &v(&r.instruction_positive),
                &v(&r.document_positive),
                &v(&r.query_negative),
                &v(&r.instruction_negative),
                &v(&r.hard_negative_document_1),
                &v(&r.hard_negative_document_2),
            ])
            .unwrap()
        })
        .collect();
    let train = dir.path().join("many.jsonl");
    let lines: Vec<String> = many.iter().map(|r| r.to_json().to_string()).collect();
    std::fs::write(&train, lines.join("\n") + "\n").unwrap();
    let model = root().join(&config.model);
    let plain = infembed::load_encoder(&model, None, &Device::flex()).unwrap();
    let (model_s, train_s) = (model.to_str().unwrap(), train.to_str().unwrap());
    let base = [
        "--model",
        model_s,
        "--train",
        train_s,
        "--per-record",
        "3",
        "-o",
        out_s,
    ];
    let mut args = base.to_vec();
    args.extend(["--max-relative", "0.99"]);
    let rescans = check(&args, &out, &many, &plain, Some(0.99));
    assert!(rescans > 0, "no record was scored against every candidate");
    let mut args = base.to_vec();
    args.push("--no-margin");
    check(&args, &out, &many, &plain, None);
}

#[test]
fn bad_arguments_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.jsonl");
    let o = mine(&[
        "--config",
        "examples/configs/tiny.toml",
        "--per-record",
        "0",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--per-record must be at least 1"));
    let o = mine(&[
        "--model",
        "crates/infembed-encoder/tests/fixtures/tiny-bert",
        "--train",
        "no/such.jsonl",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no/such.jsonl"), "{err}");
    assert!(!out.exists());
}

//! The file-facing loaders: the held-out test built from files equals the data crate's builder
//! on the same records, and a missing model directory is a typed error naming it.

use std::path::PathBuf;

use infembed_data::{ReadMode, build_heldout, read_distractors, read_records};
use infembed_eval::{Error, load_encoder, load_heldout, model_name};

fn sample(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/inf-ir-sample")
        .join(name)
}

#[test]
fn heldout_from_files_is_the_data_crates_builder() {
    let dev = sample("dev.jsonl");
    let distractors_file = sample("distractors.jsonl");
    let records = read_records(&dev, ReadMode::Strict).unwrap().records;
    let distractors = if distractors_file.is_file() {
        read_distractors(&distractors_file).unwrap()
    } else {
        Vec::new()
    };
    let want = build_heldout("dev", &records, &distractors).unwrap();
    let got = load_heldout(
        &dev,
        distractors_file
            .is_file()
            .then_some(distractors_file.as_path()),
    )
    .unwrap();
    assert_eq!(got.name, "dev");
    assert_eq!(got.queries.len(), want.queries.len());
    assert_eq!(got.corpus.len(), want.corpus.len());
    assert_eq!(got.qrels_og, want.qrels_og);
    assert_eq!(got.qrels_changed, want.qrels_changed);
    assert_eq!(got.changed_docs, want.changed_docs);
}

#[test]
fn a_missing_model_directory_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-model");
    let err = load_encoder(&missing, None, &burn::tensor::Device::flex()).unwrap_err();
    assert!(
        matches!(&err, Error::ModelDir { path } if *path == missing),
        "{err}"
    );
    assert!(err.to_string().contains("no-such-model"), "{err}");
    assert_eq!(model_name(&missing), "no-such-model");
}

//! The shipped training configs parse and validate, and `examples/configs/paper.toml` holds the
//! paper's recipe as the reference code runs it (`num_train_epochs = 2`, batch 4, Hugging Face
//! Trainer defaults for the rest: weight decay 0.0, no warm-up, linear decay, clipping 1.0).

use std::path::{Path, PathBuf};

use infembed_train::{Schedule, TrainConfig};

fn configs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/configs")
}

/// The shipped configs name the model and data relative to the repository root, and validation
/// checks that they exist: run from there, with the model present (skipped outside CI when it is
/// not, failed under `CI=true`). Every test of this file sets the same directory.
fn at_repo_root(test: &str) -> bool {
    let root = infembed_testkit::workspace_root();
    let model = root.join("models/all-MiniLM-L6-v2/model.safetensors");
    let fix = "run `cargo xtask fetch-model` (the shipped configs name models/all-MiniLM-L6-v2)";
    if infembed_testkit::require(test, model, "the model all-MiniLM-L6-v2", fix).is_none() {
        return false;
    }
    std::env::set_current_dir(root).unwrap();
    true
}

#[test]
fn every_shipped_config_parses_and_validates() {
    if !at_repo_root("every_shipped_config_parses_and_validates") {
        return;
    }
    let mut n = 0;
    for entry in std::fs::read_dir(configs_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            TrainConfig::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert!(n >= 3, "paper, quickstart and tiny at least; found {n}");
}

#[test]
fn paper_toml_is_the_papers_recipe() {
    if !at_repo_root("paper_toml_is_the_papers_recipe") {
        return;
    }
    let c = TrainConfig::from_file(configs_dir().join("paper.toml")).unwrap();
    assert_eq!(c.epochs, 2);
    assert_eq!(c.max_steps, None);
    assert_eq!(c.optimizer.lr, 5e-5);
    assert_eq!(c.optimizer.weight_decay, 0.0);
    assert_eq!(c.optimizer.schedule, Schedule::Linear);
    assert_eq!(c.optimizer.warmup_ratio, 0.0);
    assert_eq!(c.optimizer.warmup_steps, None);
    assert_eq!(c.optimizer.max_grad_norm, Some(1.0));
    assert_eq!(c.batch.records, 4);
    assert_eq!(c.batch.accumulation, 1);
    assert_eq!(c.loss.temperature, 0.05);
    assert_eq!(c.encoder.query_max_length, Some(256));
    assert_eq!(c.encoder.passage_max_length, Some(512));
}

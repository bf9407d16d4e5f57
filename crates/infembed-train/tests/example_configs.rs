//! The shipped training configs parse and validate, and `examples/configs/paper.toml` holds the
//! paper's recipe as the reference code runs it (`num_train_epochs = 2`, batch 4, Hugging Face
//! Trainer defaults for the rest: weight decay 0.0, no warm-up, linear decay, clipping 1.0).

use std::path::{Path, PathBuf};

use infembed_train::{Schedule, TrainConfig};

fn configs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/configs")
}

#[test]
fn every_shipped_config_parses_and_validates() {
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
    assert_eq!(c.encoder.query_max_length, 256);
    assert_eq!(c.encoder.passage_max_length, 512);
}

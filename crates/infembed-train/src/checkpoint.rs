//! Atomic, resumable checkpoints.
//!
//! A checkpoint is a directory `<output_dir>/checkpoints/step-NNNNNNNN/` holding
//! `model.bpk` (the trainable modules as a burn record), `optimizer.bpk` (AdamW's moments and
//! step counts, keyed by parameter id) and `state.json` ([`TrainState`]: step, data position,
//! seed, the metric history and the config it was written under). It is written under a
//! temporary name, every file is synced, and then the directory is renamed into place; the
//! pointer file `checkpoints/latest` is replaced the same way afterwards. A crash at any
//! moment leaves either the previous checkpoint or the new one, never a torn one.
//!
//! All randomness of a run is a function of `(seed, epoch)` and `(seed, step)` (see
//! [`crate::batch`]), so `(seed, step, epoch, batch position)` is the whole generator state.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One evaluation or logging point of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HistoryEntry {
    /// Optimizer steps done when the entry was made.
    pub step: usize,
    /// Mean training loss over the steps since the previous entry (`None` for evaluations
    /// before any step).
    pub loss: Option<f64>,
    /// Learning rate of the last step.
    pub lr: Option<f64>,
    /// Development-set metrics (empty when this is a loss-only entry).
    pub metrics: Vec<(String, f64)>,
}

/// One optimizer step of the run (a line of `history.jsonl`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StepRecord {
    /// Optimizer steps done after this one (1-based).
    pub step: usize,
    /// The epoch it belongs to (0-based).
    pub epoch: usize,
    /// Its loss (the mean over its accumulated batches).
    pub loss: f64,
    /// The learning rate it applied.
    pub lr: f64,
}

/// Everything besides the tensors that a resumed run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TrainState {
    /// Optimizer steps done.
    pub step: usize,
    /// The epoch in progress (0-based).
    pub epoch: usize,
    /// Optimizer steps done inside `epoch` (the data position).
    pub step_in_epoch: usize,
    /// The run's seed.
    pub seed: u64,
    /// Optimizer steps of the whole run.
    pub total_steps: usize,
    /// Loss and metric history so far.
    pub history: Vec<HistoryEntry>,
    /// Every optimizer step so far (absent from checkpoints written before it was kept).
    #[serde(default)]
    pub steps: Vec<StepRecord>,
    /// The training config as JSON, to refuse resuming under another config.
    pub config: serde_json::Value,
}

/// The checkpoint folder of an output directory.
pub(crate) fn checkpoints_dir(output_dir: &Path) -> PathBuf {
    output_dir.join("checkpoints")
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    infembed_data::write_synced(path, bytes).map_err(|e| Error::io(path, e))
}

fn sync_dir(path: &Path) -> Result<()> {
    infembed_data::sync_dir(path);
    Ok(())
}

/// Writes `bytes` to `path` atomically and durably ([`infembed_data::write_atomic`]: a synced
/// temporary file in the same folder, renamed, then the folder synced).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    infembed_data::write_atomic(path, bytes).map_err(|e| Error::io(path, e))
}

/// Saves a checkpoint atomically and keeps only the newest `keep` step checkpoints.
/// Returns its directory.
pub(crate) fn save(
    output_dir: &Path,
    state: &TrainState,
    model: &[u8],
    optimizer: &[u8],
    keep: usize,
) -> Result<PathBuf> {
    let root = checkpoints_dir(output_dir);
    fs::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
    let name = format!("step-{:08}", state.step);
    let dir = root.join(&name);
    let tmp = root.join(format!("{name}.tmp-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    }
    fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    write_synced(&tmp.join("model.bpk"), model)?;
    write_synced(&tmp.join("optimizer.bpk"), optimizer)?;
    let json = serde_json::to_vec_pretty(state)
        .map_err(|e| Error::checkpoint(&tmp, format!("state does not serialize: {e}")))?;
    write_synced(&tmp.join("state.json"), &json)?;
    sync_dir(&tmp)?;
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    }
    fs::rename(&tmp, &dir).map_err(|e| Error::io(&dir, e))?;
    sync_dir(&root)?;
    write_atomic(&root.join("latest"), name.as_bytes())?;
    prune(&root, keep, &name)?;
    Ok(dir)
}

fn prune(root: &Path, keep: usize, newest: &str) -> Result<()> {
    let mut steps: Vec<String> = fs::read_dir(root)
        .map_err(|e| Error::io(root, e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("step-"))
        .collect();
    steps.sort();
    let mut complete: Vec<&String> = steps.iter().filter(|n| !n.contains(".tmp-")).collect();
    // Leftovers of an interrupted save are never the checkpoint `latest` names: remove them.
    for stale in steps.iter().filter(|n| n.contains(".tmp-")) {
        let p = root.join(stale);
        let _ = fs::remove_dir_all(&p);
    }
    while complete.len() > keep {
        let old = complete.remove(0);
        if old != newest {
            let p = root.join(old);
            fs::remove_dir_all(&p).map_err(|e| Error::io(&p, e))?;
        }
    }
    Ok(())
}

/// A checkpoint read back.
#[derive(Debug)]
pub(crate) struct Loaded {
    /// Its directory.
    pub dir: PathBuf,
    /// The state.
    pub state: TrainState,
    /// `model.bpk`.
    pub model: Vec<u8>,
    /// `optimizer.bpk`.
    pub optimizer: Vec<u8>,
}

/// The checkpoint `checkpoints/latest` names, or `None` when the output directory has none.
pub(crate) fn load_latest(output_dir: &Path) -> Result<Option<Loaded>> {
    let root = checkpoints_dir(output_dir);
    let latest = root.join("latest");
    if !latest.exists() {
        return Ok(None);
    }
    let name = fs::read_to_string(&latest).map_err(|e| Error::io(&latest, e))?;
    let dir = root.join(name.trim());
    if !dir.is_dir() {
        return Err(Error::checkpoint(
            &dir,
            "named by checkpoints/latest is missing (delete the output directory to start over)",
        ));
    }
    let read = |f: &str| -> Result<Vec<u8>> {
        let p = dir.join(f);
        fs::read(&p).map_err(|e| Error::io(&p, e))
    };
    let state_path = dir.join("state.json");
    let state: TrainState = serde_json::from_slice(&read("state.json")?)
        .map_err(|e| Error::checkpoint(&state_path, format!("state.json is invalid: {e}")))?;
    Ok(Some(Loaded {
        model: read("model.bpk")?,
        optimizer: read("optimizer.bpk")?,
        state,
        dir,
    }))
}

/// The top-level keys whose values differ between two configs (for a clear refusal to
/// resume under another config). `max_steps`, `eval`, `checkpoint`, the output directory and
/// where the steps run (`device`, `devices`, the GPU's `matmul` routine) may change.
pub(crate) fn config_differences(a: &serde_json::Value, b: &serde_json::Value) -> Vec<String> {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return vec!["<root>".into()];
    };
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| {
            !matches!(
                k.as_str(),
                "max_steps"
                    | "eval"
                    | "checkpoint"
                    | "output_dir"
                    | "device"
                    | "devices"
                    | "matmul"
            )
        })
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(step: usize) -> TrainState {
        TrainState {
            step,
            epoch: 0,
            step_in_epoch: step,
            seed: 1,
            total_steps: 10,
            history: vec![],
            steps: vec![],
            config: serde_json::json!({"seed": 1}),
        }
    }

    #[test]
    fn save_load_and_prune() {
        let dir = tempfile::tempdir().unwrap();
        for s in 1..=4 {
            save(dir.path(), &state(s), &[s as u8; 3], &[9, s as u8], 2).unwrap();
        }
        let loaded = load_latest(dir.path()).unwrap().unwrap();
        assert_eq!(loaded.state, state(4));
        assert_eq!(loaded.model, vec![4u8; 3]);
        assert_eq!(loaded.optimizer, vec![9, 4]);
        let mut names: Vec<String> = fs::read_dir(checkpoints_dir(dir.path()))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, vec!["latest", "step-00000003", "step-00000004"]);
    }

    #[test]
    fn a_torn_save_leaves_the_previous_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &state(1), &[1], &[1], 3).unwrap();
        // A crash after creating the temporary directory but before the rename.
        let torn = checkpoints_dir(dir.path()).join("step-00000002.tmp-99999");
        fs::create_dir_all(&torn).unwrap();
        fs::write(torn.join("model.bpk"), [7]).unwrap();
        assert_eq!(load_latest(dir.path()).unwrap().unwrap().state.step, 1);
        assert!(
            load_latest(tempfile::tempdir().unwrap().path())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn config_differences_ignore_schedules() {
        let a = serde_json::json!({"seed": 1, "max_steps": 3, "eval": {"a": 1}, "epochs": 2});
        let b = serde_json::json!({"seed": 2, "max_steps": 5, "eval": {"a": 2}, "epochs": 2,
                                   "matmul": "double_unit"});
        assert_eq!(config_differences(&a, &b), vec!["seed".to_string()]);
    }
}

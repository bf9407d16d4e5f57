//! Loading what an evaluation needs from files: a model directory ([`load_encoder`]) and the
//! held-out instruction-following test of an InF-IR file ([`load_heldout`]).

use std::path::Path;

use burn::tensor::Device;
use infembed_data::{FollowIrSet, ReadMode, build_heldout, read_distractors, read_records};
use infembed_encoder::{DualEncoder, EncoderConfig};

use crate::error::{Error, Result};

/// The file by which a directory saved by infembed (`infembed train`'s final model, or
/// [`DualEncoder::save`]) carries its [`EncoderConfig`].
pub const ENCODER_CONFIG_FILE: &str = "infembed_encoder.json";

/// Loads a model directory onto `device`: a Hugging Face / sentence-transformers checkpoint, or a
/// directory saved by infembed. With `config`, that config is used; without, a directory that
/// carries its own config ([`ENCODER_CONFIG_FILE`]: template, lengths, towers) is loaded with it,
/// and any other with [`EncoderConfig::default`].
///
/// # Errors
/// [`Error::ModelDir`] when `dir` is not a directory; the encoder's errors (a missing file, a bad
/// config, an unsupported architecture).
pub fn load_encoder(
    dir: &Path,
    config: Option<EncoderConfig>,
    device: &Device,
) -> Result<DualEncoder> {
    if !dir.is_dir() {
        return Err(Error::ModelDir {
            path: dir.to_path_buf(),
        });
    }
    match config {
        Some(config) => Ok(DualEncoder::from_dir(dir, config, device)?),
        None if dir.join(ENCODER_CONFIG_FILE).is_file() => {
            log::debug!(
                "{}: loading with its own {ENCODER_CONFIG_FILE}",
                dir.display()
            );
            Ok(DualEncoder::load_saved(dir, device)?)
        }
        None => Ok(DualEncoder::from_dir(
            dir,
            EncoderConfig::default(),
            device,
        )?),
    }
}

/// The name reports give a model directory: its last component (the whole path when it has
/// none).
pub fn model_name(dir: &Path) -> String {
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Builds the held-out instruction-following test ([`build_heldout`]) from an InF-IR file (JSONL
/// or Parquet, read strictly) and optional distractor passages; the set is named after the
/// file's stem (`heldout` when it has none).
///
/// # Errors
/// Unreadable or malformed files (named), and [`build_heldout`]'s errors.
pub fn load_heldout(data: &Path, distractors: Option<&Path>) -> Result<FollowIrSet> {
    let records = read_records(data, ReadMode::Strict)?.records;
    let distractors = match distractors {
        Some(p) => read_distractors(p)?,
        None => Vec::new(),
    };
    let name = data
        .file_stem()
        .map_or("heldout".into(), |s| s.to_string_lossy().into_owned());
    Ok(build_heldout(&name, &records, &distractors)?)
}

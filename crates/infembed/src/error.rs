//! The facade's error type: the evaluation harness's and the trainer's.

/// Errors of the training glue and the quickstart.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Evaluating (or reading what an evaluation needs) failed.
    #[error(transparent)]
    Eval(#[from] infembed_eval::Error),
    /// Reading or validating data failed.
    #[error(transparent)]
    Data(#[from] infembed_data::Error),
    /// Loading or running an encoder failed.
    #[error(transparent)]
    Encoder(#[from] infembed_encoder::Error),
    /// Training failed.
    #[error(transparent)]
    Train(#[from] infembed_train::Error),
    /// An ablation grid file or one of its rows is invalid.
    #[error(transparent)]
    Grid(#[from] crate::ablation::GridError),
    /// Writing an output file failed.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A command or input needs a cargo feature this build was compiled without.
    #[error(
        "{what} needs the `{feature}` cargo feature, which this build was compiled without \
         (on by default: `cargo build --release -p infembed` builds it)"
    )]
    FeatureNotBuilt {
        /// What was asked for (e.g. "`infembed synth`").
        what: &'static str,
        /// The `infembed` crate's cargo feature that provides it.
        feature: &'static str,
    },
}

/// The facade's result type.
pub type Result<T> = std::result::Result<T, Error>;

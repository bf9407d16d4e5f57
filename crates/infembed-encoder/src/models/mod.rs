//! The models wing: the backbones as their Hugging Face originals describe them. Each model
//! reads like its original (same module tree, same key names) and calls [`crate::ops`] for
//! its hot operations, never a backend directly.
//!
//! Dependencies point one way: [`input`] (the padded batch and its packed layout) and
//! [`rope`] are leaves; [`bert`], [`modernbert`] and [`decoder`] use them; [`config`]
//! dispatches a `config.json` to the three model configs; [`backbone`] dispatches loading,
//! the forward pass and saving to the three models.

pub(crate) mod backbone;
pub mod bert;
pub(crate) mod config;
pub mod decoder;
pub(crate) mod input;
pub mod modernbert;
mod rope;

pub use backbone::Backbone;
pub use config::ArchitectureConfig;
pub use input::BackboneInput;

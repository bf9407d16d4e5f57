//! The layers a sentence-transformers pipeline may put after pooling: `Dense` modules
//! (a linear map and an activation, changing the embedding width).

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::{relu, sigmoid, tanh};

use crate::config::{DenseActivation, StDense};
use crate::error::{Error, Result};
use crate::ops::{gelu, linear};
use crate::weights;

/// File name of a `Dense` module's weights (`linear.weight` `[out, in]`, `linear.bias`).
pub(crate) const DENSE_WEIGHTS: &str = "model.safetensors";

/// A sentence-transformers `Dense` module: `activation(x W + b)`.
#[derive(Module, Debug)]
pub struct DenseLayer {
    /// The linear map (`in_features` -> `out_features`).
    pub linear: Linear,
    /// The activation after it.
    #[module(skip)]
    pub activation: DenseActivation,
}

impl DenseLayer {
    /// Builds the layer `spec` describes and loads its weights from its directory.
    pub(crate) fn load(spec: &StDense, device: &Device) -> Result<Self> {
        let c = &spec.config;
        let path = spec.dir.join(DENSE_WEIGHTS);
        if !path.exists() {
            let bin = spec.dir.join("pytorch_model.bin");
            return Err(Error::MissingFile {
                path,
                what: if bin.exists() {
                    "Dense weights as safetensors (this module has only pytorch_model.bin: \
                     convert it with safetensors' `save_file`)"
                } else {
                    "Dense weights (safetensors)"
                },
            });
        }
        let mut layer = Self {
            linear: LinearConfig::new(c.in_features, c.out_features)
                .with_bias(c.bias)
                .init(device),
            activation: spec.activation,
        };
        weights::load_into(&mut layer, &path, &[])?;
        Ok(layer)
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.linear.weight.dims()[1]
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.linear.weight.dims()[0]
    }

    /// `activation(x W + b)` on pooled vectors.
    ///
    /// # Shapes
    /// `x: [B, in_features]` -> `[B, out_features]`.
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let y = linear(&self.linear, x);
        match self.activation {
            DenseActivation::Identity => y,
            DenseActivation::Tanh => tanh(y),
            DenseActivation::Relu => relu(y),
            DenseActivation::Sigmoid => sigmoid(y),
            DenseActivation::Gelu => gelu(y),
        }
    }

    /// Writes the layer as a sentence-transformers `Dense` module directory (`config.json`
    /// and `model.safetensors`).
    pub(crate) fn save(&self, dir: &std::path::Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let config = crate::config::StDenseConfig {
            in_features: self.in_features(),
            out_features: self.out_features(),
            bias: self.linear.bias.is_some(),
            activation_function: self.activation.python_name().to_string(),
        };
        crate::config::write_json(&dir.join("config.json"), &config)?;
        weights::save_from(self, &dir.join(DENSE_WEIGHTS), &[])
    }
}

/// Loads the `Dense` modules of a pipeline, checking that the widths chain from `hidden`.
pub(crate) fn load_dense(
    specs: &[StDense],
    hidden: usize,
    device: &Device,
) -> Result<Vec<DenseLayer>> {
    let mut width = hidden;
    let mut out = Vec::with_capacity(specs.len());
    for spec in specs {
        if spec.config.in_features != width {
            return Err(Error::config(
                spec.dir.join("config.json"),
                "in_features",
                format!(
                    "{} does not match the width {width} of the embeddings before it",
                    spec.config.in_features
                ),
            ));
        }
        width = spec.config.out_features;
        out.push(DenseLayer::load(spec, device)?);
    }
    Ok(out)
}

/// Width of the embeddings after `layers` (the last one's output, else the backbone's).
pub(crate) fn output_width(
    layers: &[DenseLayer],
    arch: &crate::models::ArchitectureConfig,
) -> usize {
    layers
        .last()
        .map_or(arch.hidden_size(), DenseLayer::out_features)
}

/// Applies the layers in order.
pub(crate) fn apply_dense(layers: &[DenseLayer], x: Tensor<2>) -> Tensor<2> {
    layers.iter().fold(x, |x, l| l.forward(x))
}

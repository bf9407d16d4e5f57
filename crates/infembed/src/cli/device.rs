//! `--device` / `--dtype` (shared by the commands that load a model) and `infembed devices`.

use anyhow::Result;
use clap::Args;
use infembed::{Device, DeviceSpec, Precision, Quantization};

/// Where a command's model runs.
#[derive(Args, Clone, Debug)]
pub struct DeviceArgs {
    /// Where the model runs: cpu (the default), wgpu[:N], vulkan[:N] or cuda[:N];
    /// `infembed devices` lists what this build sees (docs/devices.md).
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceSpec,
    /// Float type on a GPU device: f32 (the default), bf16 or f16. The CPU computes in f32.
    #[arg(long, default_value = "f32", value_parser = parse_precision)]
    pub dtype: Precision,
    /// `int8`: the linear layers compute through int8 products on the CPU (weights quantized
    /// per output channel at load, activations per token); `bf16`: through bf16 products
    /// (processors with AVX512-BF16); `none`: f32. Overrides the encoder config's `quantize`
    /// (docs/int8.md).
    #[arg(long, value_parser = parse_quantization)]
    pub quantize: Option<Quantization>,
    /// Texts per forward pass when encoding (overrides the encoder config's
    /// `encode_batch_size`, 32 by default). A GPU device gains from larger batches (fewer
    /// kernel launches per text; docs/devices.md); the CPU does not.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: Option<u32>,
}

impl DeviceArgs {
    /// Opens the device with its float type.
    pub fn open(&self) -> Result<Device> {
        Ok(self.device.device_with(self.dtype)?)
    }

    /// Applies `--quantize` and `--batch-size` to a loaded encoder.
    pub fn apply(&self, encoder: &mut infembed::encoder::DualEncoder) -> Result<()> {
        if let Some(q) = self.quantize {
            encoder.set_quantization(q)?;
        }
        if let Some(n) = self.batch_size {
            encoder.set_encode_batch_size(n as usize);
        }
        Ok(())
    }
}

/// Where training runs (`infembed train`, `infembed quickstart`): overrides the config.
#[derive(Args, Clone, Debug)]
pub struct TrainDeviceArgs {
    /// Train on this device (overrides the config's `device` / `devices`).
    #[arg(long, value_parser = parse_device, conflicts_with = "devices")]
    pub device: Option<DeviceSpec>,
    /// Train on several devices sharing each batch, comma-separated (`cpu,cpu`,
    /// `wgpu:0,wgpu:1`); overrides the config.
    #[arg(long, value_parser = parse_device, value_delimiter = ',', num_args = 1..)]
    pub devices: Option<Vec<DeviceSpec>>,
}

impl TrainDeviceArgs {
    /// The override, if one was given.
    pub fn specs(&self) -> Option<Vec<DeviceSpec>> {
        match (&self.devices, self.device) {
            (Some(list), _) => Some(list.clone()),
            (None, Some(one)) => Some(vec![one]),
            (None, None) => None,
        }
    }
}

fn parse_device(text: &str) -> std::result::Result<DeviceSpec, String> {
    text.parse()
        .map_err(|e: infembed::encoder::Error| e.to_string())
}

fn parse_quantization(text: &str) -> std::result::Result<Quantization, String> {
    text.parse()
        .map_err(|e: infembed::encoder::Error| e.to_string())
}

pub(crate) fn parse_precision(text: &str) -> std::result::Result<Precision, String> {
    text.parse()
        .map_err(|e: infembed::encoder::Error| e.to_string())
}

/// `infembed devices`: each device this build can open, the backends it lacks, and whether
/// burn's operation fusion and kernel autotuning are compiled in.
#[derive(Args)]
pub struct DevicesArgs {}

pub fn run(_args: &DevicesArgs) -> Result<()> {
    for listing in infembed::list_devices() {
        println!("{:<10} {}", listing.spec.to_string(), listing.description);
    }
    let missing = |name: &str, feature: &str| {
        println!("{name:<10} not in this build (cargo feature `{feature}`)");
    };
    for (spec, feature) in infembed::missing_backends() {
        missing(&spec.to_string(), feature);
    }
    let options = [
        (
            "fusion",
            cfg!(feature = "fusion"),
            "burn's operation fusion on GPU devices",
        ),
        (
            "autotune",
            cfg!(feature = "autotune"),
            "burn's kernel autotuning on GPU devices (choices cached on disk)",
        ),
    ];
    for (name, compiled, what) in options {
        if compiled {
            println!("{name:<10} {what}");
        } else {
            missing(name, name);
        }
    }
    Ok(())
}

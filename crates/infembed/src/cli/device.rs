//! `--device` / `--dtype` (shared by the commands that load a model) and `infembed devices`.

use anyhow::Result;
use clap::Args;
use infembed::{Device, DeviceSpec, MatmulRoutine, Precision, Quantization};

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
    /// The matrix-product routine of the linear layers on a GPU device: `blocked_split` (the
    /// default, this project's kernel; `blocked` without its depth split), `burn` (burn's own
    /// `matmul`) or one of cubek's by the name `infembed devices --probe-matmul` times it
    /// under (`double_unit`, `simple_cyclic_cmma`, ...; docs/devices.md).
    #[arg(long, value_parser = parse_matmul)]
    pub matmul: Option<MatmulRoutine>,
}

impl DeviceArgs {
    /// Opens the device with its float type.
    pub fn open(&self) -> Result<Device> {
        Ok(self.device.device_with(self.dtype)?)
    }

    /// Applies `--quantize`, `--batch-size` and `--matmul` to a loaded encoder.
    pub fn apply(&self, encoder: &mut infembed::encoder::DualEncoder) -> Result<()> {
        if let Some(q) = self.quantize {
            encoder.set_quantization(q)?;
        }
        if let Some(r) = self.matmul {
            encoder.set_gpu_matmul(r)?;
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

pub(crate) fn parse_matmul(text: &str) -> std::result::Result<MatmulRoutine, String> {
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
pub struct DevicesArgs {
    /// Instead of the listing, time cubek's matrix-product routines on this GPU device
    /// (`wgpu`, `vulkan`, `cuda`) on all-MiniLM-L6-v2's products, in f32 and f16, each
    /// checked against an f64 product on the host (docs/devices.md).
    #[arg(long, value_parser = parse_device, value_name = "DEVICE")]
    pub probe_matmul: Option<DeviceSpec>,
    /// Token rows of the probed products.
    #[arg(long, default_value_t = 4096, requires = "probe_matmul",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub tokens: u32,
    /// Timed launches per routine.
    #[arg(long, default_value_t = 20, requires = "probe_matmul",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub repeats: u32,
    /// Only these routines (comma-separated; `burn` is burn's own matmul).
    #[arg(long, value_delimiter = ',', requires = "probe_matmul")]
    pub routines: Vec<String>,
    /// Only these precisions (comma-separated: f32, f16).
    #[arg(long, value_delimiter = ',', requires = "probe_matmul")]
    pub precisions: Vec<String>,
    /// Also write the probe's rows as JSON to this file.
    #[arg(long, requires = "probe_matmul")]
    pub json: Option<std::path::PathBuf>,
}

pub fn run(args: &DevicesArgs) -> Result<()> {
    if let Some(spec) = args.probe_matmul {
        return probe(args, spec);
    }
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

#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
fn probe(args: &DevicesArgs, spec: DeviceSpec) -> Result<()> {
    use anyhow::Context;
    use infembed::encoder::{MatmulProbe, ProbeOutcome, probe_matmuls};

    if spec == DeviceSpec::Cpu {
        anyhow::bail!(
            "--probe-matmul cpu: the matmul probe runs on GPU devices (wgpu, vulkan, cuda)"
        );
    }
    let device = spec.device()?;
    let mut probe = MatmulProbe::default();
    probe.tokens = args.tokens as usize;
    probe.repeats = args.repeats as usize;
    probe.routines = args.routines.clone();
    probe.precisions = args
        .precisions
        .iter()
        .map(|p| p.parse())
        .collect::<std::result::Result<_, _>>()?;
    let report = probe_matmuls(&device, &probe)?;
    if report.cmma_configs.is_empty() {
        println!("{spec}: no cooperative-matrix (tensor-core) configurations");
    } else {
        println!(
            "{spec}: cooperative-matrix configurations: {}",
            report.cmma_configs.join("; ")
        );
    }
    println!(
        "{:<12} {:<22} {:<9} {:<32} {:>9} {:>8} {:>9}",
        "product", "[B, M, K, N]", "precision", "routine", "ms", "TFLOP/s", "rel err"
    );
    for r in &report.rows {
        let shape = format!("{:?}", r.shape);
        let head = format!(
            "{:<12} {:<22} {:<9} {:<32}",
            r.case,
            shape,
            r.precision.name(),
            r.routine
        );
        match &r.outcome {
            ProbeOutcome::Ran {
                ms,
                tflops,
                rel_err,
            } => println!("{head} {ms:>9.4} {tflops:>8.2} {rel_err:>9.1e}"),
            ProbeOutcome::Unavailable { reason } => {
                println!("{head} unavailable: {}", first_line(reason))
            }
            ProbeOutcome::Failed { reason } => println!("{head} failed: {}", first_line(reason)),
            _ => println!("{head} ?"),
        }
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&serde_json::json!({
            "device": spec.to_string(),
            "tokens": args.tokens,
            "repeats": args.repeats,
            "cmma_configs": report.cmma_configs,
            "rows": report.rows,
        }))?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    line.chars().take(120).collect()
}

#[cfg(not(any(feature = "wgpu", feature = "cuda")))]
fn probe(_args: &DevicesArgs, spec: DeviceSpec) -> Result<()> {
    anyhow::bail!(
        "--probe-matmul {spec}: this build has no GPU backend: rebuild with the cargo feature `wgpu` (or `cuda`)"
    )
}

#[cfg(all(any(feature = "wgpu", feature = "cuda"), feature = "fusion"))]
fn probe(_args: &DevicesArgs, spec: DeviceSpec) -> Result<()> {
    anyhow::bail!(
        "--probe-matmul {spec}: this build has `fusion`, whose tensors are fusion handles, not cubecl ones: build without the `fusion` feature to probe"
    )
}

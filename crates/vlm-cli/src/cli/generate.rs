//! `vlm generate (--hf <DIR> | --package <DIR>) --prompt-ids <id,...> [--image <PNG>]...
//! --max-new <N> --json`: greedy, exactly `N` tokens (eos is not a stop), on the CPU reference
//! (`--hf`) or through the BPU backend and the engine (`--package`: board or simulator, as the
//! package's `.hbm` files say). Same JSON and image-slot rules for both.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{ArgGroup, Args};

use super::bpu_flags::{BpuFlags, RunFlags};
use qwen35::{patchify_rgb8, PreparedImage, Qwen35Model};
use serde::Serialize;
use vlm::engine::{prompt_from_ids, Backend, DecodeOptions, Engine, ImageInput};
use vlm::sampler::{Sampler, SamplingParams};
use vlm::stream::StreamConfig;
use vlm::vision::RgbImage;
use vlm_bpu::{BpuBackend, BpuOptions};

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("model").required(true).args(["hf", "package"])))]
pub struct GenerateArgs {
    /// HF checkpoint directory (config.json + *.safetensors); runs `qwen35` on the CPU.
    #[arg(long, value_name = "DIR")]
    pub hf: Option<PathBuf>,
    /// BLLM package folder (model.json); runs on the BPU, or the simulator for sim packages.
    #[arg(long, value_name = "DIR")]
    pub package: Option<PathBuf>,
    #[command(flatten)]
    pub bpu: BpuFlags,
    #[command(flatten)]
    pub run: RunFlags,
    /// Prompt token ids, comma separated.
    #[arg(long, value_name = "ID,ID,...", value_delimiter = ',', required = true)]
    pub prompt_ids: Vec<u32>,
    /// PNG/JPEG for the next image slot (`<|vision_start|>` pads `<|vision_end|>`), in order.
    #[arg(long, value_name = "PNG")]
    pub image: Vec<PathBuf>,
    /// Number of tokens to generate.
    #[arg(long, value_name = "N")]
    pub max_new: usize,
    /// Print one JSON object `{"prompt_ids", "tokens", "logits"}` on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Output<'a> {
    prompt_ids: &'a [u32],
    tokens: &'a [u32],
    logits: &'a [Vec<f32>],
}

fn load_image(path: &Path, model: &Qwen35Model) -> anyhow::Result<PreparedImage> {
    let vc = model
        .config
        .vision
        .as_ref()
        .context("the checkpoint has no vision_config, but --image was given")?;
    let img = image::open(path)
        .with_context(|| format!("decoding image {}", path.display()))?
        .to_rgb8();
    let (w, h) = (img.width() as usize, img.height() as usize);
    let (pixel_values, grid) = patchify_rgb8(img.as_raw(), w, h, vc)
        .with_context(|| format!("image {}", path.display()))?;
    Ok(PreparedImage { pixel_values, grid })
}

/// Token ids and the logits that chose each of them.
struct Greedy {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

pub fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    let gen = match (&args.hf, &args.package) {
        (Some(dir), None) => run_hf(dir, args)?,
        (None, Some(dir)) => run_package(dir, args)?,
        _ => bail!("give exactly one of --hf <DIR> and --package <DIR>"),
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        let o = Output {
            prompt_ids: &args.prompt_ids,
            tokens: &gen.tokens,
            logits: &gen.logits,
        };
        serde_json::to_writer(&mut out, &o)?;
        writeln!(out)?;
    } else {
        let ids: Vec<String> = gen.tokens.iter().map(u32::to_string).collect();
        writeln!(out, "{}", ids.join(","))?;
    }
    Ok(())
}

/// Image slots (maximal runs of `pad`) of a prompt; each needs one `--image`, in order.
fn check_slots(ids: &[u32], pad: Option<u32>, images: usize) -> anyhow::Result<()> {
    let Some(pad) = pad else {
        if images > 0 {
            bail!("--image given, but the package names no image pad token");
        }
        return Ok(());
    };
    let starts: Vec<usize> = (0..ids.len())
        .filter(|&i| ids[i] == pad && (i == 0 || ids[i - 1] != pad))
        .collect();
    if starts.len() > images {
        bail!(
            "image slot {} (token {}) has no --image: the prompt has {} image slots, {images} images were given",
            images,
            starts[images],
            starts.len()
        );
    }
    if starts.len() < images {
        bail!(
            "{images} images were given but the prompt has only {} image slots",
            starts.len()
        );
    }
    Ok(())
}

fn run_package(dir: &Path, args: &GenerateArgs) -> anyhow::Result<Greedy> {
    let t0 = std::time::Instant::now();
    let mut opts = BpuOptions {
        no_vision: args.image.is_empty(),
        ..BpuOptions::default()
    };
    args.bpu.apply(&mut opts);
    args.run.apply(&mut opts);
    let backend =
        BpuBackend::open(dir, &opts).with_context(|| format!("opening {}", dir.display()))?;
    let cfg = backend.config();
    let tokenizer = tokenizers::Tokenizer::from_file(&cfg.tokenizer)
        .map_err(|e| anyhow::anyhow!("{}: {e}", cfg.tokenizer.display()))?;
    let pad = cfg
        .image_token_id
        .or_else(|| tokenizer.token_to_id("<|image_pad|>"));
    check_slots(&args.prompt_ids, pad, args.image.len())?;
    let side = backend
        .info()
        .vision
        .map_or(1, |v| v.geometry.merged_side() as u32);
    let prompt = prompt_from_ids(&args.prompt_ids, pad.unwrap_or(u32::MAX), side)?;
    let images = args
        .image
        .iter()
        .map(|p| {
            let img = image::open(p)
                .with_context(|| format!("decoding image {}", p.display()))?
                .to_rgb8();
            let (w, h) = (img.width() as usize, img.height() as usize);
            let rgb = RgbImage::new(w, h, img.into_raw())
                .with_context(|| format!("image {}", p.display()))?;
            Ok(ImageInput::Rgb(rgb))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    tracing::info!(secs = t0.elapsed().as_secs_f64(), "package loaded");
    let mut engine = Engine::new(backend, std::sync::Arc::new(tokenizer));
    if args.max_new == 0 {
        return Ok(Greedy {
            tokens: Vec::new(),
            logits: Vec::new(),
        });
    }
    let mut sampler = Sampler::new(SamplingParams::default())?;
    // No eos: exactly `max_new` tokens, like `--hf` (the window end still stops early).
    let stream = StreamConfig::new(Vec::new(), args.max_new);
    let g = engine.generate(
        &prompt,
        &images,
        &mut sampler,
        stream,
        DecodeOptions { keep_logits: true },
        &mut |_| {},
    )?;
    tracing::info!(
        prompt = args.prompt_ids.len(),
        generated = g.completion.tokens.len(),
        finish = %g.completion.finish_reason,
        secs = t0.elapsed().as_secs_f64(),
        "generate done"
    );
    Ok(Greedy {
        tokens: g.completion.tokens,
        logits: g.step_logits,
    })
}

fn run_hf(dir: &Path, args: &GenerateArgs) -> anyhow::Result<Greedy> {
    let model = Qwen35Model::load(dir).with_context(|| format!("loading {}", dir.display()))?;
    let images = args
        .image
        .iter()
        .map(|p| load_image(p, &model))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let t0 = std::time::Instant::now();
    let gen = model.generate_greedy(&args.prompt_ids, &images, args.max_new)?;
    tracing::info!(
        prompt = args.prompt_ids.len(),
        generated = gen.tokens.len(),
        secs = t0.elapsed().as_secs_f64(),
        "generate done"
    );
    Ok(Greedy {
        tokens: gen.tokens,
        logits: gen.logits,
    })
}

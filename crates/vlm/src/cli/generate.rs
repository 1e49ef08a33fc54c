//! `vlm generate --hf <DIR> --prompt-ids <id,...> [--image <PNG>]... --max-new <N> --json`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{ArgGroup, Args};
use qwen35::{patchify_rgb8, PreparedImage, Qwen35Model};
use serde::Serialize;

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("model").required(true).args(["hf"])))]
pub struct GenerateArgs {
    /// HF checkpoint directory (config.json + *.safetensors); runs `qwen35` on the CPU.
    #[arg(long, value_name = "DIR")]
    pub hf: Option<PathBuf>,
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

pub fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    let Some(dir) = &args.hf else {
        bail!("--hf <DIR> is required");
    };
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

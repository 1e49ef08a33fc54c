//! `vlm detect <PACKAGE | --hf DIR> --image FILE --query TEXT [--max-objects N] [--points]
//! [--json] [--draw OUT.png]`: open-vocabulary detection ("where is it?") — the objects the
//! model finds, in pixels of the image, and optionally the image with them drawn.
//!
//! The answer is Qwen3.5's grounding JSON constrained by its schema (`vlm::grounding`), with a
//! token budget that always holds `--max-objects` objects; a budget the context window
//! cannot hold is refused before the model runs.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use serde_json::json;

use super::bpu_flags::{BpuFlags, RunFlags};
use vlm::assistant::Reply;
use vlm::engine::ImageInput;
use vlm::grounding::{self, DetectSpec, Detection, Kind};
use vlm::sampler::SamplingParams;
use vlm::vision::RgbImage;
use vlm_bpu::{open_assistant, ModelSource, OpenOptions};

#[derive(Debug, Args)]
pub struct DetectArgs {
    /// BLLM package folder (model.json); its files decide board libraries or the simulator.
    #[arg(
        value_name = "PACKAGE",
        required_unless_present = "hf",
        conflicts_with = "hf"
    )]
    pub package: Option<PathBuf>,
    /// HF checkpoint folder, run on the CPU.
    #[arg(long, value_name = "DIR")]
    pub hf: Option<PathBuf>,
    /// The image to look at (png or jpeg).
    #[arg(long, value_name = "FILE")]
    pub image: PathBuf,
    /// What to find: "cups", "the red cup", "people and doors".
    #[arg(long, value_name = "TEXT")]
    pub query: String,
    /// Most objects in the answer (the token budget grows with it).
    #[arg(long, value_name = "N", default_value_t = grounding::DEFAULT_MAX_OBJECTS)]
    pub max_objects: usize,
    /// Points (`point_2d`) instead of boxes.
    #[arg(long)]
    pub points: bool,
    /// Sampling temperature; default 0 (greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the image with the detections drawn (PNG).
    #[arg(long, value_name = "OUT.png")]
    pub draw: Option<PathBuf>,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub bpu: BpuFlags,
    #[command(flatten)]
    pub run: RunFlags,
}

fn load_rgb(path: &Path) -> anyhow::Result<RgbImage> {
    let img = image::open(path)
        .with_context(|| format!("decoding image {}", path.display()))?
        .to_rgb8();
    let (w, h) = (img.width() as usize, img.height() as usize);
    RgbImage::new(w, h, img.into_raw()).with_context(|| format!("image {}", path.display()))
}

pub fn run(args: &DetectArgs) -> anyhow::Result<()> {
    let source = match (&args.package, &args.hf) {
        (Some(p), None) => ModelSource::Package(p.clone()),
        (None, Some(h)) => ModelSource::Hf(h.clone()),
        _ => bail!("give a package folder or --hf <DIR>"),
    };
    let spec = DetectSpec::new(&args.query, args.max_objects, args.points)?;
    let rgb = load_rgb(&args.image)?;
    let (w, h) = (rgb.width, rgb.height);
    let mut opts = OpenOptions::default();
    args.bpu.apply(&mut opts.bpu);
    args.run.apply(&mut opts.bpu);
    let mut assistant = open_assistant(&source, &opts)
        .with_context(|| format!("opening {}", source.dir().display()))?;
    let mut turn = spec.turn(
        &assistant.json_schemas(),
        vec![ImageInput::Rgb(rgb.clone())],
    )?;
    turn.sampling = SamplingParams {
        temperature: args.temperature,
        seed: args.seed,
        ..SamplingParams::default()
    };
    let rows = assistant.fresh_turn_rows(&turn)?;
    grounding::fit_budget(&spec, assistant.info().context, rows)?;
    let reply = assistant.ask(None, &turn, &mut |_| {})?;
    let tokenizer = assistant.template().tokenizer().clone();
    let found = grounding::detections_of_reply(&reply, &spec, &tokenizer, w, h)
        .with_context(|| format!("the answer {:?}", reply.completion.text))?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        serde_json::to_writer(&mut out, &result_json(&reply, &found, w, h))?;
        writeln!(out)?;
    } else {
        for d in &found {
            writeln!(out, "{}", line(d))?;
        }
        if found.is_empty() {
            writeln!(out, "nothing found")?;
        }
    }
    out.flush()?;
    if let Some(path) = &args.draw {
        write_drawing(rgb, &found, path)?;
    }
    Ok(())
}

/// `0 cup 0.83 box (64.0, 96.0)-(192.0, 192.0)` or `1 door 0.61 point (160.0, 360.0)`.
fn line(d: &Detection) -> String {
    let ([x1, y1], [x2, y2]) = d.corners();
    match d.kind {
        Kind::Boxes => format!(
            "{} {} {:.2} box ({x1:.1}, {y1:.1})-({x2:.1}, {y2:.1})",
            d.index, d.label, d.score
        ),
        Kind::Points => format!(
            "{} {} {:.2} point ({x1:.1}, {y1:.1})",
            d.index, d.label, d.score
        ),
    }
}

fn result_json(reply: &Reply, found: &[Detection], w: usize, h: usize) -> serde_json::Value {
    let c = &reply.completion;
    let detections: Vec<_> = found
        .iter()
        .map(|d| {
            let ([x1, y1], [x2, y2]) = d.corners();
            let mut o = json!({
                "id": d.index,
                "label": d.label,
                "score": d.score,
                "center": d.center,
                "size": d.size,
            });
            match d.kind {
                Kind::Boxes => o["bbox"] = json!([x1, y1, x2, y2]),
                Kind::Points => o["point"] = json!(d.center),
            }
            o
        })
        .collect();
    json!({
        "detections": detections,
        "text": c.text,
        "image_width": w,
        "image_height": h,
        "finish_reason": c.finish_reason.as_str(),
        "prompt_tokens": c.timings.prompt_tokens,
        "completion_tokens": c.timings.completion_tokens,
        "ttft_s": c.timings.ttft.map(|d| d.as_secs_f64()),
        "total_s": c.timings.total.as_secs_f64(),
        "seed": reply.seed,
    })
}

fn write_drawing(rgb: RgbImage, found: &[Detection], path: &Path) -> anyhow::Result<()> {
    let marks: Vec<annotate::Mark> = found.iter().map(mark).collect();
    let (w, h) = (rgb.width, rgb.height);
    let mut data = rgb.data;
    annotate::draw(&mut data, w, h, &marks)?;
    let img = image::RgbImage::from_raw(w as u32, h as u32, data)
        .context("the drawn image has the frame's size")?;
    img.save_with_format(path, image::ImageFormat::Png)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A detection as the drawing crate takes it: the label with its score on the tag.
fn mark(d: &Detection) -> annotate::Mark {
    let ([x1, y1], [x2, y2]) = d.corners();
    let shape = match d.kind {
        Kind::Boxes => annotate::Shape::Box { x1, y1, x2, y2 },
        Kind::Points => annotate::Shape::Point {
            x: d.center[0],
            y: d.center[1],
        },
    };
    annotate::Mark {
        shape,
        label: format!("{} {:.2}", d.label, d.score),
        index: d.index,
    }
}

//! `vlm chat <PACKAGE | --hf DIR> [--image PATH]... [--no-think] [sampling flags]`: one turn
//! with `--prompt`, else a REPL on stdin that keeps the conversation (one line per turn).
//!
//! `--json-schema FILE` constrains every answer to a JSON Schema (structured output): thinking
//! off unless `--think`, penalties off unless set, no tools or stop strings; an answer cut by
//! `--max-new-tokens` before its value is complete is an error (`incomplete`).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;

use super::bpu_flags::{BpuFlags, RunFlags};
use serde_json::json;
use vlm::assistant::{Assistant, Conversation, Reply, Turn};
use vlm::engine::ImageInput;
use vlm::sampler::SamplingParams;
use vlm::stream::Event;
use vlm::structured::JsonSchema;
use vlm::vision::RgbImage;
use vlm_bpu::{open_assistant, ModelSource, OpenOptions};

#[derive(Debug, Args)]
pub struct ChatArgs {
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
    /// One turn with this text, then exit; without it, read turns from stdin.
    #[arg(long, short = 'p', value_name = "TEXT")]
    pub prompt: Option<String>,
    /// Image for the first turn (repeatable; each is one image block).
    #[arg(long, value_name = "PATH")]
    pub image: Vec<PathBuf>,
    /// Answer without thinking (the empty think block).
    #[arg(long)]
    pub no_think: bool,
    /// Think before answering: the default, except with --json-schema, where this turns the
    /// think block on (the constraint then starts at the answer).
    #[arg(long, conflicts_with = "no_think")]
    pub think: bool,
    /// Constrain each answer to this JSON Schema (structured output). Bound strings and
    /// arrays (maxLength, maxItems) so a value fits --max-new-tokens.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<PathBuf>,
    /// System prompt (default: the package's).
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// OpenAI-style tool list as a JSON file.
    #[arg(long, value_name = "FILE")]
    pub tools: Option<PathBuf>,
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 = greedy. Default: the model card's setting for the mode.
    #[arg(long)]
    pub temperature: Option<f32>,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub top_p: Option<f32>,
    #[arg(long)]
    pub min_p: Option<f32>,
    #[arg(long)]
    pub typical_p: Option<f32>,
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    #[arg(long)]
    pub frequency_penalty: Option<f32>,
    #[arg(long)]
    pub presence_penalty: Option<f32>,
    /// Tokens the penalties look back over (-1 = the whole context).
    #[arg(long, allow_negative_numbers = true)]
    pub penalty_last_n: Option<i32>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop string (repeatable).
    #[arg(long, value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Text only: never open the vision tower.
    #[arg(long)]
    pub no_vision: bool,
    /// BPU task priority (0..=255).
    #[arg(long, default_value_t = 0)]
    pub priority: u8,
    #[command(flatten)]
    pub bpu: BpuFlags,
    #[command(flatten)]
    pub run: RunFlags,
    /// Print each turn's result as one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

fn load_image(path: &Path) -> anyhow::Result<ImageInput> {
    let img = image::open(path)
        .with_context(|| format!("decoding image {}", path.display()))?
        .to_rgb8();
    let (w, h) = (img.width() as usize, img.height() as usize);
    let rgb =
        RgbImage::new(w, h, img.into_raw()).with_context(|| format!("image {}", path.display()))?;
    Ok(ImageInput::Rgb(rgb))
}

impl ChatArgs {
    /// Thinking on: by default, but with a schema only when asked (`--think`).
    fn thinking(&self) -> bool {
        if self.json_schema.is_some() {
            self.think
        } else {
            !self.no_think
        }
    }

    fn sampling(&self) -> SamplingParams {
        let mut s = if self.thinking() {
            SamplingParams::qwen35_thinking()
        } else {
            SamplingParams::qwen35_non_thinking()
        };
        if self.json_schema.is_some() {
            // The model card's presence penalty would push the value away from the
            // punctuation JSON repeats: penalties only when asked for.
            s.presence_penalty = 0.0;
            s.frequency_penalty = 0.0;
            s.repetition_penalty = 1.0;
        }
        let set = |dst: &mut f32, v: Option<f32>| {
            if let Some(v) = v {
                *dst = v;
            }
        };
        set(&mut s.temperature, self.temperature);
        set(&mut s.top_p, self.top_p);
        set(&mut s.min_p, self.min_p);
        set(&mut s.typical_p, self.typical_p);
        set(&mut s.repetition_penalty, self.repetition_penalty);
        set(&mut s.frequency_penalty, self.frequency_penalty);
        set(&mut s.presence_penalty, self.presence_penalty);
        if let Some(k) = self.top_k {
            s.top_k = k;
        }
        if let Some(n) = self.penalty_last_n {
            s.penalty_last_n = n;
        }
        s.seed = self.seed;
        s
    }
}

fn print_reply(reply: &Reply, json: bool, out: &mut impl Write) -> anyhow::Result<()> {
    let c = &reply.completion;
    if json {
        let calls: Vec<_> = c.tool_calls.iter().map(|t| t.to_json()).collect();
        let mut o = json!({
            "answer": c.text,
            "reasoning": c.reasoning,
            "tool_calls": calls,
            "finish_reason": c.finish_reason.as_str(),
            "tokens": c.tokens,
            "prompt_tokens": c.timings.prompt_tokens,
            "completion_tokens": c.timings.completion_tokens,
            "ttft_s": c.timings.ttft.map(|d| d.as_secs_f64()),
            "decode_tokens_per_s": c.timings.decode_tokens_per_s,
            "seed": reply.seed,
        });
        if reply.constraint.is_some() {
            // `answer` holds the JSON text; a cut one is a failure with the partial text.
            let incomplete = reply.is_incomplete();
            o["json_schema"] = json!(if incomplete { "incomplete" } else { "complete" });
            if incomplete {
                o["error"] = json!("incomplete");
            }
        }
        serde_json::to_writer(&mut *out, &o)?;
        writeln!(out)?;
    } else {
        writeln!(out)?;
        for call in &c.tool_calls {
            writeln!(out, "[tool call] {}", call.to_json())?;
        }
        tracing::info!(
            finish = %c.finish_reason,
            prompt_tokens = c.timings.prompt_tokens,
            completion_tokens = c.timings.completion_tokens,
            ttft_ms = c.timings.ttft.map(|d| d.as_millis() as u64),
            tok_s = c.timings.decode_tokens_per_s,
            "turn done"
        );
    }
    out.flush()?;
    Ok(())
}

pub fn run(args: &ChatArgs) -> anyhow::Result<()> {
    let source = match (&args.package, &args.hf) {
        (Some(p), None) => ModelSource::Package(p.clone()),
        (None, Some(h)) => ModelSource::Hf(h.clone()),
        _ => bail!("give a package folder or --hf <DIR>"),
    };
    let mut opts = OpenOptions {
        vision: !args.no_vision,
        ..OpenOptions::default()
    };
    opts.bpu.priority = args.priority;
    args.bpu.apply(&mut opts.bpu);
    args.run.apply(&mut opts.bpu);
    let tools = read_tools(args)?;
    if args.json_schema.is_some() && !tools.is_empty() {
        bail!("--json-schema cannot be combined with --tools (tool calls are XML, not JSON)");
    }
    if args.json_schema.is_some() && !args.stop.is_empty() {
        bail!("--json-schema cannot be combined with --stop (a stop string could cut the value)");
    }
    let schema_text = match &args.json_schema {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading the JSON schema {}", p.display()))?,
        ),
        None => None,
    };
    let mut images = args
        .image
        .iter()
        .map(|p| load_image(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut assistant = open_assistant(&source, &opts)
        .with_context(|| format!("opening {}", source.dir().display()))?;
    let schema: Option<Arc<JsonSchema>> = match (&schema_text, &args.json_schema) {
        (Some(text), Some(p)) => Some(
            assistant
                .json_schemas()
                .compile(text)
                .with_context(|| format!("JSON schema {}", p.display()))?,
        ),
        _ => None,
    };
    let mut conversation: Option<Conversation> = None;
    let turn_of = |text: String, images: Vec<ImageInput>| {
        let mut t = Turn::new(text, args.max_new_tokens);
        t.images = images;
        t.thinking = args.thinking();
        t.json_schema = schema.clone();
        t.system = args.system.clone();
        t.tools = tools.clone();
        t.sampling = args.sampling();
        t.stop = args.stop.clone();
        // Only the REPL continues a conversation; a single --prompt turn needs no snapshot.
        t.keep = args.prompt.is_none();
        t
    };
    if let Some(p) = &args.prompt {
        let turn = turn_of(p.clone(), std::mem::take(&mut images));
        return answer(args.json, &mut assistant, &mut conversation, turn);
    }
    eprintln!(
        "{} ({}) ready; one line per turn, an empty line or end of input quits",
        assistant.info().name,
        assistant.info().backend
    );
    for line in std::io::stdin().lock().lines() {
        let line = line.context("reading stdin")?;
        if line.trim().is_empty() {
            break;
        }
        let turn = turn_of(line, std::mem::take(&mut images));
        // A failed turn is reported; the conversation continues from its last good state.
        if let Err(e) = answer(args.json, &mut assistant, &mut conversation, turn) {
            eprintln!("error: {e:#}");
        }
    }
    Ok(())
}

/// `--tools FILE`: a JSON array of OpenAI-style tools; none without the flag.
fn read_tools(args: &ChatArgs) -> anyhow::Result<Vec<serde_json::Value>> {
    let Some(p) = &args.tools else {
        return Ok(Vec::new());
    };
    let text =
        std::fs::read_to_string(p).with_context(|| format!("reading tools {}", p.display()))?;
    match serde_json::from_str(&text).with_context(|| format!("parsing tools {}", p.display()))? {
        serde_json::Value::Array(a) => Ok(a),
        _ => bail!("{}: the tool list must be a JSON array", p.display()),
    }
}

/// Runs one turn: streams its text to stdout (unless `json`), prints the result, and keeps
/// the conversation it continues from.
fn answer(
    json: bool,
    assistant: &mut Assistant,
    conversation: &mut Option<Conversation>,
    turn: Turn,
) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut in_reasoning = false;
    let mut on_event = |e: Event| {
        if json {
            return;
        }
        if let Event::Text { text, reasoning } = e {
            if reasoning != in_reasoning {
                let _ = write!(out, "{}", if reasoning { "<think>" } else { "</think>\n" });
                in_reasoning = reasoning;
            }
            let _ = write!(out, "{text}");
            let _ = out.flush();
        }
    };
    let reply = assistant.ask(conversation.as_ref(), &turn, &mut on_event)?;
    if in_reasoning {
        write!(out, "</think>")?;
    }
    print_reply(&reply, json, &mut out)?;
    let incomplete = reply.is_incomplete();
    if let Some(c) = reply.conversation {
        *conversation = Some(c);
    }
    if incomplete {
        bail!(
            "incomplete: --max-new-tokens {} ended the answer before its JSON value",
            turn.max_new_tokens
        );
    }
    Ok(())
}

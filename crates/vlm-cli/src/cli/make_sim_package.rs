//! `vlm make-sim-package --hf <DIR> --out <DIR> [--cache-len N] [--prefill-chunk N] ...`:
//! an HF Qwen3.5 checkpoint → a package with the published layout whose `.hbm` files are
//! simulator containers (`bpu_sim::package`). Flag names and defaults are pinned by issue 4.

use std::path::PathBuf;

use anyhow::{bail, Context};
use bpu_sim::package::{make_sim_package, PackageOptions, PrefillIn};
use bpu_sim::{LogitsType, PadLayout, PadMask, PadRope};
use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PrefillInArg {
    Model,
    Separate,
    Both,
    None,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PrefillLogitsArg {
    Last,
    All,
}

/// Where the padded prefill graph expects its pad rows.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PadLayoutArg {
    /// Pads in front of the real rows; the physically last row's logits are the output.
    First,
    /// Pads after the real rows; the graph outputs the last real row's logits.
    Last,
}

/// The rope values by which the padded prefill graph recognises a pad row.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PadRopeArg {
    /// cos 1, sin 0 (what the runtime writes unless calibrated otherwise).
    Identity,
    /// cos 0, sin 0.
    Zero,
}

/// The mask row by which the padded prefill graph recognises a pad row.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PadMaskArg {
    /// Every column masked (what the runtime writes unless calibrated otherwise).
    Masked,
    /// Only the pad's own slot open.
    #[value(name = "self")]
    SelfOnly,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogitsArg {
    F32,
    S16,
}

#[derive(Debug, Args)]
pub struct MakeSimPackageArgs {
    /// HF checkpoint directory (config.json, model*.safetensors, tokenizer.json).
    #[arg(long, value_name = "DIR")]
    pub hf: Option<PathBuf>,
    /// Output package directory (created).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// A config.json to use instead of the checkpoint's (with --no-weights: real shapes only).
    #[arg(long, value_name = "CONFIG_JSON")]
    pub config: Option<PathBuf>,
    /// Write graphs without weights: runnable only with the simulator's timing model.
    #[arg(long)]
    pub no_weights: bool,
    /// tokenizer.json to copy (default: the checkpoint's).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// K/V window of the graphs (the package's context length).
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub cache_len: usize,
    /// Rows per prefill chunk.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub prefill_chunk: usize,
    /// Which file carries `qwen35_prefill`.
    #[arg(long, value_enum, default_value = "separate")]
    pub prefill_in: PrefillInArg,
    /// Leading dim of the attention mask: `1` or `H` (the attention head count).
    #[arg(long, value_name = "1|H", default_value = "H")]
    pub mask_heads: String,
    /// Prefill logits: the last row only, or every row (older graphs).
    #[arg(long, value_enum, default_value = "last")]
    pub prefill_logits: PrefillLogitsArg,
    /// Logits tensor type of the text graphs.
    #[arg(long, value_enum, default_value = "f32")]
    pub logits: LogitsArg,
    /// The prefill graph accepts a padded tail (inferred protocol, docs/package-contract.md §4.4).
    #[arg(long)]
    pub prefill_pads: bool,
    /// `prefill_min_tail` written with --prefill-pads.
    #[arg(long, value_name = "N")]
    pub prefill_min_tail: Option<usize>,
    /// Where the padded prefill graph expects its pad rows (it counts the pads as the rows
    /// marked with --pad-rope and --pad-mask and takes the rows of its layout as the pads,
    /// whatever the runtime put there). Not written to model.json: the runtime has to find
    /// out (`--prefill-tail auto` calibrates).
    #[arg(long, value_enum, default_value = "last", requires = "prefill_pads")]
    pub pad_layout: PadLayoutArg,
    /// The rope values of a pad row the padded prefill graph recognises (a runtime writing
    /// others gets wrong numbers). Not written to model.json.
    #[arg(
        long,
        value_enum,
        default_value = "identity",
        requires = "prefill_pads"
    )]
    pub pad_rope: PadRopeArg,
    /// The mask row of a pad the padded prefill graph recognises (a runtime writing another
    /// gets wrong numbers). Not written to model.json.
    #[arg(long, value_enum, default_value = "masked", requires = "prefill_pads")]
    pub pad_mask: PadMaskArg,
    /// Rank of the vision tower's input and output: 2 (`[n, len]`) or more (leading 1s, e.g.
    /// 3 for `[1, n, len]`).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub tower_rank: usize,
    /// Every graph reports -1 strides and alignedByteSize -1: the runtime picks the layout.
    #[arg(long)]
    pub dynamic_strides: bool,
    /// Per-axis quantisation: S16 logits with one scale per vocabulary entry (scaleLen > 1,
    /// quantizeAxis >= 0), which the runtime must refuse. Implies `--logits s16`.
    #[arg(long)]
    pub quant_axis: bool,
}

pub fn run(args: &MakeSimPackageArgs) -> anyhow::Result<()> {
    let hf = match (&args.hf, &args.config) {
        (Some(hf), _) => hf.clone(),
        // --config alone: shapes from that file; the folder only supplies the tokenizer.
        (None, Some(cfg)) if args.no_weights => cfg
            .parent()
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(".")),
        _ => bail!("--hf <DIR> is required (or --config <FILE> --no-weights)"),
    };
    let mask_heads_one = match args.mask_heads.as_str() {
        "1" => true,
        "H" | "h" => false,
        other => bail!("--mask-heads takes 1 or H, not {other:?}"),
    };
    let mut o = PackageOptions::new(&hf, &args.out);
    o.config = args.config.clone();
    o.no_weights = args.no_weights;
    o.tokenizer = args.tokenizer.clone();
    o.cache_len = args.cache_len;
    o.prefill_chunk = args.prefill_chunk;
    o.prefill_in = match args.prefill_in {
        PrefillInArg::Model => PrefillIn::Model,
        PrefillInArg::Separate => PrefillIn::Separate,
        PrefillInArg::Both => PrefillIn::Both,
        PrefillInArg::None => PrefillIn::None,
    };
    o.mask_heads_one = mask_heads_one;
    o.prefill_logits_all = matches!(args.prefill_logits, PrefillLogitsArg::All);
    o.logits = match args.logits {
        LogitsArg::F32 if !args.quant_axis => LogitsType::F32,
        _ => LogitsType::S16,
    };
    o.tower_rank = args.tower_rank;
    o.dynamic_strides = args.dynamic_strides;
    o.quant_axis = args.quant_axis;
    o.prefill_pads = args.prefill_pads;
    o.prefill_min_tail = args.prefill_min_tail;
    o.pad_layout = match args.pad_layout {
        PadLayoutArg::First => PadLayout::First,
        PadLayoutArg::Last => PadLayout::Last,
    };
    o.pad_rope = match args.pad_rope {
        PadRopeArg::Identity => PadRope::Identity,
        PadRopeArg::Zero => PadRope::Zero,
    };
    o.pad_mask = match args.pad_mask {
        PadMaskArg::Masked => PadMask::Masked,
        PadMaskArg::SelfOnly => PadMask::SelfOnly,
    };
    let summary = make_sim_package(&o)
        .with_context(|| format!("writing sim package {}", args.out.display()))?;
    tracing::info!(
        vocab = summary.vocab,
        hidden = summary.hidden,
        vision = summary.vision,
        "sim package written"
    );
    for f in &summary.files {
        println!("{}", f.display());
    }
    Ok(())
}

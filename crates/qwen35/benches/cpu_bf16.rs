//! Speed benchmark (not a test): a text model with the shapes of `--config` (default: the
//! Qwen3.5-0.8B-shaped `tools/bench/qwen35-0.8b-text.json`) and random bf16 weights, made in
//! this process and written as a checkpoint to a temporary directory, then loaded through the
//! normal path (`Qwen35Model::load`: bf16 kept in place in the memory map). Speed does not
//! depend on the weight values.
//!
//! Measures prefill tokens/s for one `--prompt`-token forward, decode tokens/s over
//! `--decode` greedy one-row steps after it, peak RSS (`VmHWM`), and the weight bytes a
//! decode step streams per second next to the machine's read bandwidth on the same threads
//! (decode is bound by it); prints one JSON object.
//! `tools/bench/cpu-vs-hf.sh` runs it beside the transformers script and prints the ratios.
//!
//! ```text
//! cargo bench -p qwen35 --bench cpu_bf16 -- --threads 2 --prompt 512 --decode 32
//! ```
#![allow(clippy::unwrap_used)]

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use qwen35::{argmax, LayerType, LogitRows, Pos3, Qwen35Model, TextConfig};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

struct Args {
    config: PathBuf,
    threads: usize,
    prompt: usize,
    decode: usize,
    repeats: usize,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        config: Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tools/bench/qwen35-0.8b-text.json"),
        threads: 2,
        prompt: 512,
        decode: 32,
        repeats: 2,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().with_context(|| format!("{k} needs a value"));
        match k.as_str() {
            "--bench" => {} // added by `cargo bench`
            "--config" => a.config = PathBuf::from(val()?),
            "--threads" => a.threads = val()?.parse()?,
            "--prompt" => a.prompt = val()?.parse()?,
            "--decode" => a.decode = val()?.parse()?,
            "--repeats" => a.repeats = val()?.parse()?,
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(a)
}

/// (name, shape) of every tensor of a text-only checkpoint, HF names.
fn tensor_list(c: &TextConfig) -> Vec<(String, Vec<usize>)> {
    let h = c.hidden_size;
    let mut t = vec![
        (
            "model.embed_tokens.weight".to_string(),
            vec![c.vocab_size, h],
        ),
        ("model.norm.weight".to_string(), vec![h]),
    ];
    if !c.tie_word_embeddings {
        t.push(("lm_head.weight".to_string(), vec![c.vocab_size, h]));
    }
    for (i, lt) in c.layer_types.iter().enumerate() {
        let p = format!("model.layers.{i}.");
        let mut add = |n: &str, s: Vec<usize>| t.push((format!("{p}{n}"), s));
        add("input_layernorm.weight", vec![h]);
        add("post_attention_layernorm.weight", vec![h]);
        add("mlp.gate_proj.weight", vec![c.intermediate_size, h]);
        add("mlp.up_proj.weight", vec![c.intermediate_size, h]);
        add("mlp.down_proj.weight", vec![h, c.intermediate_size]);
        match lt {
            LayerType::LinearAttention => {
                let (hv, dv) = (c.linear_num_value_heads, c.linear_value_head_dim);
                let conv = c.linear_conv_dim();
                add("linear_attn.in_proj_qkv.weight", vec![conv, h]);
                add("linear_attn.in_proj_z.weight", vec![hv * dv, h]);
                add("linear_attn.in_proj_b.weight", vec![hv, h]);
                add("linear_attn.in_proj_a.weight", vec![hv, h]);
                add(
                    "linear_attn.conv1d.weight",
                    vec![conv, 1, c.linear_conv_kernel_dim],
                );
                add("linear_attn.dt_bias", vec![hv]);
                add("linear_attn.A_log", vec![hv]);
                add("linear_attn.norm.weight", vec![dv]);
                add("linear_attn.out_proj.weight", vec![h, hv * dv]);
            }
            LayerType::FullAttention => {
                let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
                add("self_attn.q_proj.weight", vec![2 * nh * hd, h]);
                add("self_attn.k_proj.weight", vec![nkv * hd, h]);
                add("self_attn.v_proj.weight", vec![nkv * hd, h]);
                add("self_attn.o_proj.weight", vec![h, nh * hd]);
                add("self_attn.q_norm.weight", vec![hd]);
                add("self_attn.k_norm.weight", vec![hd]);
            }
        }
    }
    t
}

/// Writes `dir/model.safetensors` with random bf16 values of magnitude 2⁻¹⁰..2⁻⁴ (finite, no
/// subnormals), streamed in 1 MiB pieces so generation adds nothing to the peak RSS.
fn write_random_checkpoint(c: &TextConfig, dir: &Path, seed: u64) -> Result<u64> {
    let tensors = tensor_list(c);
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for (name, shape) in &tensors {
        let bytes = 2 * shape.iter().product::<usize>();
        header.insert(
            name.clone(),
            json!({"dtype": "BF16", "shape": shape, "data_offsets": [off, off + bytes]}),
        );
        off += bytes;
    }
    let mut hb = serde_json::to_vec(&header)?;
    while hb.len() % 8 != 0 {
        hb.push(b' ');
    }
    let f = std::fs::File::create(dir.join("model.safetensors"))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    w.write_all(&(hb.len() as u64).to_le_bytes())?;
    w.write_all(&hb)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut buf = vec![0u8; 1 << 20];
    let mut left = off;
    while left > 0 {
        let n = left.min(buf.len());
        for pair in buf[..n].chunks_exact_mut(2) {
            let r = rng.next_u32();
            // sign | exponent 117..=123 | 7 random mantissa bits
            let bits = ((r & 0x8000) | ((117 + (r >> 16) % 7) << 7) | ((r >> 8) & 0x7f)) as u16;
            pair.copy_from_slice(&bits.to_le_bytes());
        }
        w.write_all(&buf[..n])?;
        left -= n;
    }
    // written back before anything is timed: kernel writeback of 1.5 GB of dirty pages would
    // otherwise compete with the measured runs for memory bandwidth
    w.into_inner()
        .map_err(|e| anyhow::anyhow!("flush checkpoint: {e}"))?
        .sync_all()?;
    Ok(off as u64)
}

/// `VmHWM` / `VmRSS` of this process in bytes.
fn proc_status_bytes(key: &str) -> Result<u64> {
    let s = std::fs::read_to_string("/proc/self/status")?;
    let line = s
        .lines()
        .find(|l| l.starts_with(key))
        .with_context(|| format!("{key} not in /proc/self/status"))?;
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .context("malformed status line")?
        .parse()?;
    Ok(kb * 1024)
}

/// The machine's read bandwidth on this thread pool, the ceiling of a decode step (which
/// streams every weight once): best of 5 parallel sums over 512 MiB (well above any cache).
/// Runs after the RSS figures are taken, so its buffer does not count in them.
fn read_ceiling_gb_s() -> f64 {
    use rayon::prelude::*;
    let words = (512usize << 20) / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let mut best = 0.0f64;
    for _ in 0..5 {
        let t = Instant::now();
        let s: u64 = buf
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
            .reduce(|| 0, u64::wrapping_add);
        let dt = t.elapsed().as_secs_f64();
        std::hint::black_box(s);
        best = best.max((words * 8) as f64 / dt / 1e9);
    }
    best
}

fn main() -> Result<()> {
    let a = parse_args()?;
    rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads)
        .build_global()?;
    let tmp = tempfile::tempdir()?;
    std::fs::copy(&a.config, tmp.path().join("config.json"))
        .with_context(|| format!("copy {}", a.config.display()))?;
    let cfg = qwen35::Config::from_file(&tmp.path().join("config.json"))?;
    let t0 = Instant::now();
    let file_bytes = write_random_checkpoint(&cfg.text, tmp.path(), 0x5eed)?;
    let gen_s = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let model = Qwen35Model::load(tmp.path())?;
    let load_s = t0.elapsed().as_secs_f64();
    let weight_bytes = model.text.weight_bytes() as u64;
    let vocab = cfg.text.vocab_size as u64;
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let ids: Vec<u32> = (0..a.prompt)
        .map(|_| (rng.next_u64() % vocab) as u32)
        .collect();
    let embeds = model.text.embed(&ids)?;
    let positions: Vec<Pos3> = (0..a.prompt as i64).map(Pos3::text).collect();

    // prefill: one forward of the whole prompt, best of `repeats` (the first also pages the
    // weights in from the page cache)
    let mut prefill_s = f64::INFINITY;
    let mut state = model.text.new_state();
    let mut last = Vec::new();
    for _ in 0..a.repeats.max(1) {
        state = model.text.new_state();
        let t = Instant::now();
        last = model
            .text
            .forward(&embeds, &positions, &mut state, LogitRows::Last)?;
        prefill_s = prefill_s.min(t.elapsed().as_secs_f64());
    }

    // decode: greedy one-row steps continuing the prompt
    let mut tok = argmax(&last) as u32;
    let mut steps = Vec::with_capacity(a.decode);
    for i in 0..a.decode {
        let x = model.text.embed(&[tok])?;
        let p = [Pos3::text((a.prompt + i) as i64)];
        let t = Instant::now();
        let l = model.text.forward(&x, &p, &mut state, LogitRows::Last)?;
        steps.push(t.elapsed().as_secs_f64());
        tok = argmax(&l) as u32;
    }
    let decode_total: f64 = steps.iter().sum();
    let mut sorted = steps.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN);

    let peak_rss = proc_status_bytes("VmHWM:")?;
    let final_rss = proc_status_bytes("VmRSS:")?;
    let ceiling = read_ceiling_gb_s();

    let out = json!({
        "impl": "qwen35",
        "isa": format!("{:?}", qwen35::kernels::bf16::Isa::detect()),
        "threads": a.threads,
        "config": a.config.display().to_string(),
        "weights_dtype": "bf16",
        "checkpoint_bytes": file_bytes,
        "weight_bytes": weight_bytes,
        "generate_s": gen_s,
        "load_s": load_s,
        "prompt_tokens": a.prompt,
        "prefill_s": prefill_s,
        "prefill_tok_s": a.prompt as f64 / prefill_s,
        "decode_tokens": a.decode,
        "decode_s": decode_total,
        "decode_tok_s": a.decode as f64 / decode_total,
        "decode_median_step_s": median,
        "decode_tok_s_median": 1.0 / median,
        // a decode step reads every weight matrix once (the tied embedding as the lm_head)
        "decode_weight_gb_s": file_bytes as f64 / median / 1e9,
        "read_ceiling_gb_s": ceiling,
        "peak_rss_bytes": peak_rss,
        "final_rss_bytes": final_rss,
    });
    println!("{out}");
    Ok(())
}

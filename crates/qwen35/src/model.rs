//! A whole HF checkpoint directory: config, text model, optional vision tower.

use std::path::Path;

use crate::config::Config;
use crate::error::Result;
use crate::text::TextModel;
use crate::vision::VisionTower;
use crate::weights::WeightStore;

/// `Qwen3_5ForConditionalGeneration` (or a text-only checkpoint) loaded for the CPU.
pub struct Qwen35Model {
    pub config: Config,
    pub text: TextModel,
    pub vision: Option<VisionTower>,
}

impl Qwen35Model {
    /// Loads `dir/config.json` and every `dir/*.safetensors` (memory-mapped, converted to f32).
    pub fn load(dir: &Path) -> Result<Self> {
        let config = Config::from_file(&dir.join("config.json"))?;
        let ws = WeightStore::open_dir(dir)?;
        Self::from_store(config, &ws)
    }

    /// Builds from an already opened store (tests convert weights in memory).
    pub fn from_store(config: Config, ws: &WeightStore) -> Result<Self> {
        let _span = tracing::info_span!("qwen35_load").entered();
        let text_prefix = if ws.contains("model.language_model.embed_tokens.weight") {
            "model.language_model."
        } else {
            "model."
        };
        let text = TextModel::new(&config.text, ws, text_prefix)?;
        let vision = match &config.vision {
            Some(vc) => Some(VisionTower::new(vc, ws, "model.visual.")?),
            None => None,
        };
        tracing::info!(
            layers = config.text.num_layers(),
            hidden = config.text.hidden_size,
            vision = vision.is_some(),
            "loaded Qwen3.5 checkpoint"
        );
        Ok(Self {
            config,
            text,
            vision,
        })
    }
}

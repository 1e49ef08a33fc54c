//! Incremental detokenising and stop strings: the first two stages of the text pipeline.

use tokenizers::Tokenizer;

use super::StreamError;

/// Incremental detokeniser over a window of ids.
#[derive(Debug, Default)]
pub(super) struct Detok {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl Detok {
    /// Ids taken so far.
    pub(super) fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub(super) fn into_ids(self) -> Vec<u32> {
        self.ids
    }

    fn decode(tok: &Tokenizer, ids: &[u32]) -> Result<String, StreamError> {
        tok.decode(ids, false)
            .map_err(|e| StreamError::Decode(e.to_string()))
    }

    fn delta(&self, tok: &Tokenizer) -> Result<(String, usize), StreamError> {
        let before = Self::decode(tok, &self.ids[self.prefix..self.read])?;
        let now = Self::decode(tok, &self.ids[self.prefix..])?;
        Ok((now, before.len()))
    }

    pub(super) fn step(&mut self, tok: &Tokenizer, id: u32) -> Result<Option<String>, StreamError> {
        self.ids.push(id);
        let (now, start) = self.delta(tok)?;
        if now.len() > start && !now.ends_with('\u{FFFD}') {
            if let Some(d) = now.get(start..) {
                let d = d.to_string();
                self.prefix = self.read;
                self.read = self.ids.len();
                return Ok(Some(d));
            }
        }
        Ok(None)
    }

    /// Takes `id` without its text: the window restarts after it.
    pub(super) fn skip(&mut self, id: u32) {
        self.ids.push(id);
        self.prefix = self.ids.len();
        self.read = self.ids.len();
    }

    /// Everything not yet emitted; an incomplete UTF-8 tail comes out as U+FFFD.
    pub(super) fn flush(&mut self, tok: &Tokenizer) -> Result<String, StreamError> {
        if self.read == self.ids.len() {
            return Ok(String::new());
        }
        let (now, start) = self.delta(tok)?;
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(now.get(start..).map(str::to_string).unwrap_or_default())
    }
}

/// Holds back text that could still become a stop string.
#[derive(Debug, Default)]
pub(super) struct StopFilter {
    stops: Vec<String>,
    pending: String,
    hit: bool,
}

impl StopFilter {
    /// Empty stop strings never match and are dropped.
    pub(super) fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..Self::default()
        }
    }

    /// A stop string matched: the text ended there.
    pub(super) fn hit(&self) -> bool {
        self.hit
    }

    /// Returns the text that is final now, and whether a stop string matched.
    pub(super) fn push(&mut self, text: &str) -> (String, bool) {
        if self.hit {
            return (String::new(), true);
        }
        self.pending.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.pending), false);
        }
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(m) = first {
            let out = self.pending[..m].to_string();
            self.pending.clear();
            self.hit = true;
            return (out, true);
        }
        let hold = (0..self.pending.len())
            .filter(|&i| self.pending.is_char_boundary(i))
            .find(|&i| {
                let tail = &self.pending[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.pending.len());
        let out = self.pending[..hold].to_string();
        self.pending.drain(..hold);
        (out, false)
    }

    /// What is held back, unless a stop string matched.
    pub(super) fn flush(&mut self) -> String {
        if self.hit {
            return String::new();
        }
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_filter_holds_back_prefixes_and_cuts_matches() {
        let mut f = StopFilter {
            stops: vec!["STOP".into(), "\n\nUser:".into()],
            ..Default::default()
        };
        assert_eq!(f.push("hello S"), ("hello ".into(), false));
        assert_eq!(f.push("T"), (String::new(), false));
        assert_eq!(f.push("x"), ("STx".into(), false));
        assert_eq!(f.push("a\n"), ("a".into(), false));
        assert_eq!(f.push("\nUs"), (String::new(), false));
        assert_eq!(f.push("er: more"), (String::new(), true));
        assert_eq!(f.flush(), "");
        let mut f = StopFilter {
            stops: vec!["é!".into()],
            ..Default::default()
        };
        assert_eq!(f.push("caf"), ("caf".into(), false));
        assert_eq!(f.push("é"), (String::new(), false));
        assert_eq!(f.flush(), "é");
    }
}

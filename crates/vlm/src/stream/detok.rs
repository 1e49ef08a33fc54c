//! Incremental detokenising and stop strings: the first two stages of the text pipeline.

use tokenizers::Tokenizer;

use super::StreamError;

/// Pending ids (taken, not yet emitted) up to which every step decodes the whole window.
/// Beyond it a step first decodes only the last `TAIL` ids: a run of ids whose text keeps
/// ending in U+FFFD (an incomplete or invalid UTF-8 tail, which a model can emit for as long
/// as it likes) would otherwise cost a decode of the whole, growing window per id.
const TAIL: usize = 8;

/// Incremental detokeniser over a window of ids.
#[derive(Debug, Default)]
pub(super) struct Detok {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
    /// Ids handed to the tokenizer's decode so far: the cost the `TAIL` check bounds.
    decoded: usize,
}

impl Detok {
    /// Ids taken so far.
    pub(super) fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub(super) fn into_ids(self) -> Vec<u32> {
        self.ids
    }

    fn decode(&mut self, tok: &Tokenizer, from: usize, to: usize) -> Result<String, StreamError> {
        let ids = &self.ids[from..to];
        self.decoded += ids.len();
        tok.decode(ids, false)
            .map_err(|e| StreamError::Decode(e.to_string()))
    }

    fn delta(&mut self, tok: &Tokenizer) -> Result<(String, usize), StreamError> {
        let before = self.decode(tok, self.prefix, self.read)?;
        let now = self.decode(tok, self.prefix, self.ids.len())?;
        Ok((now, before.len()))
    }

    /// Whether the window's text still ends in U+FFFD, judged from its last `TAIL` ids alone
    /// once more than `TAIL` ids are pending. Whether a UTF-8 text ends in an incomplete or
    /// invalid sequence depends only on its last four bytes and on where the decoder
    /// resynchronises (at most four bytes before them), so eight ids of at least a byte each
    /// tell what the whole window would: the step emits nothing, as the whole window's
    /// decode would have decided. When they say no, the whole window is decoded as before.
    fn still_incomplete(&mut self, tok: &Tokenizer) -> Result<bool, StreamError> {
        let pending = self.ids.len() - self.read;
        if pending <= TAIL {
            return Ok(false);
        }
        let tail = self.decode(tok, self.ids.len() - TAIL, self.ids.len())?;
        Ok(tail.ends_with('\u{FFFD}'))
    }

    pub(super) fn step(&mut self, tok: &Tokenizer, id: u32) -> Result<Option<String>, StreamError> {
        self.ids.push(id);
        if self.still_incomplete(tok)? {
            return Ok(None);
        }
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

    fn fixture_tokenizer() -> Tokenizer {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tools/fixtures/tokenizer.json"
        );
        Tokenizer::from_file(path).unwrap()
    }

    /// Thousands of ids that each decode to the UTF-8 lead byte 0xE4 (byte-level `ä`): the
    /// text ends in U+FFFD after every one of them. The tokenizer sees a bounded number of
    /// ids per step (linear in the run, where re-decoding the window every step is
    /// quadratic), and the whole run still comes out once a character completes it.
    #[test]
    fn a_long_incomplete_tail_is_not_redecoded_every_step() {
        let tok = fixture_tokenizer();
        let lead = tok.token_to_id("ä").unwrap();
        let n = 4000;
        let mut d = Detok::default();
        for _ in 0..n {
            assert_eq!(d.step(&tok, lead).unwrap(), None);
        }
        assert!(
            d.decoded <= 2 * TAIL * n + 2 * TAIL * TAIL,
            "{} ids decoded for {n} steps",
            d.decoded
        );
        let done = tok.encode("中", false).unwrap().get_ids().to_vec();
        let mut text = String::new();
        for &id in &done {
            if let Some(t) = d.step(&tok, id).unwrap() {
                text.push_str(&t);
            }
        }
        text.push_str(&d.flush(&tok).unwrap());
        assert_eq!(text, format!("{}中", "\u{FFFD}".repeat(n)));
        assert!(d.decoded < 6 * TAIL * n, "{} ids decoded", d.decoded);
    }

    /// Valid text split into single bytes comes out as it does without the tail check.
    #[test]
    fn split_characters_come_out_whole() {
        let tok = fixture_tokenizer();
        let text = "héllo 中文 😀 \u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD} ok";
        let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
        let mut d = Detok::default();
        let mut out = String::new();
        for &id in &ids {
            if let Some(t) = d.step(&tok, id).unwrap() {
                out.push_str(&t);
            }
        }
        out.push_str(&d.flush(&tok).unwrap());
        assert_eq!(out, text);
    }

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

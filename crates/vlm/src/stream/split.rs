//! The `<think>` split and `<tool_call>` capture of the `qwen3.5` dialect: the last stage of
//! the text pipeline, after the stop strings.

use super::Event;

const THINK: &str = "<think>";
const THINK_END: &str = "</think>";
const TOOL: &str = "<tool_call>";
const TOOL_END: &str = "</tool_call>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    Answer,
    Think,
    Tool,
}

/// Routes final text to answer / reasoning / tool blocks.
#[derive(Debug)]
pub(super) struct Splitter {
    think_split: bool,
    tool_calls: bool,
    /// [`super::StreamConfig::verbatim_answer`]: no markers at all; the think block ends at a token.
    verbatim: bool,
    channel: Channel,
    pending: String,
    tool_buf: String,
    /// Trailing whitespace of the current channel, emitted only if more text follows.
    ws: String,
    answer_started: bool,
    reasoning_started: bool,
}

/// Sink for the splitter: emitted text and tool blocks.
pub(super) struct Out<'a> {
    pub(super) emit: &'a mut dyn FnMut(Event),
    pub(super) answer: &'a mut String,
    pub(super) reasoning: &'a mut String,
    pub(super) blocks: &'a mut Vec<String>,
}

impl Splitter {
    /// `starts_in_think`: the prompt opened a think block (only with `think_split`).
    pub(super) fn new(
        think_split: bool,
        tool_calls: bool,
        verbatim: bool,
        starts_in_think: bool,
    ) -> Self {
        Self {
            think_split,
            tool_calls,
            verbatim,
            channel: if think_split && starts_in_think {
                Channel::Think
            } else {
                Channel::Answer
            },
            pending: String::new(),
            tool_buf: String::new(),
            ws: String::new(),
            answer_started: false,
            reasoning_started: false,
        }
    }

    /// Text now goes to the answer (not to a think block nor a tool call).
    pub(super) fn answering(&self) -> bool {
        self.channel == Channel::Answer
    }

    /// Text now goes to a think block.
    pub(super) fn thinking(&self) -> bool {
        self.channel == Channel::Think
    }

    fn markers(&self) -> &'static [&'static str] {
        if self.verbatim {
            return &[];
        }
        match (self.channel, self.think_split, self.tool_calls) {
            (Channel::Think, ..) => &[THINK_END],
            (Channel::Tool, ..) => &[TOOL_END],
            (Channel::Answer, true, true) => &[THINK, THINK_END, TOOL],
            (Channel::Answer, true, false) => &[THINK, THINK_END],
            (Channel::Answer, false, true) => &[TOOL],
            (Channel::Answer, false, false) => &[],
        }
    }

    pub(super) fn push(&mut self, text: &str, out: &mut Out<'_>) {
        self.pending.push_str(text);
        loop {
            let markers = self.markers();
            let found = markers
                .iter()
                .filter_map(|m| self.pending.find(m).map(|i| (i, *m)))
                .min_by_key(|(i, _)| *i);
            match found {
                Some((i, marker)) => {
                    let before = self.pending[..i].to_string();
                    self.pending.drain(..i + marker.len());
                    self.route(&before, out);
                    self.switch(marker, out);
                }
                None => {
                    // Hold back a tail that could still grow into a marker.
                    let hold = self
                        .pending
                        .rfind('<')
                        .filter(|&i| {
                            let tail = &self.pending[i..];
                            markers.iter().any(|m| m.starts_with(tail))
                        })
                        .unwrap_or(self.pending.len());
                    let ready = self.pending[..hold].to_string();
                    self.pending.drain(..hold);
                    self.route(&ready, out);
                    return;
                }
            }
        }
    }

    fn switch(&mut self, marker: &str, out: &mut Out<'_>) {
        self.ws.clear();
        match (self.channel, marker) {
            (Channel::Answer, THINK) => self.channel = Channel::Think,
            (Channel::Think, THINK_END) => self.channel = Channel::Answer,
            (Channel::Answer, TOOL) => self.channel = Channel::Tool,
            (Channel::Tool, TOOL_END) => {
                out.blocks.push(std::mem::take(&mut self.tool_buf));
                self.channel = Channel::Answer;
            }
            // A stray `</think>` in the answer: dropped, never shown.
            _ => {}
        }
    }

    fn route(&mut self, text: &str, out: &mut Out<'_>) {
        if text.is_empty() {
            return;
        }
        match self.channel {
            Channel::Tool => self.tool_buf.push_str(text),
            Channel::Answer | Channel::Think if !self.think_split => {
                emit_text(text.to_string(), false, out)
            }
            Channel::Answer if self.verbatim => emit_text(text.to_string(), false, out),
            ch => {
                let reasoning = ch == Channel::Think;
                let started = if reasoning {
                    &mut self.reasoning_started
                } else {
                    &mut self.answer_started
                };
                let mut t = text;
                if !*started {
                    t = t.trim_start();
                    if t.is_empty() {
                        return;
                    }
                    *started = true;
                }
                let body = t.trim_end();
                if body.is_empty() {
                    self.ws.push_str(t);
                    return;
                }
                let mut s = std::mem::take(&mut self.ws);
                s.push_str(body);
                self.ws.push_str(&t[body.len()..]);
                emit_text(s, reasoning, out);
            }
        }
    }

    /// The `</think>` token of a verbatim answer: the think block ends here.
    pub(super) fn end_think(&mut self) {
        if self.channel == Channel::Think {
            self.ws.clear();
            self.channel = Channel::Answer;
        }
    }

    /// End of text: a partial marker is plain text; an open tool block is kept raw.
    pub(super) fn flush(&mut self, out: &mut Out<'_>) {
        let rest = std::mem::take(&mut self.pending);
        self.route(&rest, out);
        if self.channel == Channel::Tool {
            out.blocks.push(std::mem::take(&mut self.tool_buf));
        }
        if !self.think_split {
            let ws = std::mem::take(&mut self.ws);
            if !ws.is_empty() {
                emit_text(ws, false, out);
            }
        }
    }
}

fn emit_text(text: String, reasoning: bool, out: &mut Out<'_>) {
    if text.is_empty() {
        return;
    }
    if reasoning {
        out.reasoning.push_str(&text);
    } else {
        out.answer.push_str(&text);
    }
    (out.emit)(Event::Text { text, reasoning });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the splitter over `text` cut into pieces of `step` chars.
    fn split(text: &str, step: usize, starts_in_think: bool) -> (String, String, Vec<String>) {
        let mut sp = Splitter::new(true, true, false, starts_in_think);
        let (mut answer, mut reasoning, mut blocks) = (String::new(), String::new(), Vec::new());
        let mut sink = |e: Event| {
            if let Event::Text { text, .. } = e {
                assert!(
                    !text.contains("think>") && !text.contains("tool_call>"),
                    "{text:?}"
                );
            }
        };
        let mut out = Out {
            emit: &mut sink,
            answer: &mut answer,
            reasoning: &mut reasoning,
            blocks: &mut blocks,
        };
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(step) {
            sp.push(&piece.iter().collect::<String>(), &mut out);
        }
        sp.flush(&mut out);
        (answer, reasoning, blocks)
    }

    #[test]
    fn markers_split_across_pieces_are_recognised() {
        let text = "<think>\nLook at <b> the cup.\n</think>\n\nA red cup <3.\n<tool_call>\n<function=f>\n</function>\n</tool_call>";
        for step in 1..=9 {
            let (answer, reasoning, blocks) = split(text, step, false);
            assert_eq!(reasoning, "Look at <b> the cup.", "step {step}");
            assert_eq!(answer, "A red cup <3.", "step {step}");
            assert_eq!(blocks, vec!["\n<function=f>\n</function>\n".to_string()]);
        }
        let (answer, reasoning, _) = split("plan</think>done <thi", 2, true);
        assert_eq!((answer.as_str(), reasoning.as_str()), ("done <thi", "plan"));
    }
}

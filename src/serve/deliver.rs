//! One job served to its end: whatever generation gives (an answer, a failure, a panic), the
//! job's last Token, its `Answer` and its response go out, each exactly once, all read from
//! one [`Outcome`].

use std::time::Instant;

use vlm::stream::FinishReason;

use crate::interface::ErrorCode;
use crate::msgs::msg::{Answer, Token};
use crate::process::panics::{contained, Panic};
use crate::ros::clock::RosClock;
use crate::ros::publish::Publish;
use crate::ros::text::NulCount;
use crate::serve::failure::Failure;
use crate::serve::job::{Job, JobPlan};
use crate::serve::outcome::{Generated, Outcome};
use crate::serve::sessions::Sessions;
use crate::serve::stats::{update, SharedStats};
use crate::serve::token_sink::{GoalFeedback, TokenSink};
use r2r::std_msgs::msg::Header;

/// Publishers the worker streams into.
pub(crate) struct Outputs {
    pub tokens: Box<dyn Publish<Token>>,
    pub answers: Box<dyn Publish<Answer>>,
    /// Stamps the Tokens and the Answer.
    pub clock: RosClock,
    /// Counts the NULs replaced in them.
    pub nuls: NulCount,
}

/// How serving one job went.
pub(crate) struct Served {
    /// The answer completed.
    pub(crate) ok: bool,
    /// A panic was contained while serving it.
    pub(crate) panic: Option<Panic>,
}

/// Serves one job to its end: `generate` (contained) gives the result, from which the last
/// Token, the Answer and the response are sent — after a panic too, each exactly once. The
/// Answer and the response report `session_turn` ([`crate::serve::sessions::Sessions::turn`]
/// before this turn), whatever the result.
pub(crate) fn serve(
    job: Job,
    session_turn: u32,
    outputs: &Outputs,
    stats: &SharedStats,
    generate: impl FnOnce(&mut JobPlan, &mut TokenSink<'_>) -> Result<Generated, Failure>,
) -> Served {
    let _span = tracing::info_span!("ask", request_id = %job.id).entered();
    let Job {
        id,
        mut plan,
        admission,
        respond,
        feedback,
    } = job;
    admission.running();
    let mut origin = plan.images.origin();
    if let Some(stamp) = plan.scene_checked {
        origin.scene_checked = stamp;
    }
    if let Some(GoalFeedback::Detect(f)) = &feedback {
        let header = Header {
            stamp: crate::ros::clock::time(origin.stamp),
            frame_id: origin.frame_id.clone(),
        };
        f.bind(header, origin.width, origin.height);
    }
    let session_tag = Sessions::tag(plan.session_id.as_deref());
    let quiet = plan.quiet;
    let mut sink = TokenSink::new(
        if quiet { &Discard } else { &*outputs.tokens },
        &outputs.clock,
        &outputs.nuls,
        &id,
        &origin.frame_id,
    )
    .with_feedback(feedback.as_ref());
    // A quiet job's Answer is not published: as if it had gone out already.
    let mut answered = quiet;
    let run = contained(|| {
        let result = generate(&mut plan, &mut sink);
        let prompt = std::mem::take(&mut plan.turn.text);
        let outcome = Outcome::new(id.clone(), prompt, origin.clone(), result, &outputs.nuls)
            .with_session_turn(session_turn)
            .with_session_tag(session_tag.clone());
        send_messages(&outcome, &mut sink, &mut answered, outputs, stats);
        outcome
    });
    let (outcome, panic) = match run {
        Ok(outcome) => (outcome, None),
        Err(p) => {
            let failure = Failure::new(ErrorCode::BackendError, format!("internal error: {p}"));
            let prompt = std::mem::take(&mut plan.turn.text);
            let outcome = Outcome::new(
                id.clone(),
                prompt,
                origin.clone(),
                Err(failure),
                &outputs.nuls,
            )
            .with_session_turn(session_turn)
            .with_session_tag(session_tag);
            let sent =
                contained(|| send_messages(&outcome, &mut sink, &mut answered, outputs, stats));
            if let Err(p) = sent {
                tracing::error!("the messages of a failed request could not be sent: {p}");
            }
            (outcome, Some(p))
        }
    };
    if quiet {
        // A watch evaluation, often stopped for an ask: its goal reports it.
        tracing::debug!(ok = outcome.succeeded(), "evaluation served");
    } else {
        log(&outcome);
    }
    // The place is free before the client hears: it may reuse the id at once.
    admission.release();
    // The client may have gone away; nothing to do then.
    let _ = respond.send(outcome.response());
    Served {
        ok: outcome.succeeded(),
        panic,
    }
}

/// The last Token and the Answer of `outcome`; each goes out once however often this runs.
fn send_messages(
    outcome: &Outcome,
    sink: &mut TokenSink<'_>,
    answered: &mut bool,
    outputs: &Outputs,
    stats: &SharedStats,
) {
    sink.finish(outcome.finish_reason());
    if !*answered {
        record_timings(stats, outcome);
        if let Err(e) = outputs
            .answers
            .publish(&outcome.answer(outputs.clock.now()))
        {
            tracing::warn!(error = %e, "could not publish the Answer");
        }
        *answered = true;
    }
}

/// Where a quiet job's Tokens go: nowhere.
struct Discard;

impl Publish<Token> for Discard {
    fn publish(&self, _: &Token) -> r2r::Result<()> {
        Ok(())
    }
}

/// A job cancelled or past its deadline before its turn came is answered without starting.
pub(crate) fn stopped_in_queue(job: &Job) -> Option<Failure> {
    let (code, reason) = if job.is_cancelled() {
        (ErrorCode::Cancelled, FinishReason::Cancelled)
    } else if job.is_past_deadline(Instant::now()) {
        (ErrorCode::Timeout, FinishReason::Timeout)
    } else {
        return None;
    };
    Some(Failure::new(
        code,
        format!("{reason} before generation started (while queued)"),
    ))
}

fn record_timings(stats: &SharedStats, outcome: &Outcome) {
    if outcome.completion().is_some() {
        let f = outcome.figures();
        let (ttft_s, tok_s) = (f.ttft_s, f.decode_tokens_per_s);
        update(stats, |s| {
            s.last_ttft_s = ttft_s;
            s.last_tokens_per_s = tok_s;
        });
    }
}

fn log(outcome: &Outcome) {
    if let Some(f) = outcome.failure() {
        tracing::warn!(code = f.code.as_str(), "ask failed: {}", f.message);
        return;
    }
    let f = outcome.figures();
    tracing::info!(
        finish = outcome.finish_reason().as_str(),
        prompt_tokens = f.prompt_tokens,
        completion_tokens = f.completion_tokens,
        ttft_s = f.ttft_s,
        tok_s = f.decode_tokens_per_s,
        "ask answered"
    );
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use vlm::assistant::Turn;
    use vlm::stream::{Completion, Timings};

    use super::*;
    use crate::ros::publish::Recorded;
    use crate::serve::job::Images;
    use crate::serve::registry::Registry;
    use crate::serve::stats::WorkerStats;

    /// A publisher both the outputs and the test hold.
    struct Shared<M>(Arc<Recorded<M>>);

    impl<M: Clone + Send> Publish<M> for Shared<M> {
        fn publish(&self, msg: &M) -> r2r::Result<()> {
            self.0.publish(msg)
        }
    }

    struct Harness {
        outputs: Outputs,
        tokens: Arc<Recorded<Token>>,
        answers: Arc<Recorded<Answer>>,
        stats: SharedStats,
        registry: Arc<Registry>,
    }

    fn harness() -> Harness {
        let tokens = Arc::new(Recorded::default());
        let answers = Arc::new(Recorded::default());
        Harness {
            outputs: Outputs {
                tokens: Box::new(Shared(tokens.clone())),
                answers: Box::new(Shared(answers.clone())),
                clock: RosClock::default(),
                nuls: NulCount::default(),
            },
            tokens,
            answers,
            stats: Arc::new(Mutex::new(WorkerStats::default())),
            registry: Arc::new(Registry::new(4)),
        }
    }

    fn job(
        h: &Harness,
        id: &str,
    ) -> (
        Job,
        tokio::sync::oneshot::Receiver<crate::msgs::srv::Ask::Response>,
    ) {
        let (respond, rx) = tokio::sync::oneshot::channel();
        let job = Job {
            id: id.into(),
            plan: JobPlan {
                turn: Turn::new("What is this?", 16),
                images: Images::None,
                session_id: None,
                max_image_age: None,
                scene_checked: None,
                detect: None,
                quiet: false,
            },
            admission: h.registry.admit(id).unwrap(),
            respond,
            feedback: None,
        };
        (job, rx)
    }

    fn completion(text: &str) -> Generated {
        Generated::from(Completion {
            text: text.into(),
            reasoning: String::new(),
            tool_calls: Vec::new(),
            invalid_tool_calls: Vec::new(),
            finish_reason: FinishReason::Stop,
            tokens: vec![1, 2],
            timings: Timings {
                prompt_tokens: 10,
                completion_tokens: 2,
                ttft: Some(Duration::from_millis(20)),
                decode_tokens_per_s: Some(50.0),
                total: Duration::from_millis(60),
            },
        })
    }

    /// The deltas, then one `last` Token with the finish reason, then the Answer and the
    /// response, all with the request's id; its place in the registry is free before the
    /// response goes out.
    #[test]
    fn an_outcome_ends_the_token_stream_then_publishes_the_answer() {
        let h = harness();
        let (job, mut rx) = job(&h, "req-7");
        let served = serve(job, 3, &h.outputs, &h.stats, |_, sink| {
            sink.delta("an ".into(), false);
            sink.delta("apple".into(), false);
            Ok(completion("an apple"))
        });
        assert!(served.ok && served.panic.is_none());
        let tokens = h.tokens.taken();
        assert_eq!(tokens.len(), 3);
        for (i, t) in tokens.iter().enumerate() {
            assert_eq!((t.request_id.as_str(), t.index), ("req-7", i as u32));
            assert_eq!(t.last, i == 2);
        }
        assert_eq!(tokens[2].finish_reason, "stop");
        assert!(tokens[2].text.is_empty());
        let answers = h.answers.taken();
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].request_id, "req-7");
        assert_eq!(answers[0].answer, "an apple");
        let response = rx.try_recv().unwrap();
        assert!(response.success);
        assert_eq!((answers[0].session_turn, response.session_turn), (3, 3));
        assert_eq!(response.request_id, "req-7");
        assert!(h.registry.is_empty());
        assert_eq!(h.stats.lock().unwrap().last_tokens_per_s, 50.0);
    }

    /// A NUL the model emits reaches no message (r2r would panic converting it): it is
    /// published as U+FFFD, in the Token and in the Answer.
    #[test]
    fn a_nul_in_model_text_is_made_safe_before_publishing() {
        let h = harness();
        let (job, mut rx) = job(&h, "req-nul");
        serve(job, 0, &h.outputs, &h.stats, |_, sink| {
            sink.delta("a\0b".into(), false);
            Ok(completion("a\0b"))
        });
        let tokens = h.tokens.taken();
        assert_eq!(tokens[0].text, "a\u{FFFD}b");
        let answers = h.answers.taken();
        assert_eq!(answers[0].answer, "a\u{FFFD}b");
        assert_eq!(rx.try_recv().unwrap().answer, "a\u{FFFD}b");
        for t in &tokens {
            assert!(std::ffi::CString::new(t.text.clone()).is_ok());
        }
        assert_eq!(h.outputs.nuls.total(), 1, "counted once, as it streamed");
    }

    /// A panic while generating fails that request alone: it still gets its `last` Token,
    /// its Answer and a `backend_error` response, each once.
    #[test]
    fn a_panic_in_generation_still_ends_the_request() {
        let h = harness();
        let (job, mut rx) = job(&h, "req-panic");
        let served = serve(job, 2, &h.outputs, &h.stats, |_, sink| {
            sink.delta("half".into(), false);
            panic!("kernel assert");
        });
        assert!(!served.ok);
        assert!(served
            .panic
            .is_some_and(|p| p.message.contains("kernel assert")));
        let tokens = h.tokens.taken();
        assert_eq!(tokens.len(), 2);
        assert!(tokens[1].last);
        assert_eq!(tokens[1].finish_reason, "error");
        let answers = h.answers.taken();
        assert_eq!(answers.len(), 1);
        let response = rx.try_recv().unwrap();
        assert!(!response.success);
        assert_eq!(response.error_code, "backend_error");
        // The turn it would have been, in both.
        assert_eq!((answers[0].session_turn, response.session_turn), (2, 2));
        assert!(response.error_message.contains("internal error"));
    }
}

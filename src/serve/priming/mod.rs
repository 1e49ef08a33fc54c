//! Frame priming (`prefill_latest_frame`): while no ask is queued, the worker runs the
//! newest frame of `prefill_camera` through the vision tower and prefills it after the system
//! block ([`Assistant::prime_frame`]), so an ask about that camera prefills only its
//! question.
//!
//! Which frame an ask gets ([`Primer::choose`], decided when its turn comes, before its
//! image is reported): the frame of the last completed priming when the ask accepts its age
//! (at the ask's arrival: within `max_image_age_s` when the ask sets a limit, else within
//! `prefill_max_age_s`) and has the same system prompt and tools; else a stopped priming of an
//! acceptable frame, which the ask continues; else the newest frame, prefilled in full as
//! without priming. The answer reports the frame actually used. A stopped priming the ask
//! does not continue is parked (a snapshot) and continued when the worker is idle again, while
//! its frame is younger than half of `prefill_max_age_s`.
//!
//! With `scene_check` (default on) the camera cache's scene signatures decide instead of the
//! frame's novelty: a priming starts only when the newest frame shows another scene than the
//! one primed last and that scene has held for `scene_settle_s` (or the priming reached
//! `prefill_max_age_s`, the safety cap), and an ask is served from a priming only when its
//! newest frame shows the priming's scene; the answer then reports that newest frame's stamp
//! as `scene_checked_stamp`. A changed scene is answered from the newest frame.
//!
//! Cost bounds: a priming starts only when the queue is empty, is asked before the frame's
//! conversion and before every graph call whether an ask came (and then stops there, so an ask
//! waits at most one graph call, and when that call completed the priming without a third
//! cache set to keep it in, its snapshot: a host copy of the whole decode state), keeps its BPU time to `prefill_duty` of the wall
//! time by resting after each priming (for all of its runs: one stopped by an ask goes on
//! right after the ask, and rests when it ends), and submits one priority below the asks'
//! `bpu_priority` (never below 0).

use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use camera_frame::{CachedFrame, CameraCache};
use vlm::assistant::{Assistant, AssistantError, PrimedFrame, PrimingOutcome, Reply, Turn};
use vlm::chat::SystemOptions;
use vlm::engine::EngineError;
use vlm::stream::Event;

use crate::process::panics::{contained, Panic};
use crate::ros::param_server::LiveParams;
use crate::serve::job::{Images, Job, JobPlan};

mod for_job;

/// How often an idle worker looks for a newer frame to prime.
const FRAME_POLL: Duration = Duration::from_millis(20);

/// Priming settings from the parameters.
#[derive(Clone)]
pub struct PrimingConfig {
    pub cameras: Arc<CameraCache>,
    /// `None`: the default camera.
    pub camera: Option<String>,
    /// Most share of wall time the primings may keep the BPU busy, in (0, 1].
    pub duty: f64,
    /// Oldest frame an ask without `max_image_age_s` is served from a priming.
    pub max_age: Duration,
    /// The served parameters: primings are made for the system block of the current
    /// `system_prompt` (settable at run time), no tools.
    pub params: LiveParams,
    /// Priority of the asks' BPU tasks; primings submit one below.
    pub ask_priority: u8,
    /// Whether the node serves (lifecycle `active`): an inactive node submits no BPU task.
    pub serving: Arc<std::sync::atomic::AtomicBool>,
    /// `scene_check`: prime on a change of scene, serve a primed frame only for the same
    /// scene as the camera's newest frame (the threshold is the camera cache's).
    pub scene_check: bool,
    /// `scene_settle_s`: how long a changed scene holds before it is primed.
    pub settle: Duration,
}

/// Counters for diagnostics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrimingStats {
    /// Primings completed.
    pub done: u64,
    /// Primings stopped at a graph-call boundary because an ask came.
    pub stopped: u64,
    /// Asks on the priming camera (fresh conversations) and those served from a priming.
    pub camera_asks: u64,
    pub hits: u64,
    /// Age of the primed frame at the last hit's arrival, seconds.
    pub last_hit_age_s: f64,
    /// Arrival of the frame of the completed priming, if any.
    pub frame_arrival: Option<Instant>,
    /// Share of wall time spent priming since the model was ready ([`Primer::stats`]).
    pub duty: f64,
    /// Primings started because the scene differed from the one last primed.
    pub change_prefills: u64,
    /// Asks served from a priming whose scene the camera's newest frame still shows.
    pub scene_same_asks: u64,
    /// Asks that found the scene of a priming changed, and were not served from it.
    pub scene_changed_asks: u64,
}

/// What an ask is served from.
pub enum Chosen {
    Completed(Arc<PrimedFrame>),
    /// The stopped priming, continued by the ask.
    Resume,
    /// A quiet job (a watch evaluation) on a scene not primed yet: the job primes its frame
    /// first, so the state stays for the asks and watches after it (or, when an ask stops
    /// the job, for that ask to continue), then answers from it.
    Prime(CachedFrame),
}

/// How a priming run ended, for the worker.
pub enum PrimingEnd {
    Fine,
    /// The backend cannot run anymore.
    Lost(String),
    Panicked(Panic),
}

/// The priming state of the worker.
pub struct Primer {
    cfg: PrimingConfig,
    system: SystemOptions,
    completed: Option<(CachedFrame, Arc<PrimedFrame>)>,
    /// The frame of a stopped priming.
    stopped: Option<CachedFrame>,
    /// The last frame tried (completed, stopped or failed), so none is tried twice.
    tried: Option<(Arc<str>, u64)>,
    /// No priming starts before this (`prefill_duty`).
    rest_until: Instant,
    /// BPU time of the stopped priming's runs so far: rested once it ends (completed or
    /// given up), so an ask that stops a priming does not also push its end back by a rest.
    unrested: Duration,
    /// The model cannot priming (no vision tower).
    off: bool,
    busy: Duration,
    since: Instant,
    stats: PrimingStats,
}

impl Primer {
    pub fn new(cfg: PrimingConfig, now: Instant) -> Self {
        let system = SystemOptions {
            system: cfg.params.snapshot().system_prompt.clone(),
            tools: Vec::new(),
        };
        let p = Self {
            cfg,
            system,
            completed: None,
            stopped: None,
            tried: None,
            rest_until: now,
            unrested: Duration::ZERO,
            off: false,
            busy: Duration::ZERO,
            since: now,
            stats: PrimingStats::default(),
        };
        match p.topic() {
            Some(topic) => tracing::info!(%topic, "frame priming on"),
            None => tracing::warn!(
                camera = ?p.cfg.camera,
                "frame priming off: prefill_camera names no configured camera"
            ),
        }
        p
    }

    pub fn stats(&self) -> PrimingStats {
        let wall = self.since.elapsed().as_secs_f64();
        PrimingStats {
            duty: if wall > 0.0 {
                self.busy.as_secs_f64() / wall
            } else {
                0.0
            },
            ..self.stats.clone()
        }
    }

    fn topic(&self) -> Option<Arc<str>> {
        match &self.cfg.camera {
            Some(name) => self.cfg.cameras.resolve(name),
            None => self
                .cfg
                .cameras
                .default_camera()
                .and_then(|t| self.cfg.cameras.resolve(t)),
        }
    }

    /// The frame to prime now, if one is due: a frame not tried yet, the duty rest over.
    fn due(&self, now: Instant) -> Option<CachedFrame> {
        if self.off || !self.serving() || now < self.rest_until {
            return None;
        }
        let f = self.cfg.cameras.latest(&self.topic()?)?;
        let seen = self
            .tried
            .as_ref()
            .is_some_and(|(t, seq)| *t == f.topic && *seq == f.seq);
        (!seen && self.scene_due(&f, now)).then_some(f)
    }

    /// With `scene_check`, whether `newest` is worth a priming: its scene differs from the
    /// one primed last and has held for `scene_settle_s`, or the priming of its scene reached
    /// `prefill_max_age_s` (the safety cap). A frame without a signature is primed as
    /// without `scene_check`.
    fn scene_due(&self, newest: &CachedFrame, now: Instant) -> bool {
        let primed = self.completed.as_ref().map(|(f, _)| f);
        scene_due(&self.cfg, primed, newest, now)
    }

    /// Whether `newer` shows `frame`'s scene (always, without `scene_check`).
    fn same_scene(&self, frame: &CachedFrame, newer: &CachedFrame) -> bool {
        !self.cfg.scene_check || frame.same_scene(newer, self.cfg.cameras.scene_threshold())
    }

    /// The camera's newest frame, if it shows another scene than `frame`.
    fn scene_moved_on(&self, frame: &CachedFrame) -> bool {
        self.cfg
            .cameras
            .latest(&frame.topic)
            .is_some_and(|newest| !self.same_scene(frame, &newest))
    }

    /// Follows a run-time set of `system_prompt`: what was primed for the old one can
    /// serve no default ask anymore, so it is dropped (not continued, not parked) and the
    /// newest frame, even one tried already, is primed again for the new one.
    fn follow_system(&mut self) {
        let live = self.cfg.params.snapshot().system_prompt.clone();
        if live != self.system.system {
            tracing::debug!("system_prompt changed: primings start over");
            self.system.system = live;
            self.completed = None;
            self.settle(Instant::now());
            self.tried = None;
        }
    }

    /// Drops every priming (completed and stopped): after the engine was reset or reopened.
    pub fn forget(&mut self) {
        self.completed = None;
        self.stats.frame_arrival = None;
        self.settle(Instant::now());
        self.tried = None;
    }

    fn serving(&self) -> bool {
        self.cfg.serving.load(std::sync::atomic::Ordering::Acquire)
    }

    /// How long an idle worker may wait for a job before looking again.
    pub fn wait(&self, now: Instant, idle: Duration) -> Duration {
        if self.due(now).is_some() {
            return Duration::ZERO;
        }
        let rest = self.rest_until.saturating_duration_since(now);
        if self.off {
            idle
        } else if rest > Duration::ZERO {
            rest.min(idle)
        } else {
            FRAME_POLL.min(idle)
        }
    }

    /// The frame to prime now, if any: a stopped priming of a still recent frame goes on (its
    /// work is done up to there); an older one gives way to the newest frame when it is due.
    fn next_frame(&mut self, assistant: &Assistant, now: Instant) -> Option<CachedFrame> {
        let worth = |f: &CachedFrame| {
            f.age(now) < self.cfg.max_age / 2
                && assistant.can_resume_priming(&self.system)
                && !self.scene_moved_on(f)
        };
        if self.stopped.as_ref().is_some_and(|f| !worth(f)) {
            // Given up: its runs are rested before anything new starts.
            self.settle(now);
        }
        let resumable = self.stopped.clone().filter(|_| now >= self.rest_until);
        resumable.or_else(|| self.due(now))
    }

    /// Primings the due frame (if any) while `jobs` stays empty. A job that arrives meanwhile
    /// stops the work at the next graph call and is left in `pending`.
    pub fn run(
        &mut self,
        assistant: &mut Assistant,
        jobs: &Receiver<Job>,
        pending: &mut Option<Job>,
        shutdown: &vlm::interrupt::Interrupt,
    ) -> PrimingEnd {
        if !self.serving() {
            return PrimingEnd::Fine;
        }
        self.follow_system();
        let now = Instant::now();
        let Some(frame) = self.next_frame(assistant, now) else {
            return PrimingEnd::Fine;
        };
        let mut closed = false;
        let serving = self.cfg.serving.clone();
        let mut interrupt = || {
            if pending.is_none() && !closed {
                match jobs.try_recv() {
                    Ok(j) => *pending = Some(j),
                    Err(TryRecvError::Disconnected) => closed = true,
                    Err(TryRecvError::Empty) => {}
                }
            }
            // A deactivate stops a running priming too: an inactive node submits no BPU task.
            let serving = serving.load(std::sync::atomic::Ordering::Acquire);
            pending.is_some() || closed || shutdown.is_raised() || !serving
        };
        // The frame's conversion (a JPEG decode, an NV12 conversion) cannot be interrupted:
        // an ask that came meanwhile goes first.
        if interrupt() {
            return PrimingEnd::Fine;
        }
        self.tried = Some((frame.topic.clone(), frame.seq));
        let system = self.system.clone();
        // The stopped priming of this very frame goes on where it stopped, without its image.
        let resume = self
            .stopped
            .as_ref()
            .is_some_and(|s| s.seq == frame.seq && s.topic == frame.topic)
            && assistant.can_resume_priming(&system);
        let image = if resume {
            None
        } else {
            match Images::Camera(frame.clone()).take_inputs(None) {
                Ok((mut images, _)) if images.len() == 1 => Some(images.remove(0)),
                Ok(_) => return PrimingEnd::Fine,
                Err(f) => {
                    tracing::debug!("frame not primed: {}", f.message);
                    return PrimingEnd::Fine;
                }
            }
        };
        if image.is_some() {
            self.count_change(&frame);
        }
        assistant.set_priority(self.cfg.ask_priority.saturating_sub(1));
        let t0 = Instant::now();
        let ran = contained(|| match &image {
            Some(image) => assistant.prime_frame(&system, image, &mut interrupt),
            None => assistant.resume_priming(&mut interrupt),
        });
        let end = Instant::now();
        assistant.set_priority(self.cfg.ask_priority);
        self.busy += end - t0;
        self.unrested += end - t0;
        match ran {
            Ok(Ok(PrimingOutcome::Done(p))) => {
                self.stats.done += 1;
                self.stats.frame_arrival = Some(frame.arrival);
                self.completed = Some((frame, Arc::new(p)));
                self.settle(end);
                PrimingEnd::Fine
            }
            Ok(Ok(PrimingOutcome::Stopped)) => {
                self.stats.stopped += 1;
                // Tried again when the worker is idle next, from where it stopped, without a
                // rest in between (its rest comes when it ends).
                self.tried = None;
                if assistant.can_resume_priming(&self.system) {
                    self.stopped = Some(frame);
                } else {
                    self.settle(end);
                }
                PrimingEnd::Fine
            }
            Ok(Err(e)) => self.failed(&e),
            Err(p) => PrimingEnd::Panicked(p),
        }
    }

    /// Counts a priming of `frame` that starts because the scene changed.
    fn count_change(&mut self, frame: &CachedFrame) {
        let changed = self
            .completed
            .as_ref()
            .is_some_and(|(done, _)| !self.same_scene(done, frame));
        self.stats.change_prefills += u64::from(self.cfg.scene_check && changed);
    }

    fn failed(&mut self, e: &AssistantError) -> PrimingEnd {
        self.settle(Instant::now());
        match e {
            AssistantError::Engine(e) if e.backend_is_lost() => {
                return PrimingEnd::Lost(e.to_string())
            }
            AssistantError::Engine(EngineError::NoVision) => {
                tracing::warn!("frame priming off: the model has no vision tower");
                self.off = true;
            }
            _ => {
                // Not retried at the camera's rate: a failure that repeats logs once a second.
                tracing::warn!("frame priming failed: {e}");
                self.rest_until = self.rest_until.max(Instant::now() + Duration::from_secs(1));
            }
        }
        PrimingEnd::Fine
    }

    /// Ends the stopped priming, if any, and rests so that primes keep the BPU at most
    /// `duty` of the time: after the BPU time of a priming's runs (all of them, when asks
    /// stopped it in between), `time · (1 − duty) / duty` idle, from `now` (its end).
    fn settle(&mut self, now: Instant) {
        self.stopped = None;
        let duty = self.cfg.duty.clamp(0.01, 1.0);
        let rest = std::mem::take(&mut self.unrested).mul_f64((1.0 - duty) / duty);
        self.rest_until = self.rest_until.max(now + rest);
    }

    /// Decides what a job is served from and makes its image the chosen frame (so the answer
    /// reports it). `fresh`: the job starts a new conversation. `None`: served as without
    /// priming.
    pub fn choose(
        &mut self,
        plan: &mut JobPlan,
        fresh: bool,
        assistant: &mut Assistant,
    ) -> Option<Chosen> {
        // A stopped priming for a system prompt set away is not parked for nothing.
        self.follow_system();
        let chosen = self.decide(plan, fresh, assistant);
        tracing::debug!(
            chosen = match &chosen {
                Some(Chosen::Completed(_)) => "completed priming",
                Some(Chosen::Resume) => "stopped priming, continued",
                Some(Chosen::Prime(_)) => "primed by the job",
                None => "no priming",
            },
            stopped = self.stopped.is_some(),
            "frame chosen"
        );
        // A stopped priming the ask does not continue is kept (a snapshot) to go on later,
        // unless its frame is too old to be continued anyway (`run`).
        if !matches!(chosen, Some(Chosen::Resume)) {
            let now = Instant::now();
            let worth =
                |f: &CachedFrame| f.age(now) < self.cfg.max_age / 2 && !self.scene_moved_on(f);
            if !self.stopped.as_ref().is_some_and(worth) {
                self.settle(now);
            } else if let Err(e) = assistant.stash_priming() {
                tracing::warn!("the stopped priming could not be kept: {e}");
                self.settle(now);
            }
        }
        chosen
    }

    fn decide(&mut self, plan: &mut JobPlan, fresh: bool, assistant: &Assistant) -> Option<Chosen> {
        let Images::Camera(newest) = &plan.images else {
            return None;
        };
        if !fresh || Some(&newest.topic) != self.topic().as_ref() {
            return None;
        }
        let newest = newest.clone();
        let mut changed = false;
        self.stats.camera_asks += 1;
        let limit = plan.max_image_age.unwrap_or(self.cfg.max_age);
        let arrival = plan.turn.started;
        let accepts = |f: &CachedFrame| f.age(arrival) <= limit;
        let opts = SystemOptions {
            system: plan.turn.system.clone(),
            tools: plan.turn.tools.clone(),
        };
        if let Some((frame, p)) = self.completed.clone() {
            if accepts(&frame) && assistant.primed_frame_fits(&p, &plan.turn) {
                if self.same_scene(&frame, &newest) {
                    self.hit(&frame, &newest, plan);
                    plan.images = Images::Camera(frame);
                    return Some(Chosen::Completed(p));
                }
                changed = true;
            }
        }
        if let Some(frame) = self.stopped.clone() {
            if accepts(&frame) && assistant.can_resume_priming(&opts) {
                if self.same_scene(&frame, &newest) {
                    self.hit(&frame, &newest, plan);
                    plan.images = Images::Camera(frame);
                    return Some(Chosen::Resume);
                }
                changed = true;
            }
        }
        self.stats.scene_changed_asks += u64::from(changed);
        let own_system = plan.turn.system.as_deref() == self.system.system.as_deref()
            && plan.turn.tools.is_empty();
        (plan.quiet && own_system && self.serving()).then_some(Chosen::Prime(newest))
    }

    /// Counts a hit on `frame`; with `scene_check`, `newest` (the ask's newest frame) is the
    /// one found to show the same scene.
    fn hit(&mut self, frame: &CachedFrame, newest: &CachedFrame, plan: &mut JobPlan) {
        self.stats.hits += 1;
        self.stats.last_hit_age_s = frame.age(plan.turn.started).as_secs_f64();
        if self.cfg.scene_check {
            self.stats.scene_same_asks += 1;
            plan.scene_checked = Some(newest.stamp);
        }
    }

    /// Answers `turn` from what [`Primer::choose`] chose. `None` when that is no longer
    /// possible (a stopped priming that cannot go on): the caller asks as without priming,
    /// on the same frame.
    pub fn answer(
        &mut self,
        chosen: Chosen,
        assistant: &mut Assistant,
        turn: &Turn,
        on_event: &mut dyn FnMut(Event),
    ) -> Option<Result<Reply, AssistantError>> {
        let p = match chosen {
            Chosen::Completed(p) => p,
            Chosen::Prime(frame) => match self.prime_for(frame, assistant, turn) {
                Ok(p) => p,
                Err(e) => return Some(Err(e)),
            },
            Chosen::Resume => {
                let cancel = turn.cancel.clone();
                let mut stop = || {
                    cancel
                        .as_ref()
                        .is_some_and(|c| c.load(std::sync::atomic::Ordering::Acquire))
                };
                let frame = self.stopped.take()?;
                // The ask finishes the priming: what ran of it in the background is rested.
                self.settle(Instant::now());
                match assistant.resume_priming(&mut stop) {
                    Ok(PrimingOutcome::Done(p)) => {
                        self.stats.done += 1;
                        self.stats.frame_arrival = Some(frame.arrival);
                        let p = Arc::new(p);
                        self.completed = Some((frame, Arc::clone(&p)));
                        p
                    }
                    // Stopped by the turn's own cancel (a watch evaluation yielding to an ask,
                    // or a cancelled ask): the priming stays where it stopped, for the next job
                    // to continue, and the turn ends without running anything else.
                    Ok(PrimingOutcome::Stopped) if stop() => {
                        self.stopped = Some(frame);
                        return Some(Err(for_job::cancelled_priming()));
                    }
                    Ok(PrimingOutcome::Stopped) => return None,
                    Err(e) => return Some(Err(e)),
                }
            }
        };
        Some(assistant.ask_primed(&p, turn, on_event))
    }
}

/// [`Primer::scene_due`] for the frame of the completed priming, `primed`.
fn scene_due(
    cfg: &PrimingConfig,
    primed: Option<&CachedFrame>,
    newest: &CachedFrame,
    now: Instant,
) -> bool {
    if !cfg.scene_check || newest.scene.is_none() {
        return true;
    }
    if let Some(frame) = primed {
        if frame.same_scene(newest, cfg.cameras.scene_threshold()) {
            return frame.age(now) >= cfg.max_age;
        }
    }
    let since = cfg.cameras.stats(&newest.topic).and_then(|s| s.scene_since);
    since.is_some_and(|t| now.saturating_duration_since(t) >= cfg.settle)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use camera_frame::CacheConfig;
    use r2r::ParameterValue;

    use super::*;
    use crate::ros::param_server::ParamServer;
    use crate::ros::params::Params;

    fn live() -> LiveParams {
        LiveParams::new(Params::from_values(&HashMap::new()).unwrap())
    }

    fn prefiller(duty: f64, now: Instant) -> Primer {
        prefiller_with(duty, now, live())
    }

    fn prefiller_with(duty: f64, now: Instant, params: LiveParams) -> Primer {
        let cameras = CameraCache::new(
            CacheConfig {
                topics: vec!["/cam".into()],
                default_camera: None,
                warn_interval: Duration::from_secs(10),
            },
            now,
        )
        .unwrap();
        let cfg = PrimingConfig {
            cameras: Arc::new(cameras),
            camera: None,
            duty,
            max_age: Duration::from_secs(10),
            params,
            ask_priority: 0,
            serving: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            scene_check: true,
            settle: Duration::from_millis(500),
        };
        Primer::new(cfg, now)
    }

    #[test]
    fn the_duty_rests_in_proportion_and_no_frame_means_polling() {
        let now = Instant::now();
        let mut half = prefiller(0.5, now);
        assert_eq!(half.topic().as_deref(), Some("/cam"), "the default camera");
        // No frame yet: nothing due, the worker looks again after a short poll.
        assert!(half.due(now).is_none());
        assert_eq!(half.wait(now, Duration::from_secs(1)), FRAME_POLL);
        // Duty 0.5: as long a rest as the priming took, counted from its end.
        let spent = Duration::from_millis(400);
        let end = now + Duration::from_secs(3);
        half.unrested = spent;
        half.settle(end);
        assert_eq!(half.rest_until, end + spent);
        assert!(half.due(end + spent / 2).is_none(), "resting");
        assert_eq!(
            half.wait(end + spent / 2, Duration::from_secs(1)),
            spent / 2
        );
        assert_eq!(
            half.wait(end, Duration::from_millis(100)),
            Duration::from_millis(100)
        );
        // Duty 0.25: three times as long.
        let mut quarter = prefiller(0.25, now);
        quarter.unrested = spent;
        quarter.settle(end);
        assert_eq!(quarter.rest_until, end + spent * 3);
        let mut full = prefiller(1.0, now);
        full.unrested = spent;
        full.settle(end);
        assert_eq!(full.rest_until, end, "duty 1: none");
        // A priming stopped by asks rests for all of its runs once it ends, not after each:
        // the ask that stopped it is not followed by a rest before it goes on.
        let mut stopped = prefiller(0.5, now);
        stopped.unrested = spent;
        assert_eq!(stopped.rest_until, now, "no rest while it is stopped");
        stopped.unrested += spent;
        stopped.settle(end);
        assert_eq!(stopped.rest_until, end + spent * 2);
        assert_eq!(stopped.unrested, Duration::ZERO);
    }

    #[test]
    fn a_run_time_system_prompt_is_followed_and_starts_the_pre_fills_over() {
        let now = Instant::now();
        let params = live();
        let server = ParamServer::new(params.clone(), false);
        let mut p = prefiller_with(1.0, now, params);
        assert_eq!(p.system.system, None, "empty = the package's");
        p.tried = Some(("/cam".into(), 7));
        p.follow_system();
        assert!(p.tried.is_some(), "unchanged: nothing starts over");
        server
            .set("system_prompt", &ParameterValue::String("Be brief.".into()))
            .unwrap();
        p.follow_system();
        assert_eq!(p.system.system.as_deref(), Some("Be brief."));
        assert!(p.tried.is_none(), "the tried frame is primed again");
        assert!(p.completed.is_none() && p.stopped.is_none());
    }

    /// A 640×480 mono8 frame: a scene (bands whose brightness `scene` picks) with noise of
    /// about σ = 5/255 from `seed`, and optionally a 64×64 patch of a new object.
    fn picture(scene: u8, seed: u64, patch: bool) -> camera_frame::Frame {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut data = vec![0u8; 640 * 480];
        for (i, p) in data.iter_mut().enumerate() {
            let (col, row) = (i % 640, i / 640);
            let base = (40 + (col / 80 + row / 60) as u32 * 12 * u32::from(scene)) % 220;
            let object = patch && (300..364).contains(&col) && (200..264).contains(&row);
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Three uniforms in -4..=3 summed, times 4/3: σ ≈ 5.3 (mean ≈ -2), a harder noise
            // than the σ = 4 the threshold is chosen for.
            let noise: i32 = (0..3).map(|k| ((x >> (k * 8)) & 7) as i32 - 4).sum::<i32>() * 4 / 3;
            let v = if object { 250 } else { base as i32 + noise };
            *p = v.clamp(0, 255) as u8;
        }
        camera_frame::Frame::from_image(
            camera_frame::ImageMsg {
                encoding: "mono8",
                width: 640,
                height: 480,
                step: 640,
                is_bigendian: false,
                data,
            },
            &camera_frame::Limits::default(),
        )
        .unwrap()
    }

    fn show(p: &Primer, frame: camera_frame::Frame, at: Instant) -> CachedFrame {
        p.cfg
            .cameras
            .record("/cam", Ok(frame), camera_frame::Stamp::default(), at)
            .unwrap();
        p.cfg.cameras.latest("/cam").unwrap()
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn a_static_scene_is_primed_once_and_refreshed_only_at_the_safety_cap() {
        let t0 = Instant::now();
        let mut p = prefiller(1.0, t0);
        p.cfg.max_age = Duration::from_secs(60);
        let first = show(&p, picture(1, 1, false), t0);
        assert!(!p.scene_due(&first, t0), "not before the scene held");
        assert!(
            p.scene_due(&first, t0 + MS(500)),
            "the first scene, settled"
        );
        // Primed; every later frame shows the same scene through its noise.
        // A frame every 0.5 s up to the cap (a tenth of a 10 Hz camera's, to keep it short).
        for i in 1..120u64 {
            let at = t0 + MS(500 * i);
            let f = show(&p, picture(1, 100 + i, false), at);
            assert!(!scene_due(&p.cfg, Some(&first), &f, at), "frame {i}");
        }
        let f = show(&p, picture(1, 7, false), t0 + Duration::from_secs(60));
        assert!(scene_due(
            &p.cfg,
            Some(&first),
            &f,
            t0 + Duration::from_secs(60)
        ));
        let st = p.cfg.cameras.stats("/cam").unwrap();
        assert_eq!(st.scene_changes, 0, "noise is no change");
    }

    #[test]
    fn a_changed_scene_is_primed_once_it_held_for_the_settle_time() {
        let t0 = Instant::now();
        let p = prefiller(1.0, t0);
        let primed = show(&p, picture(1, 1, false), t0);
        // A new object enters at 1 s and stays.
        for i in 0..10u64 {
            let at = t0 + MS(1000 + 100 * i);
            let f = show(&p, picture(1, 20 + i, true), at);
            let due = scene_due(&p.cfg, Some(&primed), &f, at);
            assert_eq!(due, i >= 5, "{} ms after the change", 100 * i);
        }
        assert_eq!(p.cfg.cameras.stats("/cam").unwrap().scene_changes, 1);
        // Without scene_check every new frame is due, as before.
        let mut timer = prefiller(1.0, t0);
        timer.cfg.scene_check = false;
        let f = show(&timer, picture(1, 3, false), t0);
        assert!(scene_due(&timer.cfg, Some(&f), &f, t0));
    }

    #[test]
    fn a_moving_camera_is_not_primed_while_it_moves() {
        let t0 = Instant::now();
        let p = prefiller(1.0, t0);
        let primed = show(&p, picture(1, 1, false), t0);
        for i in 1..50u64 {
            let at = t0 + MS(100 * i);
            // Every frame another scene (10 Hz).
            let f = show(&p, picture(1 + i as u8, i, false), at);
            assert!(!scene_due(&p.cfg, Some(&primed), &f, at), "frame {i}");
            assert!(!primed.same_scene(&f, p.cfg.cameras.scene_threshold()));
        }
        assert_eq!(p.cfg.cameras.stats("/cam").unwrap().scene_changes, 49);
        // It stops: the last scene is primed once it held.
        let at = t0 + MS(5000);
        let f = show(&p, picture(60, 2, false), at);
        assert!(!scene_due(&p.cfg, Some(&primed), &f, at + MS(400)));
        assert!(scene_due(&p.cfg, Some(&primed), &f, at + MS(500)));
    }
}
